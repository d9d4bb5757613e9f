"""Training throughput of xf train against a plain PyTorch reference of the same shape, measured
in the same run, with MFU against matrix-multiply peaks measured in the same run.

Default (``make bench``): the small preset (3+3 layers, d_model 256) on Multi30k EN-DE (joint
BPE 8000) with --max-tokens 4096 on the CPU, fp32, and bf16 where the CPU has native bf16 matrix
instructions (elsewhere a row says why it was not run). On a GPU, and from ``bench/gpu.sh``:
``base``/``big`` at --max-tokens 25000 on a WMT-like corpus (below).

The reference is ``torch.nn.Transformer`` (batch_first, the same width, depth, heads, FFN,
dropout and post-/pre-LN), with scaled tied embeddings plus sinusoidal positions, trained on the
same batches in the same order (xf's ``batch_by_size`` and epoch shuffle), with fused AdamW, the
same learning-rate schedule, gradients normalized by the update's target tokens, and the same
label-smoothed loss written the plain way (``F.cross_entropy(..., label_smoothing=0.1)`` on full
logits). xf and the reference alternate, each in its own process (peak memory is its own), for
XF_BENCH_TRAIN_ROUNDS rounds; the best round of each is reported, and the ratio of the two.
Speeds exclude each process's first update (start-up, allocation, compilation) and validation.

MFU divides the model FLOPs of the tokens trained (forward + backward, counted by torch's
FlopCounterMode on real batches of xf's model; the reference has the same shape) by a matmul
peak measured in this run through F.linear, in the run's dtype, device and threads.

Environment (all optional):
  XF_BENCH_TRAIN_ARCH (small), XF_BENCH_TRAIN_MAX_TOKENS (4096),
  XF_BENCH_TRAIN_DATA: multi30k | wmt-like (multi30k; wmt-like: synthetic ids, vocabulary 37000,
    lengths log-normal with a mean of 27 subwords as WMT14 EN-DE with a 37k joint BPE),
  XF_BENCH_TRAIN_PAIRS (wmt-like corpus size, 100000), XF_BENCH_TRAIN_DEVICES (cpu, plus cuda
  when present), XF_BENCH_TRAIN_PRECISIONS (fp32 and bf16 on CPU; bf16 on CUDA),
  XF_BENCH_TRAIN_COMPILE (0; "0,1" adds compiled runs: xf train --compile and torch.compile of
  the reference), XF_BENCH_TRAIN_REFERENCE (1), XF_BENCH_TRAIN_ROUNDS (2),
  XF_BENCH_TRAIN_UPDATES (40), XF_BENCH_TRAIN_SECONDS (600, per process; then SIGTERM),
  XF_BENCH_DRY_RUN=1: tiny model, tiny wmt-like corpus, 4 updates, CPU (proves the bench runs).
``python bench/bench_train.py OUT.json`` writes the rows to OUT.json after every measurement.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
MULTI30K = Path(os.environ.get("MULTI30K_DIR", REPO / ".." / "shared" / "data" / "multi30k")).resolve()
DRY = os.environ.get("XF_BENCH_DRY_RUN") == "1"
ENV = os.environ.get
ARCH = ENV("XF_BENCH_TRAIN_ARCH", "tiny" if DRY else "small")
MAX_TOKENS = int(ENV("XF_BENCH_TRAIN_MAX_TOKENS", "600" if DRY else "4096"))
DATA = ENV("XF_BENCH_TRAIN_DATA", "wmt-like" if DRY else "multi30k")
PAIRS = int(ENV("XF_BENCH_TRAIN_PAIRS", "3000" if DRY else "100000"))
VOCAB = 1000 if DRY else 37000  # wmt-like: the paper's EN-DE joint BPE vocabulary
UPDATES = int(ENV("XF_BENCH_TRAIN_UPDATES", "4" if DRY else "40"))
SECONDS = float(ENV("XF_BENCH_TRAIN_SECONDS", "600"))
ROUNDS = int(ENV("XF_BENCH_TRAIN_ROUNDS", "1" if DRY else "2"))
REFERENCE = ENV("XF_BENCH_TRAIN_REFERENCE", "1") == "1"
COMPILE = [c == "1" for c in ENV("XF_BENCH_TRAIN_COMPILE", "0").split(",")]
LABEL_SMOOTHING, SEED = 0.1, 1


# -- data ------------------------------------------------------------------------------------------
def multi30k_data(root: Path) -> Path:
    from xformer_cli.options import PreprocessOptions
    from xformer_cli.commands.preprocess import preprocess

    dest = root / "m30k-ende"
    preprocess(PreprocessOptions(destdir=str(dest), source_lang="en", target_lang="de",
                                 trainpref=str(MULTI30K / "train"), validpref=str(MULTI30K / "val"),
                                 bpe_vocab_size=8000))
    return dest


def wmt_like_lengths(pairs: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Source and target subword counts: log-normal, mean 27 (WMT14 EN-DE with a 37k joint BPE
    averages 26-28 per side), target/source ratio log-normal around 1, clipped to 1..250 and to
    xf preprocess's default ratio filter of 1.5."""
    sigma = 0.55
    src = np.clip(np.rint(rng.lognormal(math.log(27) - sigma**2 / 2, sigma, pairs)), 1, 250)
    tgt = np.clip(np.rint(src * rng.lognormal(0.0, 0.12, pairs)), 1, 250)
    tgt = np.clip(tgt, np.ceil(src / 1.5), np.floor(src * 1.5))
    return src.astype(np.int32), np.maximum(tgt, 1).astype(np.int32)


