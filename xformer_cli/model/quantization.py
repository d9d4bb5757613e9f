"""int8 linear layers for decoding on a CPU (xf translate --quantize int8), in three forms.

- ``quantize_int8``: torch.ao's dynamic quantization (eager decoding), packed by one of torch's
  quantized engines (--int8-engine). Its packed weights are TorchScript objects no graph traces.
- ``quantize_int8_matmul``: ``Int8MatmulLinear`` over plain int8 tensors and ``torch._int_mm``,
  which torch.export and AOTInductor compile (--compile --quantize int8 on a CPU with VNNI or AMX).
- ``quantize_int8_packed``: torch.ao's layers behind ``PackedInt8Linear``, an operator
  (``xf::packed_int8_linear``) a compiled graph calls with plain tensors, running the same packed
  kernels (--compile --quantize int8 on a CPU without VNNI or AMX, where torch._int_mm is slow).

The engine belongs to the model: ``torch.backends.quantized.engine`` is process-wide, and what it
decides is how weights are packed (a packed weight runs its own engine's kernels), so it is set
only while a model's weights are packed (``quantized_engine``) and recorded on the model
(``INT8_ENGINE_ATTR``) for whatever packs its rows later (a shortlist's output projection).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
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


# -- torch.ao's packed int8 kernels inside a compiled step ---------------------------------------
# A graph takes tensors, not torch.ao's packed weights (TorchScript objects torch.export cannot
# trace), so the compiled step calls this operator with the layer's int8 weight, and the operator
# finds the packed weights by ``key``, a digest of everything they are packed from: the same packed
# object eager decoding multiplies with, so the products are the eager layer's. A process that
# loads a package without having made the layer (none does today) packs them once from the tensors.
_PACKED: dict[int, object] = {}
_LIBRARY = torch.library.Library("xf", "DEF")
_LIBRARY.define("packed_int8_linear(Tensor x, Tensor weight, float scale, int zero_point, Tensor? bias, str engine, "
                "int key) -> Tensor")


def _packed_int8_linear(x, weight, scale, zero_point, bias, engine, key):
    packed = _PACKED.get(key)
    if packed is None:
        with quantized_engine(engine):
            rows = torch._make_per_tensor_quantized_tensor(weight, scale, zero_point)
            packed = _PACKED[key] = torch.ops.quantized.linear_prepack(rows, bias)
    return torch.ops.quantized.linear_dynamic(x, packed, reduce_range=True)


def _packed_int8_linear_shape(x, weight, scale, zero_point, bias, engine, key):
    return x.new_empty((*x.shape[:-1], weight.size(0)))


_LIBRARY.impl("packed_int8_linear", _packed_int8_linear, "CPU")
torch.library.register_fake("xf::packed_int8_linear", _packed_int8_linear_shape, lib=_LIBRARY)


class PackedInt8Linear(nn.Module):
    """A torch.ao dynamic int8 layer (``quantize_int8``) that a compiled graph can hold: its int8
    weight, scale and bias as tensors and numbers, multiplied by the layer's own packed weights
    through ``xf::packed_int8_linear``, so eager and compiled steps compute the same products."""

    def __init__(self, layer: nn.Module, engine: str):
        super().__init__()
        weight, bias = layer._packed_params._weight_bias()
        if weight.qscheme() != torch.per_tensor_affine:  # quantize_int8's layers are per tensor
            raise ValueError(f"PackedInt8Linear takes per-tensor int8 layers, not {weight.qscheme()}")
        self.scale, self.zero_point, self.engine = float(weight.q_scale()), int(weight.q_zero_point()), engine
        self.register_buffer("weight", weight.int_repr().contiguous())
        self.register_buffer("bias", None if bias is None else bias.detach().clone())
        h = hashlib.sha256(f"{engine} {self.scale!r} {self.zero_point} {tuple(self.weight.shape)};".encode())
        h.update(self.weight.numpy().tobytes())
        h.update(b"" if bias is None else self.bias.float().numpy().tobytes())
        self.key = int.from_bytes(h.digest()[:7], "little")
        _PACKED.setdefault(self.key, layer._packed_params._packed_params)
        # what a shortlist's rows are taken from (decode/shortlist.py, _unpacked)
        self._xf_unpacked = (self.weight, self.scale, self.zero_point, self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.xf.packed_int8_linear(x, self.weight, self.scale, self.zero_point, self.bias, self.engine,
                                               self.key)


def quantize_int8_packed(model: Transformer, engine: str) -> Transformer:
    """``quantize_int8`` with every int8 layer of the decoder (the output projection included) a
    ``PackedInt8Linear``, in place: the decoder step compiles with torch.ao's kernels inside; the
    encoder keeps torch.ao's layers (it runs eagerly, once per batch)."""
    from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear

    quantize_int8(model, engine)
    for module in [*model.decoder_layers.modules(), model]:
        for name, child in module.named_children():
            if isinstance(child, DynamicLinear):
                setattr(module, name, PackedInt8Linear(child, engine))
    return model
