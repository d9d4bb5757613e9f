"""xf train --compile: one compilation for every batch shape, the same training as eager, and
exact resume; xf translate --compile: a few graphs for every batch shape, the same search as
eager, and the combinations it refuses. The graphs are made with the aot_eager backend (traced
as inductor would get them, without its minutes of code generation on a small CPU); bench/gpu.sh
and BENCH=train make bench run inductor itself, bench/bench_decode_compile.py for decoding."""

import json

import pytest
import torch

from xformer_cli import compiling
from xformer_cli.checkpoint import load_checkpoint
from xformer_cli.batching import batch_by_size
from xformer_cli.data import DataDir
from xformer_cli.model import build_model
from xformer_cli.options import DecodingOptions, TranslateOptions, TrainOptions
from xformer_cli.search import CompiledStep, search
from xformer_cli.vocab import EOS_ID, PAD_ID
from xformer_cli.commands.train import train
from xformer_cli.commands.translate import translate

from helpers import MICRO


@pytest.fixture(autouse=True)
def aot_eager(monkeypatch):
    monkeypatch.setattr(compiling, "COMPILE_BACKEND", "aot_eager")
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    yield
    torch._dynamo.reset()


def train_losses(save_dir) -> list[float]:
    lines = (save_dir / "train_log.jsonl").read_text().splitlines()
    return [r["loss"] for r in map(json.loads, lines) if r["type"] == "train"]


def opts(data_dir, save_dir, **kw) -> TrainOptions:
    return TrainOptions(data=str(data_dir), save_dir=str(save_dir), **{**MICRO, "log_interval": 10, **kw})


@pytest.mark.slow
@pytest.mark.kernels
def test_one_compilation_for_all_batch_shapes_and_the_same_losses_as_eager(data_dir, tmp_path):  # noqa: F811
    train_set = DataDir.open(data_dir).split("train")
    shapes = {(len(b), int(train_set.src_sizes[b].max()), int(train_set.tgt_sizes[b].max()))
              for b in batch_by_size(train_set.src_sizes, train_set.tgt_sizes, MICRO["max_tokens"])}
    assert len(shapes) >= 10  # an epoch of many (batch, source, target) shapes
    kw = dict(max_epoch=1, dropout=0.0, log_interval=1)
    compiled = train(opts(data_dir, tmp_path / "compiled", compile=True, **kw))
    eager = train(opts(data_dir, tmp_path / "eager", **kw))
    # one graph, at most one more for a batch of one sentence (dynamo specializes sizes 0 and 1)
    assert 1 <= compiled["compiled_graphs"] <= 2, compiled["compiled_graphs"]
    assert compiled["compile_seconds"] > 0 and "compile_seconds" not in eager
    assert compiled["num_updates"] == eager["num_updates"]
    # The bounds hold on any CPU kind: aot_eager runs the same aten kernels as eager on a traced,
    # decomposed graph, so the two differ only by fp32 reassociation (about 1e-7 relative per op)
    # and whatever Adam makes of it; no code is generated for this CPU's instruction set. Checked
    # with avx512 and capped at AVX2 (tests/test_cpu_kinds.py), on Multi30k and the generated corpus.
    assert compiled["valid"]["loss"] == pytest.approx(eager["valid"]["loss"], rel=1e-5)
    a = load_checkpoint(tmp_path / "compiled" / "checkpoint_last.pt")["model"]
    b = load_checkpoint(tmp_path / "eager" / "checkpoint_last.pt")["model"]
    assert a.keys() == b.keys()  # the compiled wrapper leaves no trace in the checkpoint
    # Weights are not compared element by element: Adam (eps 1e-9) turns last-bit differences of
    # near-zero gradients into lr-sized steps on a few elements. The losses say it trains the same.
    for x, y in zip(train_losses(tmp_path / "compiled"), train_losses(tmp_path / "eager"), strict=True):
        assert x == pytest.approx(y, rel=1e-4)


@pytest.mark.slow
def test_compiled_resume_is_exact(data_dir, tmp_path):  # noqa: F811
    """N+M compiled updates in one run == N, stop, resume for M (dropout on)."""
    kw = dict(compile=True, dropout=0.2, max_update=6)
    train(opts(data_dir, tmp_path / "full", **kw))
    train(opts(data_dir, tmp_path / "part", **{**kw, "max_update": 3}))
    train(opts(data_dir, tmp_path / "part", **kw))
    a = load_checkpoint(tmp_path / "full" / "checkpoint_last.pt")
    b = load_checkpoint(tmp_path / "part" / "checkpoint_last.pt")
    assert a["train_state"]["position"] == b["train_state"]["position"]
    for name in a["model"]:
        assert torch.equal(a["model"][name], b["model"][name]), name


