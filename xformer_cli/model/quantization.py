"""int8 linear layers for decoding on a CPU (xf translate --quantize int8), in two forms.

- ``quantize_int8``: torch.ao's dynamic quantization (eager decoding), packed by one of torch's
  quantized engines (--int8-engine). Its packed weights are TorchScript objects no graph traces.
- ``quantize_int8_matmul``: ``Int8MatmulLinear`` over plain int8 tensors and ``torch._int_mm``,
  which torch.export and AOTInductor compile (--compile --quantize int8).

The engine belongs to the model: ``torch.backends.quantized.engine`` is process-wide, and what it
decides is how weights are packed (a packed weight runs its own engine's kernels), so it is set
only while a model's weights are packed (``quantized_engine``) and recorded on the model
(``INT8_ENGINE_ATTR``) for whatever packs its rows later (a shortlist's output projection).
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from typing import Optional

import torch
from torch import nn

from .transformer import MultiHeadAttention, Transformer

INT8_ENGINES = ("fbgemm", "x86", "onednn")  # torch.backends.quantized.engine values --int8-engine takes
INT8_ENGINE_ATTR = "int8_engine"  # the model attribute that records the engine its weights were packed by


def _split_projections(model: Transformer) -> None:
    for module in model.modules():
        if isinstance(module, MultiHeadAttention):
            module.split_projections()


@contextlib.contextmanager
def quantized_engine(engine: str):
    """torch's quantized engine set to ``engine`` while weights are packed, and set back after:
    the process-wide setting never outlives the packing."""
    before = torch.backends.quantized.engine
    torch.backends.quantized.engine = engine
    try:
        yield
    finally:
        torch.backends.quantized.engine = before


def _quantize_dynamic(module: nn.Module, engine: str) -> nn.Module:
    from torch.ao.quantization import quantize_dynamic

    with quantized_engine(engine), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the deprecation warnings of torch.ao.quantization
        return quantize_dynamic(module, {nn.Linear}, dtype=torch.qint8, inplace=True)


def quantize_int8(model: Transformer, engine: str = "x86") -> Transformer:
    """Dynamic int8 quantization of every linear layer, the output projection included (weights
    int8 per tensor, activations quantized on the fly): torch.ao's quantize_dynamic, deprecated in
    favour of torchao but the one that ships with torch. Embeddings and layer norms stay fp32.
    ``engine`` (--int8-engine) is torch's quantized engine, which packs the weights for its own
    kernels: fbgemm's pick AVX2, AVX-512 or VNNI at run time, oneDNN's AMX where the CPU has it,
    x86 one of the two by the shape. Recorded on the model (``INT8_ENGINE_ATTR``)."""
    _split_projections(model)
    _quantize_dynamic(model, engine)
    setattr(model, INT8_ENGINE_ATTR, engine)
    return model


class Int8MatmulLinear(nn.Module):
    """A linear layer in int8 over plain tensors, which torch.export and AOTInductor compile
    without freezing (the int8 path of --compile): weights int8 per output channel
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
    saturates (seen with ONEDNN_MAX_CPU_ISA=AVX2: products off by millions, and slower);
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
        _quantize_dynamic(model.encoder_layers, encoder_engine)
        setattr(model, INT8_ENGINE_ATTR, encoder_engine)
    return model