def wmt_like_data(root: Path, pairs: int = PAIRS, vocab: int = VOCAB) -> Path:
    """A data directory in xf's format with synthetic token ids (uniform over the vocabulary) and
    WMT-like lengths: speed depends on shapes, not on which ids they hold. Needs no text at all
    (a GPU machine may have only the repository); its spm.model is a small placeholder that only
    names the vocabulary in checkpoints."""
    import io

    import sentencepiece as spm

    from xformer_cli.data import FORMAT_VERSION, TokenArrayWriter, smallest_dtype
    from xformer_cli.vocab import BOS_ID, EOS_ID, PAD_ID, UNK_ID

    dest = root / f"wmt-like-{pairs}"
    dest.mkdir(parents=True)
    rng = np.random.default_rng(SEED)
    dtype = smallest_dtype(vocab)
    for split, n in (("train", pairs), ("valid", 200)):
        src_len, tgt_len = wmt_like_lengths(n, rng)
        for lang, sizes in (("en", src_len), ("de", tgt_len)):
            writer = TokenArrayWriter(dest / f"{split}.{lang}", dtype)
            for start in range(0, n, 1 << 18):
                part = sizes[start : start + (1 << 18)]
                writer.add_flat(rng.integers(4, vocab, int(part.sum())), part)
            writer.close()
    words = ["".join(rng.choice(list("abcdefgh"), 5)) for _ in range(400)]
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(" ".join(words[i:i + 9]) for i in range(390)),
                                   model_writer=model, vocab_size=60, model_type="bpe", pad_id=PAD_ID,
                                   unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID, minloglevel=2)
    (dest / "spm.model").write_bytes(model.getvalue())
    meta = dict(format_version=FORMAT_VERSION, source_lang="en", target_lang="de", vocab_size=vocab,
                dtype=dtype.name, splits=["train", "valid"], synthetic="bench/bench_train.py wmt_like_data")
    (dest / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    return dest


# -- measuring -------------------------------------------------------------------------------------
def matmul_peak(dtype: torch.dtype, device: torch.device) -> float:
    """FLOP/s of the best of a few n x n x n products through F.linear, the op the model's layers
    use (on CPUs without bf16 instructions a bare bf16 ``a @ b`` takes a far slower path than
    F.linear does, which would make the peak meaningless). GPUs need larger products to peak."""
    n, reps = (8192, 20) if device.type == "cuda" else (2048, 1)
    x = torch.randn(n, n, device=device).to(dtype)
    w = torch.randn(n, n, device=device).to(dtype)
    best = float("inf")
    for _ in range(5):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(reps):
            torch.nn.functional.linear(x, w)
        if device.type == "cuda":
            torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - start) / reps)
    return 2 * n**3 / best