@pytest.mark.slow
def test_a_first_batch_with_as_many_source_as_target_positions_does_not_specialize_the_graph():
    """Duck sizing would give S and T one symbol when the first batch has S == T; the next batch
    (S != T) would recompile forward and backward. Marked dynamic, every shape shares one graph."""
    torch.manual_seed(0)
    model = build_model("tiny", vocab_size=60, encoder_layers=1, decoder_layers=1)
    forward = compiling.compile_forward(model)
    for b, s, t in [(4, 9, 9), (4, 7, 11), (3, 12, 5), (5, 6, 6)]:
        src, prev = torch.randint(4, 60, (b, s)), torch.randint(4, 60, (b, t))
        forward(src, prev).float().sum().backward()
        assert compiling.compiled_graphs() == 1, (b, s, t)
    assert forward.training is model.training  # attributes reach the module through the wrapper


# -- xf translate --compile ----------------------------------------------------------------------
def random_batch(generator, sentences: int, longest: int) -> torch.Tensor:
    """sentences (B, longest + 1) of random ids + eos, right-padded, of random lengths 1..longest."""
    lengths = torch.randint(1, longest + 1, (sentences,), generator=generator)
    lengths[0] = longest
    src = torch.full((sentences, longest + 1), PAD_ID)
    for i, n in enumerate(lengths.tolist()):
        src[i, :n] = torch.randint(4, 40, (n,), generator=generator)
        src[i, n] = EOS_ID
    return src


def assert_same_search(a, b):
    for hyps_a, hyps_b in zip(a, b, strict=True):
        assert [h.tokens for h in hyps_a] == [h.tokens for h in hyps_b]
        for x, y in zip(hyps_a, hyps_b):
            assert x.score == pytest.approx(y.score, abs=1e-4)
            assert x.positional_scores == pytest.approx(y.positional_scores, abs=1e-4)


@pytest.mark.slow
@pytest.mark.kernels
@pytest.mark.usefixtures("one_thread")
def test_compiled_search_equals_eager_with_a_few_graphs_for_every_batch_shape():
    """Beam search through the compiled decoder step: the tokens of the eager search and scores
    within 1e-4, over batches of many shapes whose sentences leave at different steps (each at
    its own length limit); after the first two batches no shape compiles a new graph. Then
    greedy search with a shortlist (one row per sentence; the projection eager)."""
    torch.manual_seed(0)
    model = build_model("tiny", vocab_size=40, d_model=32, d_ff=64, heads=4, encoder_layers=2, decoder_layers=2).eval()
    generator = torch.Generator().manual_seed(1)
    compiled = CompiledStep()
    beam = DecodingOptions(beam_size=4, nbest=2, max_len_b=4)
    shapes = [(1, 4), (3, 5), (5, 7), (8, 9), (2, 3), (6, 11), (4, 2), (7, 6)]  # (sentences, longest source)
    for i, (sentences, longest) in enumerate(shapes):
        src = random_batch(generator, sentences, longest)
        assert_same_search(search([model], src, beam, compiled=compiled), search([model], src, beam))
        if i == 1:
            graphs = compiled.graphs
    # step 1 and the steps after it (dynamo specializes the lengths 0 and 1), each for one
    # sentence and for several (a size of 1 is specialized too)
    assert 2 <= graphs <= 4 and compiled.graphs == graphs, (graphs, compiled.graphs)
    assert compiled.compile_seconds > 0
    src = random_batch(generator, 5, 6)
    greedy = DecodingOptions(beam_size=1, max_len_b=4)
    candidates = torch.tensor([0, 1, 2, 3, 5, 8, 13, 21, 34])  # a shortlist's ids
    assert_same_search(search([model], src, greedy, candidates=candidates, compiled=compiled),
                       search([model], src, greedy, candidates=candidates))
    assert compiled.graphs > graphs  # it ran compiled: the graphs without the projection


@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")
def test_translate_compile_reports_its_compile_time_apart(tmp_path, ckpt, sentences, capsys):
    data = tmp_path / "in.txt"
    data.write_text("\n".join(sentences[:6]) + "\n", encoding="utf-8")
    kw = dict(path=(ckpt,), input=str(data), max_len_a=0.5, max_len_b=3, threads=1)
    translate(TranslateOptions(**kw, output=str(tmp_path / "eager.txt")))
    capsys.readouterr()
    translate(TranslateOptions(**kw, output=str(tmp_path / "compiled.txt"), compile=True, compile_mode="jit"))
    assert (tmp_path / "compiled.txt").read_text() == (tmp_path / "eager.txt").read_text()
    err = capsys.readouterr().err
    assert "compile (not in the speeds)" in err and "graph(s)" in err


@pytest.mark.parametrize("kw, message", [
    (dict(engine="ctranslate2"), "--engine ctranslate2 runs CTranslate2's"),
    (dict(quantize="int8", int8_engine="fbgemm", compile_mode="jit"), "--compile-mode jit --quantize int8 runs oneDNN"),
    (dict(workers=2, compile_mode="jit"), "--compile with --workers 2 needs the ahead-of-time step"),
    (dict(workers=2, device="cuda"), "--compile with --workers 2 needs the ahead-of-time step"),
])
def test_translate_compile_refuses(kw, message):
    with pytest.raises(ValueError, match=message):
        TranslateOptions(path=("model.pt",), compile=True, **kw)
    TranslateOptions(path=("model.pt",), **kw)  # each is fine without --compile


