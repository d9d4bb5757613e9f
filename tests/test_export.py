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

from xformer_cli.cli import app
from xformer_cli.base.errors import XfError
from xformer_cli.commands.export import export_ctranslate2
from xformer_cli.text.vocab import BOS_ID, EOS_ID
from xformer_cli.settings.options import ExportOptions, TranslateOptions
from xformer_cli.data.batching import collate_source
from xformer_cli.model.checkpoint import load_ensemble
from xformer_cli.commands.translate import translate

from helpers import random_checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py: torch on one thread for the module



ct2 = pytest.importorskip("ctranslate2", reason="the ctranslate2 extra is not installed")
runner = CliRunner()


@pytest.fixture(scope="module")
def pairs(multi30k_dir):
    src = (multi30k_dir / "test2016.en").read_text(encoding="utf-8").splitlines()
    tgt = (multi30k_dir / "test2016.de").read_text(encoding="utf-8").splitlines()
    return src[:50], tgt[:50]


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
        dict(sinusoids="tensor2tensor", decoder_start="zero"),  # Marian's conventions
    ],
    ids=["paper", "preln-gelu-learned-decoder-tied", "preln-swiglu-untied", "postln-swiglu-learned-1x3",
         "head-dim-4", "head-dim-16", "marian-conventions"],
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
def trained(trained_tiny, tmp_path_factory):
    """conftest's trained model and its CTranslate2 export."""
    out = tmp_path_factory.mktemp("ct2") / "ct2"
    export(trained_tiny, out)
    return str(trained_tiny), out


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
    # --workers 2: CTranslate2's inter_threads, batches of 8 decoded two at a time, the same lines
    parallel = translate_file(tmp_path, model_dir, pairs[0], "ct2w", engine="ctranslate2", workers=2, batch_size=8)
    assert parallel.splitlines() == theirs


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


@pytest.mark.slow
def test_prefix_continuations_and_alternatives_equal_ctranslate2s(tmp_path, trained, pairs):
    """Target prefixes (the reference's first words, so the forced tokens differ from the model's
    own choice) and alternatives after them: xf's continuations are CTranslate2's (target_prefix,
    return_alternatives), greedy and beam 4, mixed prefix lengths (none included) in one batch."""
    ckpt, model_dir = trained
    count = 20
    steered = [json.dumps({"source": src, "prefix": " ".join(tgt.split()[: i % 4])})
               for i, (src, tgt) in enumerate(zip(pairs[0][:count], pairs[1][:count]))]
    for beam in (1, 4):
        # CTranslate2 completes each alternative with its best hypothesis alone, ranked with the
        # length_penalty the engine gives it (0): xf's lenpen 0 ranks as it does
        for extra in ({}, {"alternatives": 3, "lenpen": 0.0}):
            options = dict(input_format="jsonl", beam_size=beam, **extra)
            # texts, not scores: text output carries CTranslate2's own sums, a few 1e-2 from xf's
            text = (lambda line: line.rsplit(" ||| ", 1)[0]) if extra else (lambda line: line)
            mine = list(map(text, translate_file(tmp_path, ckpt, steered, "xf", **options).splitlines()))
            theirs = list(map(text, translate_file(tmp_path, model_dir, steered, "ct2", engine="ctranslate2",
                                                   **options).splitlines()))
            assert len(mine) == len(theirs) == count * (3 if extra else 1)
            # a tie in the last float bits may pick another word: at most one line in twenty
            assert sum(a == b for a, b in zip(mine, theirs)) >= len(mine) - 1, (beam, extra)
            for line, prefix in zip(mine[:: 3 if extra else 1], steered):
                assert line.split(" ||| ")[-1].startswith(json.loads(prefix)["prefix"].split(" ")[0])


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
    fails(["export", "ctranslate2", "--path", ckpt, "--output", tmp_path / "full"], "pass --overwrite to replace it")
    assert (tmp_path / "full" / "keep.txt").read_text() == "mine"
    fails(["export", "ctranslate2", "--path", tmp_path / "nope.pt", "--output", tmp_path / "x"], "nope.pt")
    fails(["translate", "--engine", "ctranslate2", "--path", tmp_path], "not a model directory written by xf export")


