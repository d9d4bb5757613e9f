"""xf export ctranslate2 and xf translate --engine ctranslate2: every supported variant exports
with CTranslate2's per-token log-probabilities equal to xf's, a small trained model translates
the same with both engines, and bad input gives one-line errors."""

import json
import os
import sys

import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

from xformer_cli.checkpoint import make_checkpoint, save_checkpoint
from xformer_cli.cli import app
from xformer_cli.errors import XfError
from xformer_cli.commands.export import export_ctranslate2
from xformer_cli.model import build_model
from xformer_cli.vocab import BOS_ID, EOS_ID
from xformer_cli.options import ExportOptions, TranslateOptions
from xformer_cli.batching import collate_source
from xformer_cli.checkpoint import load_ensemble
from xformer_cli.commands.translate import translate

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py: torch on one thread for the module



ct2 = pytest.importorskip("ctranslate2", reason="the ctranslate2 extra is not installed")
runner = CliRunner()


@pytest.fixture(scope="module")
def pairs(multi30k_dir):
    src = (multi30k_dir / "test2016.en").read_text(encoding="utf-8").splitlines()
    tgt = (multi30k_dir / "test2016.de").read_text(encoding="utf-8").splitlines()
    return src[:50], tgt[:50]


def random_checkpoint(path, spm_model: bytes, **overrides):
    torch.manual_seed(0)
    model = build_model("tiny", vocab_size=200, d_model=32, d_ff=64, heads=4, max_positions=128, **overrides)
    with torch.no_grad():  # LayerNorms away from their (1, 0) initialisation, so that they are tested
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    save_checkpoint(path, make_checkpoint(model, spm_model))
    return str(path)


def export(ckpt, out, **kw):
    return export_ctranslate2(ExportOptions(format="ctranslate2", path=str(ckpt), output=str(out), **kw))


def xf_log_probs(ckpt, src_ids, tgt_ids):
    """xf's teacher-forced log p of each target token, eos included."""
    (model,), _ = load_ensemble([ckpt], torch.device("cpu"))
    src = collate_source([src_ids])
    with torch.no_grad():
        lprobs = F.log_softmax(model(src, torch.tensor([[BOS_ID] + tgt_ids])).float(), dim=-1)[0]
    return lprobs.gather(1, torch.tensor(tgt_ids + [EOS_ID])[:, None]).view(-1)


def assert_same_log_probs(ckpt, model_dir, pairs, count=5):
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(model_dir / "spm.model"))
    translator = ct2.Translator(str(model_dir), device="cpu", compute_type="float32", intra_threads=1)
    for src, tgt in zip(pairs[0][:count], pairs[1][:count]):
        src_ids, tgt_ids = sp.encode(src), sp.encode(tgt)
        theirs = translator.score_batch([sp.encode(src, out_type=str)], [sp.encode(tgt, out_type=str)])[0]
        mine = xf_log_probs(ckpt, src_ids, tgt_ids)
        assert len(theirs.log_probs) == len(tgt_ids) + 1  # eos scored too
        assert torch.allclose(torch.tensor(theirs.log_probs), mine, atol=1e-5), (mine, theirs.log_probs)


@pytest.mark.parametrize(
    "variant",
    [
        dict(),  # the paper's: post-LN, ReLU, sinusoidal, three-way tying
        dict(normalize_before=True, activation="gelu", positions="learned", share_embeddings="decoder"),
        dict(normalize_before=True, activation="swiglu", share_embeddings="none"),
        dict(activation="swiglu", positions="learned", encoder_layers=1, decoder_layers=3),
        dict(head_dim=4),  # Table 3 row B: h * d_k = 16 < d_model = 32
        dict(head_dim=16),  # h * d_k = 64 > d_model
    ],
    ids=["paper", "preln-gelu-learned-decoder-tied", "preln-swiglu-untied", "postln-swiglu-learned-1x3",
         "head-dim-4", "head-dim-16"],
)
@pytest.mark.slow
def test_every_supported_variant_exports_with_equal_log_probs(tmp_path, spm_model, pairs, variant):
    ckpt = random_checkpoint(tmp_path / "m.pt", spm_model, **variant)
    out = export(ckpt, tmp_path / "ct2")
    assert {"model.bin", "config.json", "spm.model", "xf.json"} <= {p.name for p in out.iterdir()}
    assert json.loads((out / "xf.json").read_text())["max_positions"] == 128
    assert_same_log_probs(ckpt, out, pairs)