def flops_per_target_token(data: Path, device: torch.device, batches: int = 2) -> float:
    """Forward+backward model FLOPs per target token, counted on real training batches."""
    from torch.utils.flop_counter import FlopCounterMode

    from xformer_cli.batching import batch_by_size, collate

    from xformer_cli.data import DataDir
    from xformer_cli.loss import label_smoothed_loss
    from xformer_cli.model import build_model

    dd = DataDir.open(data)
    ds = dd.split("train")
    all_batches = batch_by_size(ds.src_sizes, ds.tgt_sizes, MAX_TOKENS)
    model = build_model(ARCH, dd.vocab_size).to(device)
    flops = tokens = 0
    step = max(1, len(all_batches) // batches)
    for idx in all_batches[::step][:batches]:
        batch = collate([ds[i] for i in idx])
        with FlopCounterMode(display=False) as counter:
            logits = model(batch["src"].to(device), batch["prev_output"].to(device))
            loss, _ = label_smoothed_loss(logits, batch["target"].to(device), LABEL_SMOOTHING)
            loss.backward()
        flops += counter.get_total_flops()
        tokens += batch["ntokens"]
        model.zero_grad(set_to_none=True)
    return flops / tokens


def has_compile_option() -> bool:
    from xformer_cli.options import TrainOptions

    return "compile" in TrainOptions.__dataclass_fields__


def run_child(args: list[str], log: Path) -> int:
    """Run a child process for at most SECONDS, then SIGTERM it (xf train then finishes its update
    and writes its summary); returns its exit code."""
    with open(log, "w") as err:
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=err, cwd=REPO)
        try:
            return proc.wait(timeout=SECONDS)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGTERM)
            try:
                return proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                return proc.wait()


def run_xf(data: Path, save_dir: Path, device: str, precision: str, compiled: bool) -> dict:
    """xf train in a child process; its summary record from train_log.jsonl."""
    args = [sys.executable, "-m", "xformer_cli", "train", str(data), "--arch", ARCH, "--save-dir", str(save_dir),
            "--max-tokens", str(MAX_TOKENS), "--max-update", str(UPDATES), "--precision", precision,
            "--device", device, "--log-interval", "10", "--save-interval-minutes", "0", "--seed", str(SEED)]
    if compiled:
        args.append("--compile")
    elif has_compile_option():
        args.append("--no-compile")
    code = run_child(args, save_dir.parent / f"{save_dir.name}.log")
    log = save_dir / "train_log.jsonl"
    summaries = [json.loads(line) for line in log.read_text().splitlines()
                 if '"type": "summary"' in line] if log.exists() else []
    if not summaries:
        tail = (save_dir.parent / f"{save_dir.name}.log").read_text()[-1500:]
        raise RuntimeError(f"xf train {precision} on {device} wrote no summary (exit {code}):\n{tail}")
    return summaries[-1]


def run_reference(data: Path, out: Path, device: str, precision: str, compiled: bool) -> dict:
    args = [sys.executable, __file__, "--reference", json.dumps(dict(
        data=str(data), out=str(out), device=device, precision=precision, compiled=compiled))]
    code = run_child(args, out.with_suffix(".log"))
    if not out.exists():
        raise RuntimeError(f"reference {precision} on {device} failed (exit {code}):\n"
                           + out.with_suffix(".log").read_text()[-1500:])
    return json.loads(out.read_text())


