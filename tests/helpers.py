"""Builders the test modules share (fixtures are in conftest.py): a micro training set-up, a tiny
checkpoint and sentencepiece model, slices of Multi30k. No test module imports another."""

from __future__ import annotations

import importlib.util
import io
import json
import sys
from pathlib import Path

import torch

from xformer_cli.checkpoint import make_checkpoint, save_checkpoint
from xformer_cli.commands.preprocess import preprocess
from xformer_cli.commands.train import train
from xformer_cli.model import build_model
from xformer_cli.options import PreprocessOptions, TrainOptions

MAX_POSITIONS = 128  # of tiny_checkpoint's model: so that a long line must be truncated

# A model small enough that an update takes milliseconds.
# fp32 by name: --precision auto would pick bf16 on CPUs with bf16 instructions (test_precision.py)
MICRO = dict(arch="tiny", d_model=32, d_ff=64, heads=2, encoder_layers=1, decoder_layers=1,
             max_tokens=300, warmup_updates=4, log_interval=1, device="cpu", seed=3, threads=1, precision="fp32")


def slice_multi30k(src_dir: Path, out: Path, train_lines: int, valid_lines: int) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", train_lines), ("val", valid_lines)):
        for lang in ("en", "de"):
            lines = (src_dir / f"{split}.{lang}").read_text(encoding="utf-8").splitlines()[:n]
            (out / f"{split}.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out


def make_data(raw: Path, dest: Path, vocab: int) -> Path:
    preprocess(PreprocessOptions(destdir=str(dest), trainpref=str(raw / "train"), validpref=str(raw / "val"),
                                 bpe_vocab_size=vocab, workers=1))
    return dest


def opts(data_dir, save_dir, **kw) -> TrainOptions:
    return TrainOptions(data=str(data_dir), save_dir=str(save_dir), **{**MICRO, **kw})


def records(save_dir, kind):
    lines = (Path(save_dir) / "train_log.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["type"] == kind]


def cli_args(data_dir, save_dir, **kw) -> list[str]:
    args = [str(data_dir), "--save-dir", str(save_dir)]
    for k, v in {**MICRO, **kw}.items():
        args += [f"--{k.replace('_', '-')}", str(v)]
    return args


def learn_spm(lines, vocab_size=200) -> bytes:
    import sentencepiece as spm

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=model, vocab_size=vocab_size, model_type="bpe",
        character_coverage=1.0, pad_id=0, unk_id=1, bos_id=2, eos_id=3, minloglevel=2,
    )
    return model.getvalue()


def random_checkpoint(path, spm_model: bytes, **overrides) -> str:
    """A random tiny model (vocabulary 200, d_model 32) whose LayerNorms, biases and output bias are
    away from their initialisation (ones and zeros), so that an export has to map them right."""
    torch.manual_seed(0)
    model = build_model("tiny", vocab_size=200, d_model=32, d_ff=64, heads=4, max_positions=128, **overrides)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
        if model.output_bias is not None:
            model.output_bias.copy_(torch.randn_like(model.output_bias))
    save_checkpoint(path, make_checkpoint(model, spm_model))
    return str(path)


def tiny_checkpoint(path, spm_model: bytes, seed: int):
    torch.manual_seed(seed)
    model = build_model("tiny", vocab_size=200, d_model=32, d_ff=64, heads=4, max_positions=MAX_POSITIONS)
    save_checkpoint(path, make_checkpoint(model, spm_model, meta={"epoch": 1, "num_updates": 1, "end_of_epoch": True}))
    return str(path)


def train_tiny(multi30k_dir: Path, tmp: Path) -> Path:
    """A 2-layer model trained for 300 updates on 3,000 Multi30k pairs (a minute on one core):
    tmp/data (vocabulary 1,000) and tmp/ckpt/checkpoint_last.pt."""
    raw = slice_multi30k(multi30k_dir, tmp / "raw", 3000, 50)
    make_data(raw, tmp / "data", 1000)
    train(TrainOptions(data=str(tmp / "data"), save_dir=str(tmp / "ckpt"), arch="tiny", max_tokens=2000,
                       warmup_updates=50, max_update=300, device="cpu", threads=1, seed=1, dropout=0.0,
                       save_interval_minutes=0,
                       lr_scheduler="inverse_sqrt", lr=3e-3))  # noam's peak (0.018 at d_model 64) stalls it in a target LM
    return tmp / "ckpt" / "checkpoint_last.pt"


def bench_module(name: str):
    """bench/NAME.py as a module (bench/ on sys.path: the benchmarks import each other)."""
    bench = Path(__file__).resolve().parents[1] / "bench"
    sys.path.insert(0, str(bench))
    spec = importlib.util.spec_from_file_location(name, bench / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