# -- export never destroys its input -----------------------------------------------------------
def test_export_over_its_input_or_a_running_training_is_refused_and_destroys_nothing(tmp_path, spm_model):
    from xformer_cli.base.safety import SaveDirLock

    (tmp_path / "in").mkdir()
    ckpt = random_checkpoint(tmp_path / "in" / "m.pt", spm_model)
    before = (tmp_path / "in" / "m.pt").read_bytes()
    fails(["export", "ctranslate2", "--path", ckpt, "--output", ckpt, "--overwrite"], f"--output {ckpt} is the input")
    assert (tmp_path / "in" / "m.pt").read_bytes() == before
    save = tmp_path / "work" / "ck"
    save.mkdir(parents=True)
    random_checkpoint(save / "checkpoint_last.pt", spm_model)
    (save / "train_log.jsonl").write_text("{}\n")
    files = {p.name: p.read_bytes() for p in save.iterdir()}
    fails(["export", "ctranslate2", "--path", save / "checkpoint_last.pt", "--output", save, "--overwrite"],
          "holds the input")
    fails(["export", "ctranslate2", "--path", save / "checkpoint_last.pt", "--output", save.parent, "--overwrite"],
          "holds the input")
    with SaveDirLock(save):  # a training runs there: its directory, what holds it, what is inside it
        for output in (save, save.parent, save / "ct2"):
            fails(["export", "ctranslate2", "--path", ckpt, "--output", output, "--overwrite"],
                  "of a running xf train (pid")
    assert {p.name: p.read_bytes() for p in save.iterdir() if p.name != "train.lock"} == files
    assert not (save / "ct2").exists()


def test_overwrite_moves_the_old_model_aside_and_a_signal_loses_neither(tmp_path, spm_model, monkeypatch):
    import signal

    from xformer_cli.base import fileio

    ckpt = random_checkpoint(tmp_path / "m.pt", spm_model)
    out = export(ckpt, tmp_path / "ct2")
    old = {p.name: p.read_bytes() for p in out.iterdir()}
    real_replace = os.replace
    monkeypatch.setattr(fileio.os, "replace", lambda a, b: (_ for _ in ()).throw(OSError(28, "No space left on device")))
    with pytest.raises(XfError, match="cannot write .*ct2: no space left on device"):
        export(ckpt, out, overwrite=True, quantization="int8")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == old  # put back
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []

    def sigterm_then_replace(a, b):  # SIGTERM between the two renames: it waits until both are done
        os.kill(os.getpid(), signal.SIGTERM)
        real_replace(a, b)

    class Stopped(Exception):
        pass

    def raise_stopped(signum, frame):
        raise Stopped()

    monkeypatch.setattr(fileio.os, "replace", sigterm_then_replace)
    previous = signal.signal(signal.SIGTERM, raise_stopped)
    try:
        with pytest.raises(Stopped):
            export(ckpt, out, overwrite=True, quantization="int8")
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert json.loads((out / "xf.json").read_text())["quantization"] == "int8"  # the new model, whole
    ct2.Translator(str(out), device="cpu", intra_threads=1)


@pytest.mark.slow  # starts a process (to have a pid that no process has)
def test_a_later_export_removes_what_a_killed_one_left(tmp_path, spm_model):
    import subprocess

    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = [tmp_path / f".ct2.{dead.pid}.x1y2.tmp", tmp_path / f".ct2.{dead.pid}.old.tmp"]
    for p in stale:
        p.mkdir()
        (p / "model.bin").write_bytes(b"half")
    live = tmp_path / ".ct2.1.z3.tmp"  # pid 1 is alive: a running writer's, kept
    live.write_bytes(b"")
    other = tmp_path / f".other.{dead.pid}.q.tmp"  # another output's: not ours to judge
    other.write_bytes(b"")
    result = runner.invoke(app, ["export", "ctranslate2", "--path", random_checkpoint(tmp_path / "m.pt", spm_model),
                                 "--output", str(tmp_path / "ct2")])
    assert result.exit_code == 0, result.output
    assert "xf export ctranslate2" in result.stderr and "written" in result.stderr  # the summary
    assert not any(p.exists() for p in stale) and live.exists() and other.exists()