# -- the reference: plain PyTorch ------------------------------------------------------------------
def reference_train(data: str, out: str, device: str, precision: str, compiled: bool) -> None:
    """Train torch.nn.Transformer on xf's batches for UPDATES updates; write its speed to ``out``."""
    import torch.nn.functional as F
    from torch import nn

    from xformer_cli.batching import batch_by_size, collate, epoch_order

    from xformer_cli.data import DataDir
    from xformer_cli.model import model_config, sinusoidal_positions
    from xformer_cli.vocab import PAD_ID
    from xformer_cli.schedule import make_schedule
    from xformer_cli.train_log import peak_memory_mib

    dev = torch.device(device)
    dd = DataDir.open(data)
    ds = dd.split("train")
    cfg = model_config(ARCH, vocab_size=dd.vocab_size)

    class Reference(nn.Module):
        def __init__(self):
            super().__init__()
            d = cfg.d_model
            self.embed = nn.Embedding(cfg.vocab_size, d, padding_idx=PAD_ID)
            nn.init.normal_(self.embed.weight, std=d**-0.5)
            self.register_buffer("pos", sinusoidal_positions(cfg.max_positions, d), persistent=False)
            self.drop = nn.Dropout(cfg.dropout)
            # nn.Transformer always closes both stacks with a LayerNorm (xf: only with pre-LN).
            self.transformer = nn.Transformer(d, cfg.heads, cfg.encoder_layers, cfg.decoder_layers, cfg.d_ff,
                                              cfg.dropout, batch_first=True, norm_first=cfg.normalize_before)

        def forward(self, src, prev):
            scale = cfg.d_model**0.5
            x = self.drop(self.embed(src) * scale + self.pos[: src.size(1)])
            y = self.drop(self.embed(prev) * scale + self.pos[: prev.size(1)])
            causal = nn.Transformer.generate_square_subsequent_mask(prev.size(1), device=prev.device)
            pad = src.eq(PAD_ID)
            h = self.transformer(x, y, tgt_mask=causal, src_key_padding_mask=pad, memory_key_padding_mask=pad,
                                 tgt_is_causal=True)
            return F.linear(h, self.embed.weight)  # tied output projection

    torch.manual_seed(SEED)
    model = Reference().to(dev)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.0, betas=(0.9, 0.98), eps=1e-9, weight_decay=0.0,
                                  fused=True)
    step_model = torch.compile(model) if compiled else model
    autocast = (torch.autocast(dev.type, dtype=torch.bfloat16 if precision == "bf16" else torch.float16)
                if precision != "fp32" else torch.autocast(dev.type, enabled=False))
    batches = batch_by_size(ds.src_sizes, ds.tgt_sizes, MAX_TOKENS)
    order = epoch_order(len(batches), SEED, 1)

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    timed = dict(seconds=0.0, updates=0, src=0, tgt=0)
    first_update = 0.0
    stop = []  # SIGTERM (the bench's time limit): finish the update, report what was done
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    model.train()
    for step in range(UPDATES):
        if stop:
            break
        t0 = time.perf_counter()
        batch = collate([ds[i] for i in batches[order[step % len(order)]]])
        for group in optimizer.param_groups:
            group["lr"] = make_schedule("noam", cfg.d_model, 4000, None, 0.0)(step + 1)
        with autocast:
            logits = step_model(batch["src"].to(dev, non_blocking=True), batch["prev_output"].to(dev, non_blocking=True))
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), batch["target"].to(dev).view(-1),
                                   ignore_index=PAD_ID, label_smoothing=LABEL_SMOOTHING, reduction="sum")
        (loss / batch["ntokens"]).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        sync()
        seconds = time.perf_counter() - t0
        if step == 0:
            first_update = seconds
            continue
        timed["seconds"] += seconds
        timed["updates"] += 1
        timed["src"] += batch["src_tokens"]
        timed["tgt"] += batch["ntokens"]
    s = timed["seconds"]
    Path(out).write_text(json.dumps(dict(
        num_updates=timed["updates"] + bool(first_update), tgt_tok_s=timed["tgt"] / s if s else None, src_tok_s=timed["src"] / s if s else None,
        ups=timed["updates"] / s if s else None, peak_memory_mib=round(peak_memory_mib(dev), 1),
        first_update_seconds=round(first_update, 2))))


# -- the benchmark ---------------------------------------------------------------------------------
def cpu_flags() -> str:
    try:
        flags = set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return "unknown"
    return " ".join(sorted(flags & {"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"})) or "none of avx2/avx512"


def measure(emit) -> None:
    """Calls ``emit(row)`` for every row as soon as it is measured."""
    from xformer_cli.precision import cpu_bf16_instructions

    devices = ENV("XF_BENCH_TRAIN_DEVICES", "cpu" if DRY else ",".join(["cpu"] + ["cuda"] * torch.cuda.is_available()))
    with tempfile.TemporaryDirectory(prefix="xf-bench-train-") as tmp:
        tmp = Path(tmp)
        data = wmt_like_data(tmp) if DATA == "wmt-like" else multi30k_data(tmp)
        data_name = f"wmt-like {PAIRS:,} pairs" if DATA == "wmt-like" else "m30k en-de"
        for device in devices.split(","):
            dev = torch.device(device)
            default = "bf16" if device == "cuda" else "fp32,bf16"
            per_token = flops_per_target_token(data, dev)
            for precision in ENV("XF_BENCH_TRAIN_PRECISIONS", default).split(","):
                case = f"{ARCH} {data_name} max_tokens {MAX_TOKENS:,} {device} {precision}"
                if device == "cpu" and precision == "bf16" and not cpu_bf16_instructions() and not DRY:
                    emit(dict(bench="train", case=case, metric="target tokens/s", value="not run", unit="",
                              note=f"this CPU has no native bf16 matrix instructions ({cpu_flags()})"))
                    continue
                dtype = torch.float32 if precision == "fp32" else torch.bfloat16 if precision == "bf16" else torch.float16
                peak = matmul_peak(dtype, dev)
                for compiled in COMPILE:
                    name = f"{case}{' compiled' if compiled else ''}"
                    xf_runs, ref_runs = [], []
                    for r in range(ROUNDS):  # alternate xf and the reference: the machine's load hits both
                        tag = f"{device}-{precision}-{int(compiled)}-{r}"
                        if compiled and not has_compile_option():
                            xf_runs.append(None)
                        else:
                            xf_runs.append(run_xf(data, tmp / f"xf-{tag}", device, precision, compiled))
                        if REFERENCE:
                            try:
                                ref_runs.append(run_reference(data, tmp / f"ref-{tag}.json", device, precision, compiled))
                            except RuntimeError as e:
                                emit(dict(bench="train", case=name, metric="reference tokens/s", value="failed",
                                          unit="", note=str(e).splitlines()[0]))
                    for row in rows_of(name, xf_runs, ref_runs, per_token, peak, precision):
                        emit(row)


