"""xf train --compile: one compilation for every batch shape, the same training as eager, and
exact resume. The graphs are made with the aot_eager backend (traced as inductor would get them,
without its minutes of code generation on a small CPU); bench/gpu.sh and BENCH=train make bench
run inductor itself. (xf translate --compile, ahead of time: tests/test_compile_aot.py.)"""

import json

import pytest
import torch

from xformer_cli.base import compiling
from xformer_cli.model.checkpoint import load_checkpoint
from xformer_cli.data.batching import batch_by_size
from xformer_cli.data.dataset import DataDir
from xformer_cli.model.transformer import build_model
from xformer_cli.settings.options import TrainOptions
from xformer_cli.commands.train import train

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