def test_output_a_file_and_path_a_directory_say_what_they_are(tmp_path, spm_model):
    ckpt = random_checkpoint(tmp_path / "m.pt", spm_model)
    (tmp_path / "afile").write_text("mine")
    fails(["export", "ctranslate2", "--path", ckpt, "--output", tmp_path / "afile"], "is a file, not a directory")
    fails(["export", "ctranslate2", "--path", tmp_path, "--output", tmp_path / "x"], "a directory, not a checkpoint file")
    export(ckpt, tmp_path / "ct2")
    fails(["translate", "--path", tmp_path / "ct2"], "a CTranslate2 model directory, not an xf checkpoint "
          "(translate it with --engine ctranslate2)")


# -- one precision policy for both engines ---------------------------------------------------------
@pytest.mark.parametrize("native", [False, True], ids=["avx2", "avx512_bf16"])
def test_ctranslate2_on_a_bf16_cpu_computes_in_what_it_has(tmp_path, spm_model, monkeypatch, native):
    """CTranslate2 has no bf16 on CPU (int8 and float32 only), bf16 instructions or not: auto is
    float32 for it where it is bf16 for the xf engine, and bf16/fp16 by name are one-line refusals
    naming the engine, as are --quantize int8 with --precision bf16 for both engines."""
    from xformer_cli.base import precision
    from xformer_cli.decode.plan import Machine, plan_decoding
    from xformer_cli.decode.translate import open_engine

    monkeypatch.setattr(precision, "cpu_bf16_instructions", lambda: ["avx512_bf16"] if native else [])
    out = export(random_checkpoint(tmp_path / "m.pt", spm_model), tmp_path / "ct2")
    options = dict(path=(str(out),), engine="ctranslate2", device="cpu", threads=1)
    engine, _, _ = open_engine(TranslateOptions(**options, precision="auto"))
    assert engine.translator.compute_type == "float32"
    assert plan_decoding(TranslateOptions(path=("m.pt",), device="cpu", precision="auto"),
                         Machine(cpu_bf16=native)).precision == ("bf16" if native else "fp32")  # the xf engine's
    engine, _, _ = open_engine(TranslateOptions(**options, quantize="int8"))
    assert engine.translator.compute_type.startswith("int8")
    for precision_name in ("bf16", "fp16"):
        with pytest.raises(XfError, match=f"--precision {precision_name}: the CTranslate2 engine on a CPU computes "
                                          f"in fp32 or int8 .*CTranslate2 has no {precision_name} on CPU"):
            open_engine(TranslateOptions(**options, precision=precision_name))
    for engine_name in ("ctranslate2", "xf"):
        fails(["translate", "--engine", engine_name, "--path", out if engine_name == "ctranslate2" else tmp_path / "m.pt",
               "--device", "cpu", "--quantize", "int8", "--precision", "bf16"],
              "--quantize int8 runs around its int8 layers in fp32, not --precision bf16")


def test_a_damaged_exported_model_names_the_file_and_the_cause(tmp_path, spm_model, multi30k_dir):
    """Regression: a truncated model.bin, another vocabulary's spm.model and a garbage
    config.json gave CTranslate2's or a JSON parser's raw messages without the file."""
    import shutil

    from helpers import learn_spm

    good = export(random_checkpoint(tmp_path / "m.pt", spm_model), tmp_path / "good")

    def damaged(name, change):
        out = tmp_path / name
        shutil.copytree(good, out)
        change(out)
        return out

    def translate_fails(out, message):
        result = runner.invoke(app, ["translate", "--engine", "ctranslate2", "--path", str(out), "--device", "cpu"],
                               input="A dog runs.\n")
        err = result.stderr.strip()
        assert result.exit_code == 1 and len(err.splitlines()) == 1 and message in err, result.output

    truncated = damaged("truncated", lambda d: (d / "model.bin").write_bytes((d / "model.bin").read_bytes()[:5000]))
    translate_fails(truncated, f"{truncated / 'model.bin'}: damaged CTranslate2 model (")
    french = learn_spm((multi30k_dir / "train.fr").read_text(encoding="utf-8").splitlines()[:300])
    other = damaged("other_vocab", lambda d: (d / "spm.model").write_bytes(french))
    translate_fails(other, f"{other / 'spm.model'}: not the sentencepiece model this directory was exported with")
    garbage = damaged("garbage", lambda d: (d / "config.json").write_text('{"add_source_bos": false,\n  oops}'))
    translate_fails(garbage, f"{garbage / 'config.json'}: line 2: not JSON")
    no_info = damaged("no_info", lambda d: (d / "xf.json").write_text("[]"))
    translate_fails(no_info, f"{no_info / 'xf.json'}: not a JSON object")
