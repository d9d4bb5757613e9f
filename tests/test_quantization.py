"""int8 decoding layers (xformer_cli/model/quantization.py): the engine of torch.ao's int8 layers is the
model's own, never the process's; the int8 matmul layer within its rounding bound and the
compiled int8 search within int8's tolerance of the fp32 model, on every CPU kind."""

import copy

import pytest
import torch
from torch import nn

from xformer_cli.base import compiling
from xformer_cli.model import quantization
from xformer_cli.decode.decoder_step import AotStep
from xformer_cli.decode.plan import Machine, plan_decoding
from xformer_cli.decode.engines import XfEngine
from xformer_cli.settings.options import DecodingOptions, TranslateOptions
from xformer_cli.decode.search import search

from helpers import INT8_LOG_PROB_BOUND, teacher_forced_log_probs


def int8_tracks_fp32_and_source(model, reference, sp, sentences, multi30k_dir) -> torch.Tensor:
    """Assert the int8 ``model``'s teacher-forced log-probabilities (test2016's references) are
    within INT8_LOG_PROB_BOUND of fp32 ``reference``'s, and not equal; return the sentences as a
    padded source batch (each cut to 20 pieces, eos last)."""
    targets = (multi30k_dir / "test2016.de").read_text(encoding="utf-8").splitlines()[: len(sentences)]
    differ = (teacher_forced_log_probs(model, sp, sentences, targets)
              - teacher_forced_log_probs(reference, sp, sentences, targets)).abs()
    assert 1e-4 < differ.max() < INT8_LOG_PROB_BOUND
    src = [sp.encode(s)[:20] + [2] for s in sentences]
    width = max(map(len, src))
    return torch.tensor([s + [1] * (width - len(s)) for s in src])


def open_xf(ckpt, machine=None, **options):
    return XfEngine.open([ckpt], plan_decoding(TranslateOptions(path=(ckpt,), device="cpu", **options),
                                               machine or Machine.here()))[0]


@pytest.mark.kernels
def test_the_int8_engine_belongs_to_the_model_not_the_process(ckpt, sentences):
    """Two int8 models of different engines in one process, each searched with a shortlist
    (whose output rows are packed again for every batch, by the model's engine): each gives the
    hypotheses and scores it gives alone, whatever the process-wide engine says, which is never
    left changed."""
    from xformer_cli.decode.translate import open_engine

    before = torch.backends.quantized.engine

    def found(model, src, candidates):
        return [[(h.tokens, h.positional_scores) for h in hyps]
                for hyps in search([model], src, OPTIONS, candidates=candidates)]

    alone = {}
    for engine in ("fbgemm", "onednn"):
        xf, sp, _ = open_engine(TranslateOptions(path=(ckpt,), device="cpu", quantize="int8", int8_engine=engine))
        (model,) = xf.models
        assert model.int8_engine == engine and torch.backends.quantized.engine == before
        src = torch.tensor([ids[:12] + [2] + [1] * (12 - len(ids[:12])) for ids in sp.encode(sentences[:6])])
        candidates = torch.unique(torch.cat([torch.arange(4), src.flatten(), torch.arange(4, model.cfg.vocab_size, 3)]))
        alone[engine] = (model, found(model, src, candidates))
    # the engines quantize activations differently: their scores differ, so a mix-up would show
    assert alone["fbgemm"][1] != alone["onednn"][1]
    for engine, (model, hyps) in alone.items():  # both loaded, the process set to the other engine
        torch.backends.quantized.engine = "onednn" if engine == "fbgemm" else "fbgemm"
        try:
            assert found(model, src, candidates) == hyps, engine
        finally:
            torch.backends.quantized.engine = before


OPTIONS = DecodingOptions(beam_size=3, max_len_a=1.0, max_len_b=4)


# -- int8 over torch._int_mm (--compile --quantize int8) ------------------------------------------
needs_exact_int8 = pytest.mark.skipif(not quantization.int8_matmul_exact(),
                                      reason="this CPU's torch._int_mm is not exact (no VNNI/AMX): xf refuses it, "
                                             "test_int8_matmul_is_refused_where_its_products_are_not_exact checks that")