def test_translate_compile_takes_an_int8_engine_ahead_of_time():
    """Ahead of time (auto's choice where int8 products are exact) --int8-engine names the
    encoder's torch.ao int8: an option the check leaves to the engine (tests/test_quantization.py)."""
    for mode in ("auto", "aot"):
        TranslateOptions(path=("model.pt",), compile=True, compile_mode=mode, quantize="int8", int8_engine="fbgemm")


# -- the compiled step kept between runs (compiling.CompileCache) ---------------------------------
def test_a_corrupt_compile_cache_is_ignored_with_a_warning(tmp_path, capsys):
    """A cache file torch cannot read (here: bytes that fail its checksum) is warned about in one
    line, without torch's traceback, and decoding compiles anew; the next save replaces it."""
    cache = compiling.CompileCache.for_model("tiny; fp32", root=tmp_path)
    compiling.write_private(cache.path, b"not torch's cache artifacts")
    assert not cache.load() and not cache.loaded
    err = capsys.readouterr().err
    assert "ignoring an unreadable compile cache" in err and str(cache.path) in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_compile_cache_others_can_write_is_not_loaded(tmp_path, capsys, monkeypatch):
    """Loading a cache runs its code: a file writable by others is refused, untouched by torch."""
    cache = compiling.CompileCache.for_model("tiny; fp32", root=tmp_path)
    compiling.write_private(cache.path, b"artifacts")
    cache.path.chmod(0o666)
    monkeypatch.setattr(torch.compiler, "load_cache_artifacts", lambda data: pytest.fail("loaded"))
    assert not cache.load()
    assert "not loading this compile cache: writable by others" in capsys.readouterr().err


def test_the_compile_cache_is_keyed_and_saved_after_each_compile(tmp_path, monkeypatch):
    """One file per model key and machine (torch version, CPU flags), in a private directory;
    CompiledStep loads it when made and saves torch's artifacts after each call that compiled."""
    a, b = (compiling.CompileCache.for_model(k, root=tmp_path / "c") for k in ("cfg A; fp32", "cfg A; int8"))
    assert a.path != b.path and a.path.parent == tmp_path / "c"
    saved = []
    monkeypatch.setattr(torch.compiler, "save_cache_artifacts", lambda: (b"artifacts", None))
    monkeypatch.setattr(torch.compiler, "load_cache_artifacts", lambda data: saved.append(data) or object())
    model = build_model("tiny", vocab_size=40, d_model=16, d_ff=32, heads=2, encoder_layers=1, decoder_layers=1).eval()
    step = CompiledStep(cache=a)
    search([model], random_batch(torch.Generator().manual_seed(0), 2, 3), DecodingOptions(beam_size=2, max_len_b=2),
           compiled=step)
    assert step.graphs > 0 and a.path.read_bytes() == b"artifacts"
    assert oct(a.path.stat().st_mode & 0o777) == "0o600" and oct(a.path.parent.stat().st_mode & 0o777) == "0o700"
    assert CompiledStep(cache=a).cache.loaded and saved == [b"artifacts"]


@pytest.mark.slow
@pytest.mark.kernels
def test_a_warm_compile_cache_gives_the_outputs_of_a_cold_compile(tmp_path):
    """inductor itself, two processes: the first compiles from nothing and saves the cache, the
    second loads it; both decode the same batch to the same tokens."""
    import subprocess
    import sys

    code = """
import json, sys, torch
from pathlib import Path
from xformer_cli import compiling
from xformer_cli.model import build_model
from xformer_cli.options import DecodingOptions
from xformer_cli.search import CompiledStep, search
torch.manual_seed(0)
model = build_model("tiny", vocab_size=40, d_model=16, d_ff=32, heads=2, encoder_layers=1, decoder_layers=1).eval()
src = torch.tensor([[5, 6, 7, 2], [8, 9, 2, 1]])
step = CompiledStep(backend="inductor", cache=compiling.CompileCache.for_model("test", root=Path(sys.argv[1])))
found = search([model], src, DecodingOptions(beam_size=2, max_len_b=3), compiled=step)
print(json.dumps(dict(loaded=step.cache.loaded, tokens=[[h.tokens for h in hyps] for hyps in found])))
"""
    env = {**__import__("os").environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    runs = []
    for i in range(2):
        if i:  # the second process has no inductor cache of its own: only xf's file
            __import__("shutil").rmtree(tmp_path / "inductor")
        proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "xf")], env=env, capture_output=True,
                              text=True, check=True)
        runs.append(json.loads(proc.stdout.splitlines()[-1]))
    assert [r["loaded"] for r in runs] == [False, True]
    assert runs[0]["tokens"] == runs[1]["tokens"]
