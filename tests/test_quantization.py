"""int8 decoding layers (xformer_cli/quantization.py): the compilable int8 linear layer within its
rounding bound and the compiled int8 search within int8's tolerance of the fp32 model, on every
CPU kind; --int8-engine auto's choice by measurement, cached, and forced by the option."""

import copy
import json

import pytest
import torch
from torch import nn

from xformer_cli import compiling, quantization
from xformer_cli.engines import XfEngine
from xformer_cli.model import build_model
from xformer_cli.options import DecodingOptions
from xformer_cli.quantization import ACTIVATION_LEVELS, Int8Linear, choose_int8_engine, quantize_int8_compilable
from xformer_cli.search import CompiledStep, search

from test_translate import INT8_LOG_PROB_BOUND, teacher_forced_log_probs


@pytest.fixture
def default_quantized_engine():
    yield
    torch.backends.quantized.engine = "fbgemm"  # process-wide: the next test gets the default


@pytest.mark.kernels
@pytest.mark.parametrize("inputs, outputs", [(256, 1024), (1024, 256), (64, 40)])
def test_int8_linear_is_within_its_rounding_bound(inputs, outputs):
    """Int8Linear against the fp32 layer, per output entry, within the error its quantization
    allows: half an activation step times the weights' magnitudes, half a weight step times the
    inputs', and their product (the int32 sums are exact on every CPU kind: 7-bit activations
    keep AVX2's 16-bit pair sums from saturating; with 8 bits, capped at AVX2, this broke by 6.7x)."""
    torch.manual_seed(0)
    linear = nn.Linear(inputs, outputs)
    x = torch.randn(300, inputs) * 3
    x[:, 0] = 20  # one large feature: a wide activation range
    with torch.no_grad():
        error = (Int8Linear(linear)(x) - linear(x)).abs()
        x_step = (x.max() - x.min()) / ACTIVATION_LEVELS
        w_step = linear.weight.abs().amax(dim=1) / 127  # (out,)
        bound = (linear.weight.abs().sum(dim=1) * x_step / 2 + x.abs().sum(dim=1, keepdim=True) * w_step / 2
                 + inputs * x_step * w_step / 4)
    assert error.max() > 0  # quantized: not fp32 under another name
    assert (error <= bound * 1.001).all(), float((error / bound).max())


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


@pytest.mark.slow
@pytest.mark.kernels
def test_compiled_int8_tracks_the_fp32_model_and_the_eager_int8_search(ckpt, sentences, multi30k_dir, monkeypatch):
    """--compile --quantize int8: the int8 model's teacher-forced log-probabilities within
    INT8_LOG_PROB_BOUND of fp32's (the bound torch.ao's int8 engines meet), and the compiled int8
    search agreeing with the eager search of the same int8 layers on at least 90% of the output
    tokens (the same oneDNN products; the traced graph's float rounding before a quantization
    step can move an activation to the next level, so not every token). The graphs are
    aot_eager's (traced as inductor gets them; bench/bench_decode_compile.py --quantize int8 runs
    inductor). Searched hypotheses are not bounded against fp32 by INT8_LOG_PROB_BOUND: on this
    random model torch.ao's int8 engines themselves are 0.37 nats from fp32 at one position."""
    from xformer_cli.translation import open_engine
    from xformer_cli.options import TranslateOptions

    monkeypatch.setattr(compiling, "COMPILE_BACKEND", "aot_eager")
    torch._dynamo.reset()
    fp32, sp, _ = open_engine(TranslateOptions(path=(ckpt,), device="cpu"))
    (reference,) = fp32.models
    model = quantize_int8_compilable(copy.deepcopy(reference))
    assert not [m for m in model.modules() if type(m) is nn.Linear]  # every linear layer is int8
    src = int8_tracks_fp32_and_source(model, reference, sp, sentences, multi30k_dir)
    options = DecodingOptions(beam_size=4, max_len_a=1.0, max_len_b=5)
    step = CompiledStep(freeze=True)
    compiled = [hyps[0].tokens for hyps in search([model], src, options, compiled=step)]
    eager = [hyps[0].tokens for hyps in search([model], src, options)]
    assert step.graphs > 0
    same = sum(a == b for c, e in zip(compiled, eager) for a, b in zip(c, e))
    assert same >= 0.9 * sum(max(len(c), len(e)) for c, e in zip(compiled, eager)), (compiled, eager)
    torch._dynamo.reset()


