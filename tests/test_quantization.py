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


def compiled_search_tracks_eager(model, src: torch.Tensor, step: AotStep) -> None:
    """Assert ``model``'s search through the compiled ``step``, plain and with a shortlist of
    candidates, agrees with its eager search on at least 90% of the output tokens, and emits
    only candidates with the shortlist."""
    options = DecodingOptions(beam_size=4, max_len_a=1.0, max_len_b=5)
    candidates = torch.unique(torch.cat([torch.arange(4), src.flatten(), torch.arange(40, 200)]))
    for cands in (None, candidates):
        compiled = [hyps[0].tokens for hyps in search([model], src, options, candidates=cands, decoder_step=step)]
        eager = [hyps[0].tokens for hyps in search([model], src, options, candidates=cands)]
        same = sum(a == b for c, e in zip(compiled, eager) for a, b in zip(c, e))
        assert same >= 0.9 * sum(max(len(c), len(e)) for c, e in zip(compiled, eager)), (compiled, eager)
        if cands is not None:
            assert set(t for c in compiled for t in c) <= set(candidates.tolist())


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


def test_compiled_int8_takes_the_packed_kernels_where_int8_matmul_is_not_exact(ckpt, monkeypatch):
    """Where torch._int_mm saturates (oneDNN's s8 x s8 without VNNI or AMX), the check says so,
    and --compile --quantize int8 decodes with the engine's packed int8 layers instead."""

    def saturating(a, b):  # AVX2's 16-bit pair sums: clipped
        return (a.long() @ b.long()).clamp(-32768 * a.size(1) // 4, 32767 * a.size(1) // 4).int()

    monkeypatch.setattr(torch, "_int_mm", saturating)
    quantization.int8_matmul_exact.cache_clear()
    try:
        assert not quantization.int8_matmul_exact()
        engine = open_xf(ckpt, Machine.here(), quantize="int8", compile=True)
        assert engine.plan.int8 == "packed"
        assert any(type(m) is quantization.PackedInt8Linear for m in engine.models[0].decoder_layers.modules())
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
    step = AotStep(compiling.AotPackages(tmp_path / "aot"))
    compiled_search_tracks_eager(model, src, step)
    assert step.graphs == 2  # the full projection's package and the shortlist's


# -- torch.ao's packed kernels inside a compiled step (--compile --quantize int8 without VNNI) -------
@pytest.mark.kernels
@pytest.mark.parametrize("bias", [True, False])
def test_packed_int8_linear_is_the_dynamic_layer_bit_for_bit(bias):
    """PackedInt8Linear gives torch.ao's dynamic layer's outputs exactly, through the registry's
    packed weights and through weights packed again from its tensors (a registry without them);
    a layer of other weights gets another key."""
    torch.manual_seed(0)
    for engine in ("fbgemm", "onednn"):
        linear = nn.Sequential(nn.Linear(24, 40, bias=bias))
        dynamic = quantization._quantize_dynamic(copy.deepcopy(linear), engine)[0]
        packed = quantization.PackedInt8Linear(dynamic, engine)
        x = torch.randn(7, 3, 24) * 2
        assert torch.equal(packed(x), dynamic(x))
        saved = quantization._PACKED.pop(packed.key)
        try:
            assert torch.equal(packed(x), dynamic(x))  # packed again from the tensors, by the layer's engine
        finally:
            quantization._PACKED[packed.key] = saved
        other = nn.Sequential(nn.Linear(24, 40, bias=bias))
        other = quantization._quantize_dynamic(other, engine)[0]
        assert quantization.PackedInt8Linear(other, engine).key != packed.key


@pytest.mark.kernels
def test_packed_int8_model_searches_as_the_dynamic_one(ckpt, sentences):
    """quantize_int8_packed: every int8 layer of the decoder and the output projection packed,
    the encoder torch.ao's; its eager search gives the dynamic model's hypotheses and scores,
    plain and with a shortlist (whose rows come from the packed layer's)."""
    from xformer_cli.decode.translate import open_engine

    xf, sp, _ = open_engine(TranslateOptions(path=(ckpt,), device="cpu", quantize="int8", int8_engine="fbgemm"))
    (dynamic,) = xf.models
    fp32, _, _ = open_engine(TranslateOptions(path=(ckpt,), device="cpu"))
    packed = quantization.quantize_int8_packed(copy.deepcopy(fp32.models[0]), "fbgemm")
    layers = [type(m).__name__ for m in packed.decoder_layers.modules() if "Linear" in type(m).__name__]
    assert layers and set(layers) == {"PackedInt8Linear"} and type(packed.output_proj) is quantization.PackedInt8Linear
    assert not any(type(m) is quantization.PackedInt8Linear for m in packed.encoder_layers.modules())
    src = torch.tensor([ids[:12] + [2] + [1] * (12 - len(ids[:12])) for ids in sp.encode(sentences[:6])])
    candidates = torch.unique(torch.cat([torch.arange(4), src.flatten(), torch.arange(4, packed.cfg.vocab_size, 3)]))
    for cands in (None, candidates):
        found = [[(h.tokens, h.positional_scores) for h in hyps] for hyps in search([packed], src, OPTIONS, candidates=cands)]
        assert found == [[(h.tokens, h.positional_scores) for h in hyps]
                         for hyps in search([dynamic], src, OPTIONS, candidates=cands)]


@pytest.mark.slow
@pytest.mark.kernels
@pytest.mark.usefixtures("one_thread")
def test_aot_packed_int8_search_tracks_its_eager_search(ckpt, sentences, tmp_path):
    """The packed int8 model's ahead-of-time compiled search, plain and with a shortlist (the graph
    gives features, the whole projection or the shortlist's packed rows project them outside),
    agrees with its eager search on at least 90% of the output tokens (the graph's float rounding
    can move an activation's int8 scale); one package, the features', serves both."""
    from xformer_cli.decode.translate import open_engine

    fp32, sp, _ = open_engine(TranslateOptions(path=(ckpt,), device="cpu"))
    model = quantization.quantize_int8_packed(copy.deepcopy(fp32.models[0]), "fbgemm")
    src = torch.tensor([ids[:20] + [2] + [1] * (20 - len(ids[:20])) for ids in sp.encode(sentences[:8])])
    step = AotStep(compiling.AotPackages(tmp_path / "aot"))
    compiled_search_tracks_eager(model, src, step)
    assert step.graphs == 1