@pytest.mark.kernels
@needs_exact_int8
@pytest.mark.parametrize("inputs, outputs", [(256, 1024), (1024, 256), (64, 40)])
def test_int8_matmul_linear_is_within_its_rounding_bound(inputs, outputs):
    """Int8MatmulLinear against the fp32 layer within its quantization's error, each row's
    activations on a step of their own (absolute maximum / 127)."""
    torch.manual_seed(0)
    linear = nn.Linear(inputs, outputs)
    x = torch.randn(300, inputs) * 3
    x[::3, 0] = 20  # rows with one large feature: a coarse step for those rows only
    with torch.no_grad():
        error = (quantization.Int8MatmulLinear(linear)(x) - linear(x)).abs()
        x_step = x.abs().amax(dim=1, keepdim=True) / 127  # (rows, 1)
        w_step = linear.weight.abs().amax(dim=1) / 127  # (out,)
        bound = (linear.weight.abs().sum(dim=1) * x_step / 2 + x.abs().sum(dim=1, keepdim=True) * w_step / 2
                 + inputs * x_step * w_step / 4)
    assert error.max() > 0
    assert (error <= bound * 1.001).all(), float((error / bound).max())
    assert error[1::3].max() < error[::3].max()  # per row: the rows without the large feature are finer


def test_int8_matmul_is_refused_where_its_products_are_not_exact(ckpt, monkeypatch):
    """Where torch._int_mm saturates (oneDNN's s8 x s8 without VNNI or AMX), the check says so,
    and --compile --quantize int8 is refused in one line on such a machine."""
    from xformer_cli.base.errors import ConfigError

    def saturating(a, b):  # AVX2's 16-bit pair sums: clipped
        return (a.long() @ b.long()).clamp(-32768 * a.size(1) // 4, 32767 * a.size(1) // 4).int()

    monkeypatch.setattr(torch, "_int_mm", saturating)
    quantization.int8_matmul_exact.cache_clear()
    try:
        assert not quantization.int8_matmul_exact()
        with pytest.raises(ConfigError, match="--compile --quantize int8 needs int8 products this CPU computes"):
            open_xf(ckpt, Machine.here(), quantize="int8", compile=True)
    finally:
        quantization.int8_matmul_exact.cache_clear()


@pytest.mark.slow
@pytest.mark.kernels
@needs_exact_int8
@pytest.mark.usefixtures("one_thread")
def test_aot_int8_search_tracks_fp32_and_its_own_eager_search(ckpt, sentences, multi30k_dir, tmp_path):
    """The int8 matmul model (decoder) with torch.ao's int8 encoder: teacher-forced log-probs
    within INT8_LOG_PROB_BOUND of fp32's; its ahead-of-time compiled search, plain and with a
    shortlist's projection in the graph, agrees with the eager search of the same layers on at
    least 90% of the output tokens (the graph's float rounding can move an activation to the next
    int8 level); every linear layer of the decoder int8."""
    from xformer_cli.decode.translate import open_engine

    fp32, sp, _ = open_engine(TranslateOptions(path=(ckpt,), device="cpu"))
    (reference,) = fp32.models
    model = quantization.quantize_int8_matmul(copy.deepcopy(reference), "fbgemm")
    assert not [m for m in model.modules() if type(m) is nn.Linear]
    assert all(type(m) is quantization.Int8MatmulLinear
               for m in model.decoder_layers.modules() if "Linear" in type(m).__name__)
    src = int8_tracks_fp32_and_source(model, reference, sp, sentences, multi30k_dir)
    options = DecodingOptions(beam_size=4, max_len_a=1.0, max_len_b=5)
    candidates = torch.unique(torch.cat([torch.arange(4), src.flatten(), torch.arange(40, 200)]))
    step = AotStep(compiling.AotPackages(tmp_path / "aot"))
    for cands in (None, candidates):
        compiled = [hyps[0].tokens for hyps in search([model], src, options, candidates=cands, decoder_step=step)]
        eager = [hyps[0].tokens for hyps in search([model], src, options, candidates=cands)]
        same = sum(a == b for c, e in zip(compiled, eager) for a, b in zip(c, e))
        assert same >= 0.9 * sum(max(len(c), len(e)) for c, e in zip(compiled, eager)), (compiled, eager)
        if cands is not None:
            assert set(t for c in compiled for t in c) <= set(candidates.tolist())
    assert step.graphs == 2  # the full projection's package and the shortlist's