def test_quantized_exports_hold_smaller_weights_that_score_close_to_fp32(tmp_path, spm_model, pairs):
    """int8 and bfloat16 exports store their weights in that type (model.bin shrinks) and score
    the same pairs close to the float32 export (quantization error only)."""
    import sentencepiece as spm

    ckpt = random_checkpoint(tmp_path / "m.pt", spm_model)
    sp = spm.SentencePieceProcessor(model_file=str(export(ckpt, tmp_path / "float32") / "spm.model"))
    src = [sp.encode(s, out_type=str) for s in pairs[0][:5]]
    tgt = [sp.encode(t, out_type=str) for t in pairs[1][:5]]

    def scores(directory, compute_type):
        translator = ct2.Translator(str(directory), device="cpu", compute_type=compute_type, intra_threads=1)
        return torch.tensor([x for r in translator.score_batch(src, tgt) for x in r.log_probs])

    full = scores(tmp_path / "float32", "float32")
    size = (tmp_path / "float32" / "model.bin").stat().st_size
    # int8 on a 32-wide random model: per-token errors up to ~1 nat, ~5% of |log p| on average
    for quantization, compute_type, ratio, tolerance in (("int8", "int8", 0.5, 0.1), ("bfloat16", "float32", 0.65, 0.01)):
        out = export(ckpt, tmp_path / quantization, quantization=quantization)
        assert (out / "model.bin").stat().st_size < ratio * size, quantization
        diff = (scores(out, compute_type) - full).abs()
        assert 0 < diff.mean() < tolerance * full.abs().mean(), (quantization, diff.mean(), full.abs().mean())


# -- a small trained model: the same translations from both engines ----------------------------
@pytest.fixture(scope="module")
def trained(multi30k_dir, tmp_path_factory):
    """A 2-layer model trained for 300 updates on 3,000 Multi30k pairs (a minute on one core)."""
    tmp = tmp_path_factory.mktemp("trained")
    raw = tmp / "raw"
    raw.mkdir()
    for split, name, count in (("train", "train", 3000), ("val", "val", 50)):
        for lang in ("en", "de"):
            lines = (multi30k_dir / f"{name}.{lang}").read_text(encoding="utf-8").splitlines()[:count]
            (raw / f"{split}.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")

    def xf(*args):
        result = runner.invoke(app, [str(a) for a in args])
        assert result.exit_code == 0, result.output

    xf("preprocess", "--destdir", tmp / "data", "--trainpref", raw / "train", "--validpref", raw / "val",
       "--bpe-vocab-size", 1000, "--workers", 1)
    xf("train", tmp / "data", "--save-dir", tmp / "ckpt", "--arch", "tiny", "--max-tokens", 2000,
       "--warmup-updates", 50, "--max-update", 300, "--device", "cpu", "--threads", 1, "--seed", 1,
       "--dropout", 0.0, "--save-interval-minutes", 0,
       "--lr-scheduler", "inverse_sqrt", "--lr", 3e-3)  # noam's peak (0.018 at d_model 64) stalls it in a target LM
    ckpt = tmp / "ckpt" / "checkpoint_last.pt"
    export(ckpt, tmp / "ct2")
    return str(ckpt), tmp / "ct2"


def translate_file(tmp_path, path, lines, name, **options):
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / f"{name}.txt"
    translate(TranslateOptions(path=(str(path),), input=str(tmp_path / "in.txt"), output=str(out), quiet=True,
                               device="cpu", **options))
    return out.read_text(encoding="utf-8")


@pytest.mark.slow
def test_trained_model_same_translations_and_log_probs(tmp_path, trained, pairs):
    ckpt, model_dir = trained
    mine = translate_file(tmp_path, ckpt, pairs[0], "xf").splitlines()
    theirs = translate_file(tmp_path, model_dir, pairs[0], "ct2", engine="ctranslate2").splitlines()
    assert len(mine) == len(theirs) == 50
    assert sum(a == b for a, b in zip(mine, theirs)) >= 49
    assert len(set(mine)) > 10  # a model that translates, not one that repeats one line
    assert_same_log_probs(ckpt, model_dir, pairs, count=10)


