"""xf translate: one output line per input line, in order, whatever the input holds; formats,
ensembles and errors. A tiny random model with a tiny sentencepiece model learned on Multi30k."""

import json
import os
import select
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from xformer_cli.model.checkpoint import load_checkpoint
from xformer_cli.cli import app
from xformer_cli.decode.plan import Machine, plan_decoding
from xformer_cli.base.errors import ConfigError, XfError
from xformer_cli.settings.options import TranslateOptions
from xformer_cli.decode.search import gnmt_length_penalty
from xformer_cli.model.checkpoint import load_ensemble
from xformer_cli.commands.translate import translate
from xformer_cli.decode.translate import Stats, translate_buffer
from xformer_cli.decode.engines import XfEngine
from helpers import learn_spm, tiny_checkpoint
from helpers import INT8_LOG_PROB_BOUND, teacher_forced_log_probs

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py: torch on one thread for the module

runner = CliRunner()


def run(tmp_path, ckpt, data: bytes, **overrides):
    (tmp_path / "in.txt").write_bytes(data)
    out = tmp_path / "out.txt"
    options = dict(path=(ckpt,), input=str(tmp_path / "in.txt"), output=str(out), max_len_a=0.5, max_len_b=3, quiet=True)
    translate(TranslateOptions(**{**options, **overrides}))
    return out.read_bytes().decode("utf-8")


def one_by_one(ckpt, lines, **overrides):
    """Each line translated alone, as the reference for order."""
    models, sp = load_ensemble([ckpt], torch.device("cpu"))
    options = TranslateOptions(path=(ckpt,), **{"max_len_a": 0.5, "max_len_b": 3, **overrides})
    engine = XfEngine(models, torch.device("cpu"))
    return ["".join(translate_buffer(engine, sp, [line], 0, options, Stats())) for line in lines]


@pytest.mark.slow
def test_output_is_aligned_with_input(tmp_path, ckpt, sentences, capsys):
    long_line = " ".join(sentences)  # far more than MAX_POSITIONS subwords
    lines = [
        sentences[0].encode(),
        b"",
        b"   \t ",
        long_line.encode(),
        sentences[1].encode() + b"\r",  # a CRLF line
        b"bad \xff\xfe bytes " + sentences[2].encode(),
        sentences[3].encode(),
        b"",
        sentences[4].encode(),
        sentences[5].encode(),
        sentences[6].encode(),
    ]
    data = b"\n".join(lines)  # and no newline at the end
    out = run(tmp_path, ckpt, data, buffer_size=3, batch_size=2).split("\n")
    assert out[-1] == "" and len(out) - 1 == len(lines)  # one line per input line, each ended
    out = out[:-1]
    assert out[1] == out[2] == out[7] == ""
    texts = [raw.rstrip(b"\r").decode("utf-8", errors="replace") for raw in lines]
    expected = [line.rstrip("\n") for line in one_by_one(ckpt, texts)]
    assert out == expected
    assert all(out[i] for i in (0, 3, 4, 5, 6, 8, 9, 10))
    err = capsys.readouterr().err
    assert "1 line(s) had invalid UTF-8" in err and "first: line 6" in err
    assert "1 line(s) longer than the model's 127 source subwords were truncated (first: line 4)" in err


@pytest.mark.slow
def test_same_output_whatever_the_batching(tmp_path, ckpt, sentences):
    data = ("\n".join(sentences) + "\n").encode()
    reference = run(tmp_path, ckpt, data)
    assert run(tmp_path, ckpt, data, buffer_size=2, batch_size=3) == reference
    assert run(tmp_path, ckpt, data, max_tokens=20) == reference
    assert reference.count("\n") == len(sentences)


@pytest.mark.slow
def test_workers_give_the_output_of_one_worker(tmp_path, ckpt, sentences):
    """--workers 3 (capped at the cores) decodes batches of 2 at once: the same bytes, scores, alignments and
    order as --workers 1 (each batch is searched alone either way)."""
    data = ("\n".join(sentences) + "\n\n").encode()
    extra = dict(batch_size=2, output_format="jsonl", nbest=2, beam_size=3, print_alignment=True)
    reference = run(tmp_path, ckpt, data, **extra)
    assert run(tmp_path, ckpt, data, workers=3, **extra) == reference
    assert reference.count("\n") == len(sentences) + 1
    with pytest.raises(ConfigError, match="--workers 2 decodes batches in parallel"):
        plan_decoding(TranslateOptions(path=(ckpt,), workers=2, sampling=True), Machine())


