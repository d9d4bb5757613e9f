"""int8 linear layers for decoding on a CPU (xf translate --quantize int8), in two forms, and the
choice of torch's quantized engine by measurement (--int8-engine auto).

- ``quantize_int8``: torch.ao's dynamic quantization (eager decoding). Its packed weights are
  TorchScript objects that torch.compile cannot trace.
- ``quantize_int8_compilable``: ``Int8Linear``, the same scheme (int8 weights, activations
  quantized on the fly) written over oneDNN's ``qlinear_pointwise`` op, which inductor lowers with
  freezing (``CompiledStep(freeze=True)``): the int8 path of --compile --quantize int8. It is the op
  PT2E quantization with torch's x86 inductor quantizer produces (that quantizer moved to torchao,
  which is not installed); weights per output channel, activations per tensor (uint8 with a zero
  point, 7 bits), as PT2E's dynamic scheme.
- ``choose_int8_engine``: fbgemm, x86 or oneDNN, whichever decodes this model's linear layers
  fastest here, timed once per CPU, torch version and model shape and cached (``compiling.cache_dir``).
"""

from __future__ import annotations

import functools
import json
import os
import time
import warnings
from pathlib import Path
from typing import Optional

import torch
from torch import nn

from . import compiling
from .console import warn
from .model import MultiHeadAttention, Transformer

INT8_ENGINES = ("fbgemm", "x86", "onednn")  # torch.backends.quantized.engine values --int8-engine takes
# 7-bit activations (0..127), as fbgemm's reduce_range: CPUs without VNNI multiply u8 x s8 pairs
# into int16 (vpmaddubsw), which saturates at 255 * 127 * 2; measured with ONEDNN_MAX_CPU_ISA=AVX2,
# 8-bit activations broke the rounding bound of tests/test_quantization.py by 6.7x.
ACTIVATION_LEVELS = 127
CALIBRATION_ROWS = 256  # the rows --int8-engine auto times: a batch of 64 sentences at beam 4


def _split_projections(model: Transformer) -> None:
    for module in model.modules():
        if isinstance(module, MultiHeadAttention):
            module.split_projections()


def quantize_int8(model: Transformer, engine: str = "fbgemm") -> Transformer:
    """Dynamic int8 quantization of every linear layer, the output projection included (weights
    int8 per tensor, activations quantized on the fly): torch.ao's quantize_dynamic, deprecated in
    favour of torchao but the one that ships with torch. Embeddings and layer norms stay fp32.
    ``engine`` (--int8-engine) is torch's quantized engine, which packs the weights for its own
    kernels: fbgemm's pick AVX2, AVX-512 or VNNI at run time, oneDNN's AMX where the CPU has it,
    x86 one of the two by the shape. It is process-wide (torch.backends.quantized.engine): every
    model of one process uses one."""
    from torch.ao.quantization import quantize_dynamic

    _split_projections(model)
    torch.backends.quantized.engine = engine
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the deprecation warnings of torch.ao.quantization
        return quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8, inplace=True)


class Int8Linear(nn.Module):
    """A linear layer in int8 that torch.compile traces: weights int8 per output channel
    (symmetric, prepacked for oneDNN), each call's input quantized per tensor to 7-bit uint8 with a
    zero point (from its min and max), the product accumulated in int32 and returned in float32 with the bias."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        w = linear.weight.detach().float()
        scale = w.abs().amax(dim=1).clamp(min=1e-12) / 127  # (out,)
        weight = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
        self.out_features = w.size(0)
        self.register_buffer("w_scale", scale)
        self.register_buffer("w_zero", torch.zeros(w.size(0), dtype=torch.long))
        self.register_buffer("packed", torch.ops.onednn.qlinear_prepack(weight, None))
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().float())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.size(-1))  # (N, in)
        low, high = rows.amin().clamp(max=0), rows.amax().clamp(min=0)  # 0 is exact, as PT2E's observers
        scale = ((high - low) / ACTIVATION_LEVELS).clamp(min=1e-12)
        zero = torch.round(-low / scale).to(torch.int32)
        q = torch.round(rows / scale + zero).clamp(0, ACTIVATION_LEVELS).to(torch.uint8)
        out = torch.ops.onednn.qlinear_pointwise.tensor(q, scale, zero, self.packed, self.w_scale, self.w_zero,
                                                        self.bias, 1.0, 0, torch.float32, "none", [], "")
        return out.reshape(*x.shape[:-1], self.out_features)


class Int8MatmulLinear(nn.Module):
    """A linear layer in int8 over plain tensors, which torch.export and AOTInductor compile
    without freezing (the int8 path of --compile-mode aot): weights int8 per output channel
    (symmetric), stored transposed (in, out) for ``torch._int_mm``; each input row quantized to
    int8 by its own absolute maximum (symmetric, per row: finer than torch.ao's per-tensor
    activations), the product accumulated in int32 and scaled back to float32, the bias added.
    torch._int_mm is oneDNN's s8 x s8 product, exact only where the CPU multiplies int8 pairs
    into int32 (VNNI, AMX): ``int8_matmul_exact`` checks that at run time."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        w = linear.weight.detach().float()
        scale = w.abs().amax(dim=1).clamp(min=1e-12) / 127  # (out,)
        self.out_features = w.size(0)
        self.register_buffer("weight_t", torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8).t().contiguous())
        self.register_buffer("w_scale", scale)
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().float())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return int8_matmul(x, self.weight_t, self.w_scale, self.bias).reshape(*x.shape[:-1], self.out_features)