@pytest.mark.slow
def test_ctranslate2_engine_formats(tmp_path, trained, pairs):
    ckpt, model_dir = trained
    lines = [pairs[0][0], "", pairs[0][1], "   "]
    mine = translate_file(tmp_path, ckpt, lines, "xf", output_format="jsonl", nbest=2)
    theirs = translate_file(tmp_path, model_dir, lines, "ct2", engine="ctranslate2", output_format="jsonl", nbest=2)
    for a, b in zip(map(json.loads, mine.splitlines()), map(json.loads, theirs.splitlines())):
        assert a["id"] == b["id"] and a["source"] == b["source"]
        assert [h["text"] for h in a["hypotheses"]] == [h["text"] for h in b["hypotheses"]]
        for ha, hb in zip(a["hypotheses"], b["hypotheses"]):
            assert hb["score"] == pytest.approx(ha["score"], abs=1e-4)
            assert hb["positional_scores"] == pytest.approx(ha["positional_scores"], abs=1e-4)
    nbest = translate_file(tmp_path, model_dir, lines, "nbest", engine="ctranslate2", nbest=3).splitlines()
    assert [line.split(" ||| ")[0] for line in nbest] == ["0"] * 3 + ["1"] * 3 + ["2"] * 3 + ["3"] * 3
    # A tight limit: CTranslate2 stops without eos; the engine appends eos and scores it with
    # score_batch, so each hypothesis's scores are xf's own for the same tokens.
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(model_dir / "spm.model"))
    short = translate_file(tmp_path, model_dir, lines[:1], "short", engine="ctranslate2", max_len_a=0.0,
                           max_len_b=2, output_format="jsonl", nbest=4)
    for h in json.loads(short)["hypotheses"]:
        ids = [sp.piece_to_id(p) for p in h["tokens"]]
        assert ids[-1] == EOS_ID and len(ids) <= 3
        assert h["positional_scores"] == pytest.approx(xf_log_probs(ckpt, sp.encode(lines[0]), ids[:-1]).tolist(), abs=1e-5)
        assert h["score"] == pytest.approx(sum(h["positional_scores"]) / ((5 + len(ids)) / 6) ** 0.6, abs=1e-5)


# -- errors --------------------------------------------------------------------------------------
def fails(args, message):
    result = runner.invoke(app, [str(a) for a in args])
    assert result.exit_code != 0
    err = result.stderr.strip()
    assert len(err.splitlines()) == 1 and message in err, err


@pytest.mark.parametrize("positions", ["rope", "alibi"])
def test_rope_and_alibi_are_refused(tmp_path, spm_model, positions):
    ckpt = random_checkpoint(tmp_path / "m.pt", spm_model, positions=positions)
    fails(["export", "ctranslate2", "--path", ckpt, "--output", tmp_path / "ct2"],
          f"{positions} positions cannot be exported to CTranslate2")
    assert not (tmp_path / "ct2").exists()


def test_missing_extra_is_one_line(tmp_path, spm_model, monkeypatch):
    ckpt = random_checkpoint(tmp_path / "m.pt", spm_model)
    monkeypatch.setitem(sys.modules, "ctranslate2", None)  # import ctranslate2 -> ImportError
    fails(["export", "ctranslate2", "--path", ckpt, "--output", tmp_path / "ct2"],
          "ctranslate2 is not installed: pip install 'xformer-cli[ctranslate2]'")
    fails(["translate", "--engine", "ctranslate2", "--path", tmp_path], "pip install 'xformer-cli[ctranslate2]'")


def test_unwritable_or_occupied_output_is_one_line(tmp_path, spm_model):
    ckpt = random_checkpoint(tmp_path / "m.pt", spm_model)
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        parent = locked if not os.access(locked, os.W_OK) else "/proc"  # root may write anywhere but /proc
        fails(["export", "ctranslate2", "--path", ckpt, "--output", f"{parent}/ct2"], "ct2")
    finally:
        locked.chmod(0o755)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    fails(["export", "ctranslate2", "--path", ckpt, "--output", tmp_path / "full"], "--overwrite replaces it")
    assert (tmp_path / "full" / "keep.txt").read_text() == "mine"
    fails(["export", "ctranslate2", "--path", tmp_path / "nope.pt", "--output", tmp_path / "x"], "nope.pt")
    fails(["translate", "--engine", "ctranslate2", "--path", tmp_path], "not a model directory written by xf export")
    with pytest.raises(XfError, match="--overwrite"):
        export(ckpt, tmp_path / "full")