def rows_of(case: str, xf_runs: list, ref_runs: list, per_token: float, peak: float, precision: str) -> list[dict]:
    """The rows of one configuration: the best round of xf and of the reference, and their ratios."""
    def best(runs):
        runs = [r for r in runs if r and r.get("tgt_tok_s")]
        return max(runs, key=lambda r: r["tgt_tok_s"]) if runs else None

    def rounds(runs):
        return " / ".join(f"{r['tgt_tok_s']:,.0f}" for r in runs if r and r.get("tgt_tok_s"))

    xf, ref = best(xf_runs), best(ref_runs)
    mfu_note = f"{per_token / 1e6:.1f} MFLOP/target token; {precision} matmul peak {peak / 1e12:.3g} TFLOP/s measured here"
    out = []
    if xf is None and xf_runs and xf_runs[0] is None:
        out.append(dict(bench="train", case=case, metric="target tokens/s", value="not run", unit="",
                        note="xf train has no --compile on this branch"))
    elif xf is not None:
        out += [
            dict(bench="train", case=case, metric="target tokens/s", value=xf["tgt_tok_s"], unit="tok/s",
                 ratio=xf["tgt_tok_s"] / ref["tgt_tok_s"] if ref else None,
                 note=f"xf; vs torch.nn.Transformer of this run; rounds {rounds(xf_runs)}"),
            dict(bench="train", case=case, metric="MFU", value=100 * xf["tgt_tok_s"] * per_token / peak, unit="%",
                 note=f"xf; {mfu_note}"),
            dict(bench="train", case=case, metric="peak memory", value=xf["peak_memory_mib"], unit="MiB",
                 ratio=xf["peak_memory_mib"] / ref["peak_memory_mib"] if ref else None,
                 note="xf; " + ("CUDA allocated" if "cuda" in case else "process RSS") + "; vs the reference"),
        ]
        if xf.get("compile_seconds") is not None:
            out.append(dict(bench="train", case=case, metric="compile time", value=xf["compile_seconds"], unit="s",
                            note="xf; apart from the speed above"))
    if ref is not None:
        out += [
            dict(bench="train", case=case, metric="reference tokens/s", value=ref["tgt_tok_s"], unit="tok/s",
                 note=f"torch.nn.Transformer, same batches; rounds {rounds(ref_runs)}"),
            dict(bench="train", case=case, metric="reference MFU", value=100 * ref["tgt_tok_s"] * per_token / peak,
                 unit="%", note=mfu_note),
            dict(bench="train", case=case, metric="reference first update", value=ref["first_update_seconds"],
                 unit="s", note="includes torch.compile" if "compiled" in case else "start-up of the step"),
        ]
    return out


def rows() -> list[dict]:
    out: list[dict] = []
    measure(out.append)
    return out


def main(argv: list[str]) -> None:
    if argv[:1] == ["--reference"]:
        reference_train(**json.loads(argv[1]))
        return
    path = Path(argv[0]) if argv else None
    out: list[dict] = []

    def emit(row):
        out.append(row)
        print(json.dumps(row), flush=True)
        if path:  # written after every row: a run cut short keeps what it measured
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps({"cpu_flags": cpu_flags(), "torch": torch.__version__, "rows": out}, indent=1))
            tmp.replace(path)

    measure(emit)


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    main(sys.argv[1:])