def int8_matmul(x: torch.Tensor, weight_t: torch.Tensor, w_scale: torch.Tensor,
                bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """x (..., in) float times the int8 weight ``weight_t`` (in, out) of per-column scales
    ``w_scale`` (out,): (rows, out) float32, each row of x quantized by its absolute maximum."""
    rows = x.reshape(-1, x.size(-1)).float()
    x_scale = rows.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 127  # (rows, 1)
    q = torch.round(rows / x_scale).clamp(-127, 127).to(torch.int8)
    out = torch._int_mm(q, weight_t).float() * (x_scale * w_scale)
    return out if bias is None else out + bias


@functools.lru_cache(maxsize=None)
def int8_matmul_exact() -> bool:
    """Whether torch._int_mm multiplies int8 matrices exactly on this CPU (once per process):
    oneDNN's s8 x s8 kernels for CPUs without VNNI or AMX add int8 pairs into int16, which
    saturates (measured with ONEDNN_MAX_CPU_ISA=AVX2: products off by millions, and 5x slower);
    False too where this torch has no CPU _int_mm."""
    a = torch.full((5, 64), 127, dtype=torch.int8)
    a[1::2] = -127
    b = torch.full((64, 16), 127, dtype=torch.int8)
    b[:, 1::2] = -128
    try:
        return torch.equal(torch._int_mm(a, b).long(), a.long() @ b.long())
    except (RuntimeError, AttributeError):  # pragma: no cover - an old torch or a build without it
        return False


def quantize_int8_matmul(model: Transformer, encoder_engine: Optional[str] = None) -> Transformer:
    """Every nn.Linear of the decoder (the split cross-attention projections and the output
    projection included) replaced by an ``Int8MatmulLinear``, in place; the encoder's too, or,
    with ``encoder_engine``, torch.ao's dynamic int8 layers of that engine (``quantize_int8``):
    the encoder runs eagerly once per batch, where those kernels quantize faster."""
    _split_projections(model)
    for module in [*model.decoder_layers.modules(), model, *([] if encoder_engine else model.encoder_layers.modules())]:
        for name, child in module.named_children():
            if type(child) is nn.Linear:
                setattr(module, name, Int8MatmulLinear(child))
    if encoder_engine:
        from torch.ao.quantization import quantize_dynamic

        torch.backends.quantized.engine = encoder_engine
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            quantize_dynamic(model.encoder_layers, {nn.Linear}, dtype=torch.qint8, inplace=True)
    return model


def quantize_int8_compilable(model: Transformer) -> Transformer:
    """Every nn.Linear of ``model`` (the split cross-attention projections and the output
    projection included) replaced by an ``Int8Linear``, in place."""
    _split_projections(model)
    for module in list(model.modules()):
        for name, child in module.named_children():
            if type(child) is nn.Linear:
                setattr(module, name, Int8Linear(child))
    return model


# -- the engine, by measurement --------------------------------------------------------------------
def linear_shapes(model: Transformer) -> list[tuple[int, int]]:
    """(in, out) of each linear layer one decoder step runs: self-attention's fused projection
    and output, cross-attention's query and output, the feed-forward pair, the output projection."""
    shapes = []
    for layer in model.decoder_layers:
        self_attn, cross, ffn = layer.self_attn, layer.cross_attn, layer.ffn
        query = cross.q_proj.weight.shape if cross.q_proj is not None else (cross.inner, cross.d_model)
        for out, inp in (self_attn.in_proj.weight.shape, self_attn.out_proj.weight.shape, query,
                         cross.out_proj.weight.shape, ffn.fc1.weight.shape, ffn.fc2.weight.shape):
            shapes.append((int(inp), int(out)))
    shapes.append((model.output_proj.in_features, model.output_proj.out_features))
    return shapes


def row_counts(rows: int, passes: int) -> list[int]:
    """The input rows of time_engines' passes: ``rows``, then 4 fewer each pass, every one new."""
    return list(range(rows, 0, -4))[:passes] if rows > 4 * (passes - 1) else list(range(rows, 0, -1))[:passes]


def time_engines(engines: list[str], shapes: list[tuple[int, int]], rows: int, repeats: int = 8) -> dict[str, float]:
    """Seconds of ``repeats`` passes over a linear layer of each shape with each engine's dynamic
    int8 kernels, every pass on another number of input rows (``rows``, then 4 fewer each pass:
    a beam search's batch as its sentences finish), the engines taking turns on each so that a
    busy machine slows each alike (random weights: the kernels' speed does not depend on the
    values). A new row count is what decoding meets at almost every step, and what oneDNN pays
    for (a primitive made per shape, beyond its cache): timed on one row count only, oneDNN
    ranked first here and then decoded at 0.71x x86's speed (docs/performance.md). The total,
    not the best pass, since every pass has its own shape. Leaves torch.backends.quantized.engine
    at the last engine."""
    from torch.ao.quantization import quantize_dynamic

    gen = torch.Generator().manual_seed(0)
    counts = row_counts(rows, repeats)
    layers = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for engine in engines:  # each packs its weights its own way, while it is the engine
            torch.backends.quantized.engine = engine
            layers[engine] = [quantize_dynamic(nn.Sequential(nn.Linear(i, o)), {nn.Linear}, dtype=torch.qint8)
                              for i, o in shapes]
    total = dict.fromkeys(engines, 0.0)
    with torch.inference_mode():
        for k, count in enumerate([rows + 1, *counts]):  # the first pass warms the kernels up
            inputs = [torch.randn(count, i, generator=gen) for i, _ in shapes]
            for engine in engines:
                torch.backends.quantized.engine = engine
                start = time.perf_counter()
                for layer, x in zip(layers[engine], inputs):
                    layer(x)
                if k:
                    total[engine] += time.perf_counter() - start
    return total


def engine_cache_key(shapes: list[tuple[int, int]], rows: int) -> str:
    """What a timing holds for: the machine (torch, CPU flags), the threads, the rows, the shapes."""
    return f"{compiling.machine_key()}; {torch.get_num_threads()} threads; rows {rows} down by 4; shapes {shapes}"


def choose_int8_engine(model: Transformer, rows: int, cache: Optional[Path] = None) -> tuple[str, str]:
    """(engine, how it was chosen) for --int8-engine auto: the fastest of the engines this torch
    has on this model's decoder-step shapes with ``rows`` rows (batch x beam), from the cache file
    (``cache``: compiling.cache_dir() / "int8-engines.json") where this CPU, torch and shape were
    timed before with as many threads, else timed now (a second or two) and recorded there. An unreadable cache is
    warned about and replaced."""
    cache = compiling.cache_dir() / "int8-engines.json" if cache is None else cache
    shapes = linear_shapes(model)
    key = engine_cache_key(shapes, rows)
    known: dict = {}
    if cache.exists():
        try:
            known = json.loads(cache.read_text())
            if not isinstance(known, dict):
                raise ValueError("not a JSON object")
        except (OSError, ValueError, UnicodeDecodeError) as e:
            warn(f"{cache}: ignoring an unreadable int8 engine cache ({e}); timing the engines again")
            known = {}
    found = known.get(key)
    if isinstance(found, dict) and found.get("engine") in torch.backends.quantized.supported_engines:
        return found["engine"], f"cached in {cache}"
    engines = [e for e in INT8_ENGINES if e in torch.backends.quantized.supported_engines]
    seconds = time_engines(engines, shapes, rows)
    best = min(seconds, key=seconds.get)
    known[key] = dict(engine=best, seconds=seconds)
    try:
        compiling.write_private(cache, json.dumps(known, indent=1).encode())
    except OSError as e:
        warn(f"{cache}: cannot record the int8 engine choice ({e})")
    timings = ", ".join(f"{e} {s * 1e3:.1f} ms" for e, s in seconds.items())
    return best, f"timed now: {timings}"