def test_int8_engine_auto_picks_the_fastest_and_caches_it(tmp_path, monkeypatch, capsys):
    """The fastest engine by measurement, whatever its name; timed once per key, then read from
    the cache; an unreadable cache is warned about and replaced."""
    model = build_model("tiny", vocab_size=40, d_model=32, d_ff=64, heads=4, encoder_layers=1, decoder_layers=1)
    cache = tmp_path / "int8-engines.json"
    engines = [e for e in quantization.INT8_ENGINES if e in torch.backends.quantized.supported_engines]
    slowest_first = {e: float(len(engines) - i) for i, e in enumerate(engines)}
    monkeypatch.setattr(quantization, "time_engines", lambda names, shapes, rows: dict(slowest_first))
    assert choose_int8_engine(model, 8, cache)[0] == engines[-1]
    monkeypatch.setattr(quantization, "time_engines", lambda *a: pytest.fail("timed again"))
    engine, how = choose_int8_engine(model, 8, cache)
    assert engine == engines[-1] and how == f"cached in {cache}"
    assert oct(cache.stat().st_mode & 0o777) == "0o600"
    cache.write_text("{not json")
    monkeypatch.setattr(quantization, "time_engines", lambda names, shapes, rows: {e: 1.0 for e in names})
    assert choose_int8_engine(model, 8, cache)[0] == engines[0]
    assert "ignoring an unreadable int8 engine cache" in capsys.readouterr().err
    assert list(json.loads(cache.read_text()).values())[0]["engine"] == engines[0]


def test_time_engines_times_every_engine(default_quantized_engine):
    seconds = quantization.time_engines(["fbgemm", "onednn"], [(16, 24), (24, 16)], rows=8, repeats=2)
    assert set(seconds) == {"fbgemm", "onednn"} and all(0 < s < 60 for s in seconds.values())


def test_the_engines_are_timed_on_a_new_row_count_every_pass():
    """oneDNN makes a primitive per shape: timed on one row count it looked as fast as fbgemm and
    decoded at 0.71x x86, so every pass has rows it has not seen, as a shrinking beam batch does."""
    assert quantization.row_counts(256, 8) == [256, 252, 248, 244, 240, 236, 232, 228]
    for rows, passes in ((8, 5), (3, 8), (1, 2)):
        counts = quantization.row_counts(rows, passes)
        assert counts[0] == rows and len(set(counts)) == len(counts) and min(counts) >= 1, (rows, counts)


def test_the_int8_engine_is_forced_by_the_option_or_read_from_the_cache(ckpt, default_quantized_engine):
    engine, _ = XfEngine.open([ckpt], device="cpu", quantize="int8", int8_engine="x86")
    assert torch.backends.quantized.engine == "x86" and engine.int8_engine == "x86 (asked for)"
    # auto, with a cache that says onednn measured fastest here for this model: onednn, untimed
    model = XfEngine.open([ckpt], device="cpu")[0].models[0]
    key = quantization.engine_cache_key(quantization.linear_shapes(model), quantization.CALIBRATION_ROWS)
    cache = compiling.cache_dir() / "int8-engines.json"
    compiling.write_private(cache, json.dumps({key: {"engine": "onednn"}}).encode())
    engine, _ = XfEngine.open([ckpt], device="cpu", quantize="int8")
    assert torch.backends.quantized.engine == "onednn" and engine.int8_engine == f"onednn (cached in {cache})"


# -- int8 over torch._int_mm (--compile-mode aot --quantize int8) -----------------------------------
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
    --compile-mode auto falls back to jit for int8, and aot is refused in one line."""
    from xformer_cli.errors import ConfigError

    def saturating(a, b):  # AVX2's 16-bit pair sums: clipped
        return (a.long() @ b.long()).clamp(-32768 * a.size(1) // 4, 32767 * a.size(1) // 4).int()

    monkeypatch.setattr(torch, "_int_mm", saturating)
    quantization.int8_matmul_exact.cache_clear()
    try:
        assert not quantization.int8_matmul_exact()
        with pytest.raises(ConfigError, match="--compile-mode aot --quantize int8 needs int8 products"):
            XfEngine.open([ckpt], device="cpu", quantize="int8", compile_step=True, compile_mode="aot")
        engine, _ = XfEngine.open([ckpt], device="cpu", quantize="int8", compile_step=True)  # auto
        assert type(engine.compiled) is CompiledStep and engine.int8_engine == "onednn (compiled)"
        # jit runs oneDNN's int8: an engine asked for is refused there, not silently replaced
        with pytest.raises(ConfigError, match="compiles with jit on this CPU .* not --int8-engine x86"):
            XfEngine.open([ckpt], device="cpu", quantize="int8", int8_engine="x86", compile_step=True)
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
    from xformer_cli.search import AotStep
    from xformer_cli.translation import open_engine
    from xformer_cli.options import TranslateOptions

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
        compiled = [hyps[0].tokens for hyps in search([model], src, options, candidates=cands, compiled=step)]
        eager = [hyps[0].tokens for hyps in search([model], src, options, candidates=cands)]
        same = sum(a == b for c, e in zip(compiled, eager) for a, b in zip(c, e))
        assert same >= 0.9 * sum(max(len(c), len(e)) for c, e in zip(compiled, eager)), (compiled, eager)
        if cands is not None:
            assert set(t for c in compiled for t in c) <= set(candidates.tolist())
    assert step.graphs == 2  # the full projection's package and the shortlist's