@pytest.mark.slow
def test_workers_auto_is_the_plans_rule_with_the_output_of_one(tmp_path, ckpt, sentences):
    """--workers 0: the decoding plan's rule (one process per core this process may use, one
    thread each), named in its rules; the output is --workers 1's."""
    import os

    data = ("\n".join(sentences) + "\n").encode()
    extra = dict(batch_size=2, quantize="int8", device="cpu")
    assert run(tmp_path, ckpt, data, workers=0, **extra) == run(tmp_path, ckpt, data, **extra)
    plan = plan_decoding(TranslateOptions(path=(ckpt,), device="cpu", workers=0), Machine.here())
    cores = len(os.sched_getaffinity(0))
    assert (plan.workers, plan.processes) == (cores, cores > 1)
    assert [r for r in plan.rules if r.startswith(f"--workers auto: {cores}")]


@pytest.mark.slow
def test_workers_are_processes_on_the_cpu_with_the_output_of_one(tmp_path, ckpt, sentences):
    """--workers 2 on the CPU: batches go to two spawned processes (threads would share the
    interpreter lock), which give, with int8, prefixes and a constraint (searched in this process),
    what --workers 1 gives; a worker that dies is a one-line error, not a hang."""
    import os
    import signal

    from xformer_cli.base.errors import XfError

    lines = [json.dumps({"source": s, **({"prefix": "Ein"} if i % 3 == 0 else {}),
                         **({"constraints": ["Mann"]} if i == 4 else {})}) for i, s in enumerate(sentences)]
    data = ("\n".join(lines) + "\n").encode()
    extra = dict(batch_size=2, input_format="jsonl", output_format="jsonl", quantize="int8", int8_engine="fbgemm")
    assert run(tmp_path, ckpt, data, workers=2, **extra) == run(tmp_path, ckpt, data, **extra)
    engine, _ = XfEngine.open([ckpt], plan_decoding(TranslateOptions(path=(ckpt,), device="cpu", workers=2),
                                                    Machine.here()))
    try:
        processes = list(engine.workers.pool._processes.values())
        assert len(processes) == 2 and all(p.is_alive() for p in processes)
        options = TranslateOptions(path=(ckpt,), max_len_a=0.5, max_len_b=3)
        for p in processes:  # Ctrl-C is the parent's to handle: the workers carry on
            os.kill(p.pid, signal.SIGINT)
        time.sleep(1)
        assert all(p.is_alive() for p in processes) and engine.search([[5, 6, 7]], options)
        os.kill(processes[0].pid, signal.SIGKILL)
        processes[0].join(10)
        with pytest.raises(XfError, match="a decoding process died unexpectedly"):
            engine.search([[5, 6, 7]], options)
    finally:
        engine.close()
    assert engine.workers is None and not any(p.is_alive() for p in processes)


def test_stdin_to_stdout(ckpt, sentences):
    data = ("\n".join(sentences[:3]) + "\n\n").encode()
    result = runner.invoke(app, ["translate", "--path", ckpt, "--max-len-b", "3", "--quiet"], input=data)
    assert result.exit_code == 0, result.output
    lines = result.stdout_bytes.decode().split("\n")
    assert len(lines) == 5 and all(lines[:3]) and lines[3:] == ["", ""]


def test_a_fifo_is_read_as_a_file_is(tmp_path, ckpt, sentences):
    """--input a FIFO (or <(...), a /dev/fd pipe) was "input file not found", its writer blocked."""
    import os
    import threading

    data = ("\n".join(sentences[:3]) + "\n").encode()
    fifo = tmp_path / "in.fifo"
    os.mkfifo(fifo)
    writer = threading.Thread(target=fifo.write_bytes, args=(data,), daemon=True)
    writer.start()
    out = tmp_path / "out.txt"
    translate(TranslateOptions(path=(ckpt,), input=str(fifo), output=str(out), max_len_a=0.5, max_len_b=3, quiet=True))
    writer.join(30)
    assert out.read_text(encoding="utf-8") == run(tmp_path, ckpt, data)
    with pytest.raises(XfError, match="is a directory, not an input file"):
        translate(TranslateOptions(path=(ckpt,), input=str(tmp_path), output=str(out), quiet=True))


def test_jsonl(tmp_path, ckpt, sentences):
    data = (sentences[0] + "\n\n" + sentences[1] + "\n").encode()
    out = run(tmp_path, ckpt, data, output_format="jsonl", nbest=2, beam_size=3).splitlines()
    assert len(out) == 3
    records = [json.loads(line) for line in out]
    assert [r["id"] for r in records] == [0, 1, 2]
    assert records[0]["source"] == sentences[0] and records[1]["source"] == ""
    for record in (records[0], records[2]):
        hyps = record["hypotheses"]
        assert len(hyps) == 2 and hyps[0]["score"] >= hyps[1]["score"]
        for h in hyps:
            assert h["tokens"][-1] == "</s>" and len(h["positional_scores"]) == len(h["tokens"])
            lp = gnmt_length_penalty(len(h["tokens"]), 0.6)
            assert h["score"] == pytest.approx(sum(h["positional_scores"]) / lp, abs=1e-4)
    assert records[1]["hypotheses"][0]["text"] == ""
    text = run(tmp_path, ckpt, data, beam_size=3).splitlines()
    assert text[0] == records[0]["hypotheses"][0]["text"]


def test_nbest_text_is_moses_format(tmp_path, ckpt, sentences):
    out = run(tmp_path, ckpt, (sentences[0] + "\n\n").encode(), nbest=3, beam_size=4).splitlines()
    assert len(out) == 6
    assert [line.split(" ||| ")[0] for line in out] == ["0", "0", "0", "1", "1", "1"]
    scores = [float(line.split(" ||| ")[2]) for line in out[:3]]
    assert scores == sorted(scores, reverse=True)


def test_sampling_is_reproducible(tmp_path, ckpt, sentences):
    data = ("\n".join(sentences) + "\n").encode()
    first = run(tmp_path, ckpt, data, sampling=True, seed=3, max_len_b=6)
    assert run(tmp_path, ckpt, data, sampling=True, seed=3, max_len_b=6) == first
    assert run(tmp_path, ckpt, data, sampling=True, seed=4, max_len_b=6) != first
    assert first.count("\n") == len(sentences)


@pytest.mark.slow
def test_ensemble(tmp_path, ckpt, spm_model, sentences):
    other = tiny_checkpoint(tmp_path / "other.pt", spm_model, seed=1)
    data = ("\n".join(sentences) + "\n").encode()
    out = run(tmp_path, ckpt, data, path=(ckpt, other))
    assert out.count("\n") == len(sentences)
    assert run(tmp_path, ckpt, data, path=(ckpt, ckpt)) == run(tmp_path, ckpt, data)


def test_errors_are_one_line(tmp_path, ckpt, multi30k_dir):
    def fails(args, message, code=1):
        result = runner.invoke(app, ["translate", *args], input=b"a man\n")
        assert result.exit_code == code, result.output
        assert message in result.output and "Traceback" not in result.output

    fails(["--path", str(tmp_path / "missing.pt")], "checkpoint not found")
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    fails(["--path", str(tmp_path / "junk.pt")], "not an xf checkpoint (not a zip archive")
    torch.save({"weights": torch.zeros(2)}, tmp_path / "other.pt")
    fails(["--path", str(tmp_path / "other.pt")], "not an xf checkpoint")
    lines = (multi30k_dir / "train.fr").read_text(encoding="utf-8").splitlines()[:300]
    french = tiny_checkpoint(tmp_path / "fr.pt", learn_spm(lines), seed=0)
    fails(["--path", ckpt, "--path", french], "an ensemble needs checkpoints trained on the same vocabulary")
    fails(["--path", ckpt, "--nbest", "5", "--beam", "4"], "--nbest 5 is larger than --beam-size 4", code=2)
    fails(["--path", ckpt, "--precision", "fp16", "--device", "cpu"], "is for CUDA", code=2)
    fails(["--path", ckpt, "--input", str(tmp_path / "nope.txt")], "nope.txt: input file not found")
    fails(["--path", ckpt, "--output", str(tmp_path / "no" / "out.txt")], "out.txt: its directory does not exist", code=2)


@pytest.mark.slow
def test_streams_line_by_line(ckpt, sentences, tmp_path):
    # A filter answers each buffer as soon as it is full, before the input ends.
    proc = subprocess.Popen(
        [sys.executable, "-m", "xformer_cli", "translate", "--path", ckpt, "--buffer-size", "1",
         "--max-len-b", "3", "--quiet", "--threads", "1"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        proc.stdin.write((sentences[0] + "\n").encode())
        proc.stdin.flush()
        deadline = time.monotonic() + 60
        ready = []
        while not ready and time.monotonic() < deadline and proc.poll() is None:
            ready, _, _ = select.select([proc.stdout], [], [], 1.0)
        assert ready, "no output before the end of the input"
        first = proc.stdout.readline()
        assert first.strip()
        proc.stdin.write(b"\n")
        proc.stdin.close()
        rest = proc.stdout.read()
        assert rest == b"\n"
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.slow
def test_end_to_end_through_the_cli(tmp_path, multi30k_dir):
    """preprocess, train a tiny model briefly, average, translate: the output matches the input."""
    raw = tmp_path / "raw"
    raw.mkdir()
    for split, first, count in (("train", 0, 300), ("val", 0, 40), ("test", 0, 12)):
        name = "test2016" if split == "test" else split
        for lang in ("en", "de"):
            lines = (multi30k_dir / f"{name}.{lang}").read_text(encoding="utf-8").splitlines()[first : first + count]
            (raw / f"{split}.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")

    def xf(*args):
        result = runner.invoke(app, [str(a) for a in args])
        assert result.exit_code == 0, result.output
        return result

    data, ckpts = tmp_path / "data-bin", tmp_path / "checkpoints"
    xf("preprocess", "--destdir", data, "--trainpref", raw / "train", "--validpref", raw / "val",
       "--bpe-vocab-size", 300, "--workers", 1)
    xf("train", data, "--save-dir", ckpts, "--arch", "tiny", "--d-model", 32, "--d-ff", 64, "--heads", 2,
       "--encoder-layers", 1, "--decoder-layers", 1, "--max-tokens", 400, "--warmup-updates", 4,
       "--max-update", 12, "--save-interval-updates", 3, "--device", "cpu", "--threads", 1, "--seed", 3)
    xf("average-checkpoints", "--inputs", ckpts, "--num-update-checkpoints", 3, "--output", tmp_path / "avg.pt")
    averaged = load_checkpoint(tmp_path / "avg.pt")
    updates = [int(name[: -len(".pt")].split("_")[2]) for name in averaged["meta"]["averaged_from"]]
    assert updates == [12, 9, 6] and averaged["train_state"] is None

    source = (raw / "test.en").read_text(encoding="utf-8").splitlines()
    source = source[:4] + ["", "  "] + source[4:] + [""]
    (raw / "input.en").write_text("\n".join(source) + "\n", encoding="utf-8")
    xf("translate", "--path", tmp_path / "avg.pt", "--input", raw / "input.en", "--output", tmp_path / "hyp.de",
       "--max-len-b", 8, "--batch-size", 5, "--buffer-size", 7, "--quiet")
    hyps = (tmp_path / "hyp.de").read_text(encoding="utf-8").split("\n")
    assert hyps[-1] == "" and len(hyps) - 1 == len(source)
    hyps = hyps[:-1]
    assert hyps[4] == hyps[5] == hyps[-1] == ""
    expected = [line.rstrip("\n") for line in one_by_one(str(tmp_path / "avg.pt"), source, max_len_a=1.0, max_len_b=8)]
    assert hyps == expected


def test_output_over_an_input_or_the_model_is_refused(tmp_path, ckpt, monkeypatch):
    source = tmp_path / "src.txt"
    source.write_bytes(b"a man\n")
    (tmp_path / "alias.txt").symlink_to(source)
    monkeypatch.chdir(tmp_path)
    for output in ("src.txt", "./alias.txt", str(source)):
        result = runner.invoke(app, ["translate", "--path", ckpt, "--input", "src.txt", "--output", output])
        assert result.exit_code == 2 and f"--output {output} is the input --input src.txt" in result.output, result.output
    model = Path(ckpt).read_bytes()
    result = runner.invoke(app, ["translate", "--path", ckpt, "--input", "src.txt", "--output", ckpt])
    assert result.exit_code == 2 and "is the input --path" in result.output
    assert source.read_bytes() == b"a man\n" and Path(ckpt).read_bytes() == model


@pytest.mark.parametrize("a,b,message", [
    (1.0, -5, "allow no output for some sentences"), (1.0, -1, "allow no output for some sentences"),
    (0.0, 0, "allow no output for some sentences"), (0.5, 0, "allow no output for some sentences"),
    (-0.1, 50, "--max-len-a must not be negative"), ("inf", 50, "--max-len-a must be a finite number"),
    (1.0, 2**63 - 10, "--max-len-b must be in"),  # a limit near 2^63 overflowed int64: empty translations
])
def test_a_length_limit_that_allows_no_output_is_an_option_error(ckpt, a, b, message):
    result = runner.invoke(app, ["translate", "--path", ckpt, "--max-len-a", str(a), "--max-len-b", str(b)],
                           input=b"a man\n")
    assert result.exit_code == 2 and message in result.output, result.output
    assert TranslateOptions(path=(ckpt,), max_len_a=0.0, max_len_b=1).max_len_b == 1  # one subword: allowed


def test_precision_auto_and_its_refusals(monkeypatch):
    from xformer_cli.base import precision as translate_module
    from xformer_cli.base.errors import ConfigError
    from xformer_cli.base.precision import precision_warning, resolve_precision

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    for native, expected in ((False, "fp32"), (True, "bf16")):
        monkeypatch.setattr(translate_module, "cpu_bf16_instructions", lambda: ["avx512_bf16"] if native else [])
        assert resolve_precision(cpu, "auto") == expected
        assert resolve_precision(cpu, "auto", "int8") == "fp32"  # int8 layers, fp32 around them
    assert resolve_precision(cpu, "bf16") == "bf16"  # this CPU (patched) has bf16 instructions
    assert precision_warning(cpu, "bf16") is None
    monkeypatch.setattr(translate_module, "cpu_bf16_instructions", lambda: [])
    # one policy with xf train: bf16 asked for by name runs, with a warning, on a CPU without bf16
    assert resolve_precision(cpu, "bf16") == "bf16"
    assert "no native bf16" in precision_warning(cpu, "bf16")
    assert precision_warning(cpu, "fp32") is None
    with pytest.raises(ConfigError, match="is for CUDA"):
        resolve_precision(cpu, "fp16")
    with pytest.raises(ConfigError, match="int8 is for CPUs"):
        resolve_precision(cuda, "fp32", "int8", {"fp32": "native", "fp16": "native"})  # the xf engine's on a GPU
    with pytest.raises(ConfigError, match="not --precision bf16"):
        resolve_precision(cpu, "bf16", "int8")


def int8_tracks_fp32(ckpt, sources, targets, int8_engine):
    """(int8 engine, the largest |log p| difference from fp32 over every position and entry)."""
    from xformer_cli.decode.translate import open_engine

    fp32, sp, _ = open_engine(TranslateOptions(path=(ckpt,), device="cpu"))
    int8, _, _ = open_engine(TranslateOptions(path=(ckpt,), quantize="int8", int8_engine=int8_engine, device="cpu"))
    (reference,), (model,) = fp32.models, int8.models
    engine = model.int8_engine  # the model's own: the process-wide engine is left as it was
    assert not [m for m in model.modules() if type(m) is torch.nn.Linear]  # every linear layer is int8
    differ = (teacher_forced_log_probs(model, sp, sources, targets)
              - teacher_forced_log_probs(reference, sp, sources, targets)).abs()
    assert differ.max() > 1e-4  # quantized: not fp32 under another name
    return engine, float(differ.max())


@pytest.mark.slow
@pytest.mark.kernels
def test_quantize_int8(tmp_path, ckpt, sentences, multi30k_dir):
    """--quantize int8 (fbgemm) tracks the fp32 model within INT8_LOG_PROB_BOUND, and translates
    with the default engine (the decoding plan's rule by the CPU's flags)."""
    targets = (multi30k_dir / "test2016.de").read_text(encoding="utf-8").splitlines()[: len(sentences)]
    engine, differ = int8_tracks_fp32(ckpt, sentences, targets, "fbgemm")
    assert engine == "fbgemm" and differ < INT8_LOG_PROB_BOUND
    data = ("\n".join(sentences) + "\n").encode()
    out = run(tmp_path, ckpt, data, quantize="int8", device="cpu")
    assert out.count("\n") == len(sentences) and all(out.splitlines())


@pytest.mark.slow
@pytest.mark.kernels
def test_int8_engine_onednn_packs_for_onednn_and_tracks_fp32(tmp_path, ckpt, sentences, multi30k_dir):
    """--int8-engine onednn: oneDNN's int8 kernels (AMX where the CPU has it) instead of fbgemm's,
    held to the same bound against fp32 (each library quantizes activations by its own rules, so
    the two are not compared with each other); the option's refusals."""
    targets = (multi30k_dir / "test2016.de").read_text(encoding="utf-8").splitlines()[: len(sentences)]
    engine, differ = int8_tracks_fp32(ckpt, sentences, targets, "onednn")
    assert engine == "onednn" and differ < INT8_LOG_PROB_BOUND
    data = ("\n".join(sentences) + "\n").encode()
    out = run(tmp_path, ckpt, data, quantize="int8", int8_engine="onednn", device="cpu", output_format="jsonl")
    assert [len(json.loads(line)["hypotheses"]) > 0 for line in out.splitlines()] == [True] * len(sentences)
    for bad, message in ((dict(int8_engine="onednn"), "add --quantize int8"),
                         (dict(int8_engine="onednn", quantize="int8", engine="ctranslate2"), "not of --engine ctranslate2")):
        with pytest.raises(ConfigError, match=message):
            plan_decoding(TranslateOptions(path=(ckpt,), **bad), Machine())


def test_output_over_a_training_checkpoint_is_refused(tmp_path, ckpt):
    save = tmp_path / "ck"
    save.mkdir()
    last = save / "checkpoint_last.pt"
    last.write_bytes(Path(ckpt).read_bytes())  # training state that is not the model translating
    result = runner.invoke(app, ["translate", "--path", ckpt, "--output", str(last)], input=b"a man\n")
    assert result.exit_code == 2 and "is the training checkpoint" in result.output, result.output
    assert last.read_bytes() == Path(ckpt).read_bytes()
    fresh = save / "checkpoint_2_10.pt"  # a name training would use, not yet written: allowed
    result = runner.invoke(app, ["translate", "--path", ckpt, "--output", str(fresh)], input=b"a man\n")
    assert result.exit_code == 0, result.output


def test_more_threads_than_cores_is_a_warning(ckpt, monkeypatch):
    """Regression: --threads 1000 on 2 cores ran 100x slower without a word."""
    from xformer_cli.base import distributed

    monkeypatch.setattr(distributed, "cpu_cores", lambda: 2)
    assert distributed.threads_warning(2) is None and distributed.threads_warning(0) is None
    assert "--threads 3 is more than the 2 CPU cores" in distributed.threads_warning(3)
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)  # the test's own threads stay as they are
    result = runner.invoke(app, ["translate", "--path", ckpt, "--threads", "1000", "--max-len-b", "2", "--quiet"],
                           input=b"a man\n")
    assert result.exit_code == 0 and "warning: --threads 1000 is more than the 2 CPU cores" in result.stderr


def test_empty_translations_are_counted_and_warned_about(tmp_path, spm_model, capsys):
    """Regression: a model that ends every sentence at once gave a summary saying 'empty 0'."""
    from helpers import random_checkpoint
    from xformer_cli.model.checkpoint import load_checkpoint, save_checkpoint
    from xformer_cli.text.vocab import EOS_ID

    path = random_checkpoint(tmp_path / "eos.pt", spm_model, output_bias=True)
    ckpt = load_checkpoint(path)
    ckpt["model"]["output_bias"][EOS_ID] = 1e4  # eos first, every time
    save_checkpoint(path, ckpt)
    out = run(tmp_path, path, b"a man\n\ntwo dogs\n", quiet=False)
    assert out == "\n\n\n"
    err = capsys.readouterr().err
    assert "xf: warning: 2 of 2 non-empty line(s) got an empty translation" in err
    # the start-up (the model loaded; --workers' processes started) on a row of its own: --workers 16
    # on 2 cores took 50 s for 3 lines while the summary said "time 0.08 s"
    assert "start-up (models, workers; not in the speeds)" in err


@pytest.mark.slow
def test_split_sentences_translates_each_sentence_and_keeps_the_spacing(tmp_path, ckpt, sentences):
    s = [line.rstrip(" .") + "." for line in sentences[:4]]
    alone = [out.rstrip("\n") for out in one_by_one(ckpt, s)]
    text = f"{s[0]}  {s[1]}\n\n \t \n\t{s[2]} {s[3]}\n".encode()
    out = run(tmp_path, ckpt, text, split_sentences="en")
    assert out == f"{alone[0]}  {alone[1]}\n\n \t \n\t{alone[2]} {alone[3]}\n"


@pytest.mark.slow
def test_split_sentences_splits_a_long_sentence_instead_of_truncating(tmp_path, ckpt, sentences, capsys):
    long = ", ".join(line.rstrip(" .") for line in sentences) + "."  # one sentence far over 127 subwords
    out = run(tmp_path, ckpt, f"{long}\n{sentences[0]}\n".encode(), split_sentences="en", quiet=False)
    assert out.count("\n") == 2 and out.split("\n")[0].strip()
    err = capsys.readouterr().err
    assert "1 sentence(s) longer than the model's 127 source subwords were split to fit" in err
    assert "truncated" not in err


def test_split_sentences_options():
    with pytest.raises(ValueError, match="text output with --nbest 1"):
        TranslateOptions(path=("a.pt",), split_sentences="en", output_format="jsonl")
    with pytest.raises(ValueError, match="expected a language code"):
        TranslateOptions(path=("a.pt",), split_sentences="e n")


def test_outputs_that_are_not_files_are_written_in_place_and_stdin_is_an_input(tmp_path, ckpt):
    """A symlink to /proc/self/fd/1 (`--output mystdout | wc -l` once counted 0 lines: the link was
    replaced by a file), a FIFO (its reader once waited forever), `-`; and `< same.txt --output
    same.txt`, once accepted (the English replaced by German), refused as `--input same.txt` is."""
    source = tmp_path / "same.txt"
    source.write_text("a dog runs\ntwo men\n", encoding="utf-8")
    xf = [sys.executable, "-m", "xformer_cli", "translate", "--path", str(ckpt), "--device", "cpu", "--quiet",
          "--max-len-b", "5"]

    def run(*args, stdin=None):
        return subprocess.run(xf + [str(a) for a in args], stdin=stdin, capture_output=True, text=True, timeout=120)

    with open(source, "rb") as f:
        refused = run("--output", source, stdin=f)
    assert refused.returncode == 2 and refused.stderr.strip() == (
        f"xf: error: --output {source} is the input stdin; writing it could destroy the input (choose another output)")
    assert source.read_text(encoding="utf-8") == "a dog runs\ntwo men\n"
    plain = run("--input", source)
    link = tmp_path / "mystdout"
    link.symlink_to("/proc/self/fd/1")
    through = run("--input", source, "--output", link)
    assert through.returncode == 0 and through.stdout == plain.stdout and len(plain.stdout.splitlines()) == 2
    assert link.is_symlink()
    assert run("--input", source, "--output", "-").stdout == plain.stdout
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        assert run("--input", source, "--output", fifo).returncode == 0
        assert os.read(reader, 1 << 16).decode("utf-8") == plain.stdout
    finally:
        os.close(reader)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
