"""The encoder-decoder Transformer of "Attention Is All You Need" (Vaswani et al., 2017).

Read top to bottom (the configuration and its presets are ``options.ModelConfig`` and
``options.PRESETS``): positions, attention, feed-forward, the encoder
and decoder layers, then the model. Defaults are the paper's (post-LN, ReLU, sinusoidal
positions, three-way tied embeddings); options from later practice are marked where they differ.

Shapes: B batch, S source length, T target length, D d_model, H heads, K head size (d_k = d_v,
by default D / H; H * K need not be D).
Token ids: pad 0, unk 1, bos 2, eos 3 (``text/vocab.py``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from ..settings.config import build_options
from ..settings.options import PRESETS, ModelConfig, model_config  # noqa: F401 - the configuration, as data, torch-free
from ..text.vocab import PAD_ID


def sinusoidal_positions(length: int, d_model: int, frequencies: str = "paper") -> torch.Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d)) (Sec. 3.5).

    Returns (length, d_model), sines in even and cosines in odd dimensions as in the formula.
    frequencies "tensor2tensor": 10000^(i/(d/2-1)) in place of 10000^(2i/d), as tensor2tensor's
    timing signal and Marian have them (the sines' and cosines' order is a permutation apart).
    """
    pos = torch.arange(length, dtype=torch.float64).unsqueeze(1)  # (L, 1)
    i = torch.arange(0, d_model // 2, dtype=torch.float64)
    div = torch.pow(10000.0, 2 * i / d_model if frequencies == "paper" else i / max(d_model // 2 - 1, 1))
    pe = torch.zeros(length, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(pos / div)
    pe[:, 1::2] = torch.cos(pos / div[: d_model // 2])
    return pe.float()


def rope_tables(length: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables (length, head_dim / 2) for rotary position embeddings (Su et al.)."""
    inv_freq = 1.0 / 10000 ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.arange(length, dtype=torch.float64).unsqueeze(1) * inv_freq  # (L, K/2)
    return angles.cos().float(), angles.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x[2i], x[2i+1]) of x (B, H, L, K) by the angles of their positions."""
    x1, x2 = x[..., 0::2], x[..., 1::2]
    out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return out.flatten(-2).type_as(x)


def alibi_slopes(heads: int) -> torch.Tensor:
    """Head-specific slopes 2^(-8i/h) of ALiBi (Press et al., 2022), for h a power of two."""
    return torch.tensor([2 ** (-8 * (i + 1) / heads) for i in range(heads)])


# Up to this many query x key positions per head, CPUs run attention as two plain matmuls and a
# softmax, faster than SDPA's flash kernel for captions, sentences and beam search steps; longer
# sequences take SDPA, whose memory does not grow with T x S (figures: docs/benchmarks.md,
# "Figures behind the rules in the code").
MATMUL_ATTENTION_MAX_POSITIONS = 64 * 64


def attention(q, k, v, mask=None, causal: bool = False, dropout: float = 0.0) -> torch.Tensor:
    """softmax(q k^T / sqrt(K) + mask) v for q (B, H, T, K), k and v (B, H, S, K) -> (B, H, T, K).

    mask: boolean, True where attention is allowed, or an additive float bias; broadcast to
    (B, H, T, S). causal: mask future keys instead (T == S). dropout: on the attention weights.
    """
    t, s = q.size(-2), k.size(-2)
    # Compiled (xf train --compile), SDPA always: the choice by length would be a guard on the
    # symbolic shapes, and crossing it a recompilation.
    if q.device.type != "cpu" or torch.compiler.is_compiling() or t * s > MATMUL_ATTENTION_MAX_POSITIONS:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=causal)
    weights = attention_weights(q, k, mask, causal)
    if dropout:
        weights = F.dropout(weights, dropout, True)
    return weights @ v


def attention_weights(q, k, mask=None, causal: bool = False) -> torch.Tensor:
    """The post-softmax weights softmax(q k^T / sqrt(K) + mask) (B, H, T, S) of ``attention``."""
    t, s = q.size(-2), k.size(-2)
    scores = (q * q.size(-1) ** -0.5) @ k.transpose(-1, -2)  # (B, H, T, S)
    if causal:
        mask = torch.ones(t, s, dtype=torch.bool, device=q.device).tril(s - t)
    if mask is not None and mask.dtype == torch.bool:
        # the dtype's lowest value, not -inf: a fully masked row (padding) stays finite, as in SDPA
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    elif mask is not None:
        scores = scores + mask
    # Under autocast the softmax runs in float32, as CUDA's autocast policy has it; CPU autocast
    # leaves it in the scores' dtype (bf16), where its forward equals float32 rounded once but its
    # backward works from bf16-rounded weights and attention dropout rounds again. The product with
    # v casts the weights back to bf16. Without autocast (fp32 training, a bf16 model decoding) the
    # softmax stays in the scores' dtype.
    return scores.softmax(dim=-1, dtype=torch.float32 if torch.is_autocast_enabled(scores.device.type) else None)


class KeyValueCache:
    """The keys and values of a decoder self-attention for the prefix decoded so far.

    Preallocated and filled step by step: a step writes its keys and values into the next slot
    (no concatenation of the prefix), and a beam reorder gathers the prefix into a second buffer
    (one copy, where reorder-then-concatenate made two). Buffers are (capacity, N, H, K), so the
    prefix is a contiguous slice and attention reads it as a (N, H, t, K) view without a copy;
    they grow by doubling when a step would not fit (``new_cache(capacity)`` sizes them).
    """

    def __init__(self, capacity: int = 0):
        self.capacity = capacity
        self.length = 0  # positions filled
        self.k = self.v = None  # (capacity, N, H, K)
        self._spare: Optional[tuple[torch.Tensor, torch.Tensor]] = None  # flat: the gather target of select
        self._bases: Optional[tuple[torch.Tensor, torch.Tensor]] = None  # flat: what k, v are views of (None: own)

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Add k, v (N, H, T, K) of T new positions; returns the whole prefix's (N, H, t, K) views."""
        t0, t = self.length, self.length + k.size(2)
        if self.k is None or t > self.k.size(0):
            self._grow(k, max(t, self.capacity, 2 * (self.k.size(0) if self.k is not None else 0)))
        self.k[t0:t].copy_(k.permute(2, 0, 1, 3))
        self.v[t0:t].copy_(v.permute(2, 0, 1, 3))
        self.length = t
        return self.k[:t].permute(1, 2, 0, 3), self.v[:t].permute(1, 2, 0, 3)

    @classmethod
    def of(cls, k: torch.Tensor, v: torch.Tensor, length: int) -> "KeyValueCache":
        """A cache over the buffers k, v (capacity, N, H, K) whose first ``length`` positions are
        filled: what the compiled decoder step (``decoder_step.AotStep``) gets in place of the cache
        object, so that the graph depends on tensors and one int, not on a Python object."""
        cache = cls(k.size(0))
        cache.k, cache.v, cache.length = k, v, length
        return cache

    def _grow(self, like: torch.Tensor, capacity: int) -> None:
        n, h, _, d = like.shape
        k = like.new_empty(capacity, n, h, d)
        v = like.new_empty(capacity, n, h, d)
        if self.k is not None:
            k[: self.length].copy_(self.k[: self.length])
            v[: self.length].copy_(self.v[: self.length])
        self.k, self.v, self._spare, self._bases = k, v, None, None

    def select(self, rows: torch.Tensor) -> None:
        """Keep rows ``rows`` (LongTensor, may repeat) of the prefix: beams followed, rows dropped.
        The prefix is gathered into the spare buffers, whose storage any number of rows up to
        its size reuses (a search that drops done sentences shrinks its rows without allocating),
        and the old buffers become the spare."""
        if self.k is None:
            return
        t, (capacity, n, h, d) = self.length, self.k.shape
        size = capacity * rows.numel() * h * d
        if self._spare is None or self._spare[0].numel() < size:
            self._spare = (self.k.new_empty(size), self.v.new_empty(size))
        k, v = (spare[:size].view(capacity, rows.numel(), h, d) for spare in self._spare)
        for new, old in ((k, self.k), (v, self.v)):
            if old.requires_grad:  # out= does not record gradients (search runs without them)
                new[:t] = old[:t].index_select(1, rows)
            else:
                torch.index_select(old[:t], 1, rows, out=new[:t])
        old = self._bases if self._bases is not None else (self.k.reshape(-1), self.v.reshape(-1))
        self._bases, self._spare = self._spare, old
        self.k, self.v = k, v


class DecoderCache:
    """The decoder's incremental state for the rows being decoded, one entry per layer:
    ``self_attn[i]``, layer i's self-attention keys and values of the prefix (a ``KeyValueCache``,
    one row per hypothesis), and ``cross[i]``, its cross-attention keys and values of the memory
    (B, H, S, K), projected at the first step (None before it).

    Rows are hypotheses; the memory's rows are sentences, as many as the rows or fewer (beam
    search: a sentence's beams share its memory, ``MultiHeadAttention._grouped_cross_attention``).
    The search changes rows with ``select_rows`` (rows and memory alike), ``follow_beams`` (rows
    within their sentences) and ``keep_sentences`` (drop done sentences and their beams); the
    compiled decoder step (``decoder_step.AotStep``) passes it into its graph as tensors
    (``tensors``, ``of``) and moves it on one position after (``advance``).
    """

    def __init__(self, layers: int, capacity: int = 0):
        self.self_attn = [KeyValueCache(capacity) for _ in range(layers)]
        self.cross: list[Optional[tuple[torch.Tensor, torch.Tensor]]] = [None] * layers

    @property
    def length(self) -> int:
        """Positions decoded so far."""
        return self.self_attn[0].length

    def memory_kv(self, i: int, attn: "MultiHeadAttention", memory: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer i's cross-attention keys and values (B, H, S, K) of memory, projected by ``attn``
        at the first step and reused after it."""
        if self.cross[i] is None:
            self.cross[i] = attn.project_kv(memory)
        return self.cross[i]

    def select_rows(self, rows: torch.Tensor) -> None:
        """Keep rows ``rows`` (LongTensor, may repeat) of everything, memory included: whole
        sentences dropped or copied (one row per sentence)."""
        self.keep_sentences(rows, rows)

    def follow_beams(self, rows: torch.Tensor) -> None:
        """Row r continues the prefix of row ``rows[r]`` (a beam of the same sentence, or a copy
        of its sentence's row): only the self-attention prefixes move, the memory stays."""
        for cache in self.self_attn:
            cache.select(rows)

    def keep_sentences(self, sentences: torch.Tensor, rows: torch.Tensor) -> None:
        """Keep the memory of ``sentences`` and the prefixes of their beams' ``rows``."""
        self.follow_beams(rows)
        self.cross = [kv if kv is None else (kv[0].index_select(0, sentences), kv[1].index_select(0, sentences))
                      for kv in self.cross]

    def tensors(self) -> tuple[list[torch.Tensor], ...]:
        """Every layer's buffers as lists (keys, values, cross keys, cross values), after the
        first step: what a compiled step's graph takes in place of this object. The cross keys
        and values are made contiguous once (the first step's are views of one projection), so
        every step gives the graph one layout."""
        self.cross = [(k.contiguous(), v.contiguous()) for k, v in self.cross]
        return ([c.k for c in self.self_attn], [c.v for c in self.self_attn],
                [k for k, _ in self.cross], [v for _, v in self.cross])

    @classmethod
    def of(cls, keys: list, values: list, cross_keys: list, cross_values: list, length: int) -> "DecoderCache":
        """The cache over ``tensors()``'s buffers, ``length`` positions filled (inside the graph)."""
        cache = cls(0)
        cache.self_attn = [KeyValueCache.of(k, v, length) for k, v in zip(keys, values)]
        cache.cross = list(zip(cross_keys, cross_values))
        return cache

    def advance(self) -> None:
        """One more position filled: a compiled step wrote it into the buffers of ``tensors()``."""
        for cache in self.self_attn:
            cache.length += 1


class MultiHeadAttention(nn.Module):
    """h heads of scaled dot-product attention (Sec. 3.2) with one fused q/k/v projection.

    ``in_proj`` holds W^Q, W^K, W^V stacked (3E, D), E = H * K; self-attention projects all three in one
    matmul, cross-attention projects queries from the decoder and keys/values from the encoder.
    """

    def __init__(self, d_model: int, heads: int, dropout: float, head_dim: Optional[int] = None):
        super().__init__()
        self.heads, self.d_model, self.dropout = heads, d_model, dropout
        # MultiHead(Q, K, V) = Concat(head_1..head_h) W^O with W_i^Q, W_i^K in R^(D x d_k), W_i^V in
        # R^(D x d_v) (Sec. 3.2.2): xf takes d_k = d_v = K, so the inner width is E = H * K
        self.head_dim = head_dim or d_model // heads
        self.inner = heads * self.head_dim  # E
        # A list while recording (attention_maps.record): each call appends its post-softmax
        # weights (B, H, T, S). None (the default) leaves the forward path as it is.
        self.recorded: Optional[list[torch.Tensor]] = None
        self.in_proj = nn.Linear(d_model, 3 * self.inner)  # (3E, D)
        self.out_proj = nn.Linear(self.inner, d_model)  # (D, E)
        nn.init.xavier_uniform_(self.in_proj.weight)
        nn.init.zeros_(self.in_proj.bias)
        nn.init.xavier_uniform_(self.out_proj.weight)
        nn.init.zeros_(self.out_proj.bias)
        self.q_proj: Optional[nn.Module] = None  # cross-attention's split projections (split_projections)
        self.kv_proj: Optional[nn.Module] = None

    def split_projections(self) -> None:
        """Give cross-attention its own query and key/value modules (copies of in_proj's rows), so
        that module-level transforms (int8 dynamic quantization) reach them. Inference only."""
        d, e, w = self.d_model, self.inner, self.in_proj.weight
        self.q_proj = nn.Linear(d, e, device=w.device, dtype=w.dtype)
        self.kv_proj = nn.Linear(d, 2 * e, device=w.device, dtype=w.dtype)
        with torch.no_grad():
            for lin, rows in ((self.q_proj, slice(0, e)), (self.kv_proj, slice(e, 3 * e))):
                lin.weight.copy_(self.in_proj.weight[rows])
                lin.bias.copy_(self.in_proj.bias[rows])

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        b, length, _ = x.shape
        return x.view(b, length, self.heads, -1).transpose(1, 2)  # (B, H, L, K)

    def project_kv(self, memory: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values (B, H, S, K) of encoder output for cross-attention."""
        e = self.inner
        kv = self.kv_proj(memory) if self.kv_proj is not None else F.linear(memory, self.in_proj.weight[e:], self.in_proj.bias[e:])
        k, v = kv.chunk(2, dim=-1)
        return self._split(k), self._split(v)

    def forward(
        self,
        x: torch.Tensor,
        memory: Optional[torch.Tensor] = None,
        mask: Optional[torch.Tensor] = None,
        causal: bool = False,
        cache: Optional[KeyValueCache] = None,
        rope: Optional[tuple[torch.Tensor, torch.Tensor]] = None,
        memory_kv: Optional[tuple[torch.Tensor, torch.Tensor]] = None,
    ) -> torch.Tensor:
        """x (B, T, D) attends to itself (memory None) or to memory (B, S, D).

        mask: boolean (B or 1, 1, T or 1, S) with True where attention is allowed, or a float
        additive bias (ALiBi); causal: apply the decoder's future mask (training-time only).
        cache: self-attention's incremental decoding state; this step's keys and values are
        appended to it. memory_kv: cross-attention's keys and values (B, H, S, K) of memory,
        projected once for incremental decoding (``DecoderCache.memory_kv``); None: projected here.
        rope: (cos, sin) tables for the positions of x, applied to queries and keys.
        """
        e = self.inner
        if memory is None:
            q, k, v = (self._split(t) for t in self.in_proj(x).chunk(3, dim=-1))
            if rope is not None:
                q, k = apply_rope(q, *rope), apply_rope(k, *rope)
            if cache is not None:
                k, v = cache.append(k, v)
        else:
            q = self.q_proj(x) if self.q_proj is not None else F.linear(x, self.in_proj.weight[:e], self.in_proj.bias[:e])
            q = self._split(q)
            k, v = memory_kv if memory_kv is not None else self.project_kv(memory)
            if q.size(0) != k.size(0):  # beam search: one sentence's memory for all its beams
                return self.out_proj(self._grouped_cross_attention(q, k, v, mask))
        if self.recorded is None:
            out = attention(q, k, v, mask, causal and mask is None, self.dropout if self.training else 0.0)
        else:  # the explicit path of attention() (equal output), keeping its weights; no dropout
            weights = attention_weights(q, k, mask, causal and mask is None)
            self.recorded.append(weights)
            out = weights @ v
        b, _, t, _ = out.shape
        return self.out_proj(out.transpose(1, 2).reshape(b, t, e))  # (B, T, E) -> (B, T, D)

    def _grouped_cross_attention(self, q, k, v, mask) -> torch.Tensor:
        """Beam search: q (B * beams, H, T, K) against one sentence's k, v (B, H, S, K), so the
        memory's keys and values are never copied to each beam. -> (B * beams, T, E)."""
        b, h, s, kd = k.shape
        rows, _, t, _ = q.shape
        beams = rows // b
        q = q.view(b, beams, h, t, kd).transpose(1, 2).reshape(b, h, beams * t, kd)  # (B, H, beams T, K)
        out = attention(q, k, v, mask)  # (B, H, beams T, K)
        return out.view(b, h, beams, t, kd).permute(0, 2, 3, 1, 4).reshape(rows, t, self.inner)


class _MaskedScale(torch.autograd.Function):
    """x * mask * scale with the mask kept as bool (1 byte an element) for the backward."""

    @staticmethod
    def forward(ctx, x, mask, scale: float):
        ctx.save_for_backward(mask)
        ctx.scale = scale
        return x * mask * scale

    @staticmethod
    def backward(ctx, grad):
        (mask,) = ctx.saved_tensors
        return grad * mask * ctx.scale, None, None


class Dropout(nn.Module):
    """Inverted dropout, as nn.Dropout, with a faster mask on CPUs.

    On CPUs, torch's dropout draws one Bernoulli sample per element from mt19937, which took about
    9% of a training step of the small preset (2 cores). Here one 64-bit draw makes four 16-bit
    uniform lanes and an element is kept when its lane is at least p * 2^16: the keep probability
    is 1 - round(p * 2^16) / 2^16 (within 8e-6 of 1 - p) and the scale is its exact inverse, so the
    expectation is unchanged. Faster (docs/benchmarks.md); same global generator, so runs stay reproducible from
    the seed. Other devices use F.dropout (CUDA's is fused and fast).
    """

    def __init__(self, p: float):
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"dropout probability must be in [0, 1], got {p}")
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        drop = round(self.p * 65536)
        if x.device.type != "cpu" or drop == 65536:
            return F.dropout(x, self.p, True)
        n = x.numel()
        bits = torch.randint(-(2**63), 2**63 - 1, ((n + 3) // 4,), dtype=torch.int64)
        keep = bits.view(torch.int16)[:n].view(x.shape) >= drop - 32768
        return _MaskedScale.apply(x, keep, 65536 / (65536 - drop))

    def extra_repr(self) -> str:
        return f"p={self.p}"


class FeedForward(nn.Module):
    """FFN(x) = max(0, x W1 + b1) W2 + b2 (Sec. 3.3); gelu, swish or SwiGLU (Shazeer, 2020) by option."""

    def __init__(self, d_model: int, d_ff: int, activation: str, activation_dropout: float):
        super().__init__()
        self.activation = activation
        # SwiGLU has a gate and a value projection; both live in fc1 (2 * d_ff outputs).
        self.fc1 = nn.Linear(d_model, 2 * d_ff if activation == "swiglu" else d_ff)
        self.fc2 = nn.Linear(d_ff, d_model)
        self.activation_dropout = Dropout(activation_dropout)
        for lin in (self.fc1, self.fc2):
            nn.init.xavier_uniform_(lin.weight)
            nn.init.zeros_(lin.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc1(x)
        if self.activation == "relu":
            h = F.relu(h)
        elif self.activation == "gelu":
            h = F.gelu(h)
        elif self.activation == "swish":  # x * sigmoid(x), MarianMT's (OPUS-MT models)
            h = F.silu(h)
        else:
            gate, value = h.chunk(2, dim=-1)
            h = F.silu(gate) * value
        return self.fc2(self.activation_dropout(h))


class Sublayer(nn.Module):
    """A residual block around one sub-layer, post-LN by default.

    post-LN (the paper, Sec. 5.4): LayerNorm(x + Dropout(Sublayer(x))).
    pre-LN  (normalize_before):    x + Dropout(Sublayer(LayerNorm(x))), with a final LayerNorm
    after the stack; it trains stably without warmup tricks but is not what the paper did.
    """

    def __init__(self, d_model: int, dropout: float, normalize_before: bool):
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.dropout = Dropout(dropout)
        self.normalize_before = normalize_before

    def forward(self, x: torch.Tensor, fn) -> torch.Tensor:
        if self.normalize_before:
            return x + self.dropout(fn(self.norm(x)))
        return self.norm(x + self.dropout(fn(x)))


class EncoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.self_attn = MultiHeadAttention(cfg.d_model, cfg.heads, cfg.attention_dropout, cfg.head_dim)
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff, cfg.activation, cfg.activation_dropout)
        self.attn_block = Sublayer(cfg.d_model, cfg.dropout, cfg.normalize_before)
        self.ffn_block = Sublayer(cfg.d_model, cfg.dropout, cfg.normalize_before)

    def forward(self, x, mask, rope=None):
        x = self.attn_block(x, lambda h: self.self_attn(h, mask=mask, rope=rope))
        return self.ffn_block(x, self.ffn)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.self_attn = MultiHeadAttention(cfg.d_model, cfg.heads, cfg.attention_dropout, cfg.head_dim)
        self.cross_attn = MultiHeadAttention(cfg.d_model, cfg.heads, cfg.attention_dropout, cfg.head_dim)
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff, cfg.activation, cfg.activation_dropout)
        self.self_block = Sublayer(cfg.d_model, cfg.dropout, cfg.normalize_before)
        self.cross_block = Sublayer(cfg.d_model, cfg.dropout, cfg.normalize_before)
        self.ffn_block = Sublayer(cfg.d_model, cfg.dropout, cfg.normalize_before)

    def forward(self, x, memory, self_mask, memory_mask, causal, self_cache=None, memory_kv=None, rope=None):
        x = self.self_block(
            x, lambda h: self.self_attn(h, mask=self_mask, causal=causal, cache=self_cache, rope=rope)
        )
        x = self.cross_block(
            x, lambda h: self.cross_attn(h, memory=memory, mask=memory_mask, memory_kv=memory_kv)
        )
        return self.ffn_block(x, self.ffn)


class Transformer(nn.Module):
    """Encoder-decoder Transformer.

    forward(src (B, S), prev_output (B, T)) -> logits (B, T, V), where prev_output is the target
    shifted right (bos first). For search: ``encode`` once, then ``decode`` one step at a time
    with a cache from ``new_cache()`` (a ``DecoderCache``: it follows beams and drops rows).
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        d = cfg.d_model
        # Sec. 3.4: embeddings are multiplied by sqrt(d_model); MarianMT models may leave them as they are
        self.embed_scale = math.sqrt(d) if cfg.scale_embedding else 1.0
        self.decoder_embed = nn.Embedding(cfg.vocab_size, d, padding_idx=PAD_ID)
        nn.init.normal_(self.decoder_embed.weight, mean=0.0, std=d**-0.5)
        nn.init.zeros_(self.decoder_embed.weight[PAD_ID])
        if cfg.share_embeddings == "all":  # three-way tying, as the paper (Sec. 3.4)
            self.encoder_embed = self.decoder_embed
        else:
            self.encoder_embed = nn.Embedding(cfg.vocab_size, d, padding_idx=PAD_ID)
            nn.init.normal_(self.encoder_embed.weight, mean=0.0, std=d**-0.5)
            nn.init.zeros_(self.encoder_embed.weight[PAD_ID])
        self.output_proj = nn.Linear(d, cfg.vocab_size, bias=False)
        if cfg.share_embeddings in ("all", "decoder"):
            self.output_proj.weight = self.decoder_embed.weight
        else:
            nn.init.normal_(self.output_proj.weight, mean=0.0, std=d**-0.5)
        # MarianMT's final_logits_bias (V,): part of the model but not trained, as there; None without it
        self.register_buffer("output_bias", torch.zeros(cfg.vocab_size) if cfg.output_bias else None)

        if cfg.positions == "sinusoidal":
            self.register_buffer("pos_table", sinusoidal_positions(cfg.max_positions, d, cfg.sinusoids),
                                 persistent=False)
        elif cfg.positions == "learned":  # Table 3, row E
            self.learned_pos = nn.Embedding(cfg.max_positions, d)
            nn.init.normal_(self.learned_pos.weight, mean=0.0, std=d**-0.5)
        elif cfg.positions == "rope":
            cos, sin = rope_tables(cfg.max_positions, cfg.head_dim)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)
        elif cfg.positions == "alibi":
            self.register_buffer("alibi_slopes", alibi_slopes(cfg.heads), persistent=False)
        self.dropout = Dropout(cfg.dropout)

        self.encoder_layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.encoder_layers))
        self.decoder_layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.decoder_layers))
        # Pre-LN leaves the residual stream un-normalized: one LayerNorm closes each stack.
        self.encoder_norm = nn.LayerNorm(d) if cfg.normalize_before else nn.Identity()
        self.decoder_norm = nn.LayerNorm(d) if cfg.normalize_before else nn.Identity()

    # -- positions -----------------------------------------------------------------------------
    def _embed(self, embed: nn.Embedding, tokens: torch.Tensor, offset: int, zero_start: bool = False) -> torch.Tensor:
        """Scaled token embeddings plus absolute positions offset..offset+L-1, then dropout: (B, L, D).
        zero_start: position 0 embeds a zero vector whatever its token (the decoder's bos, with
        --decoder-start zero)."""
        length = tokens.size(1)
        if offset + length > self.cfg.max_positions:
            raise ValueError(
                f"sequence of {offset + length} tokens exceeds max_positions {self.cfg.max_positions}"
            )
        x = embed(tokens) * self.embed_scale
        if zero_start and offset == 0:  # Marian's decoder starts from a zero vector, not a token's embedding
            x = torch.cat([torch.zeros_like(x[:, :1]), x[:, 1:]], dim=1)
        if self.cfg.positions == "sinusoidal":
            x = x + self.pos_table[offset : offset + length]
        elif self.cfg.positions == "learned":
            x = x + self.learned_pos.weight[offset : offset + length]
        return self.dropout(x)

    def _rope(self, offset: int, length: int):
        """(cos, sin) of positions offset... (L, K/2)."""
        if self.cfg.positions != "rope":
            return None
        return self.rope_cos[offset : offset + length], self.rope_sin[offset : offset + length]

    def _alibi(self, q_len: int, k_len: int, offset: int, causal: bool) -> torch.Tensor:
        """ALiBi bias (1, H, T, S): -slope * distance; -inf on future keys when causal."""
        q_pos = torch.arange(offset, offset + q_len, device=self.alibi_slopes.device)
        k_pos = torch.arange(k_len, device=self.alibi_slopes.device)
        rel = (q_pos[:, None] - k_pos[None, :]).float()  # (T, S)
        # Encoder: symmetric distance. Decoder: distance to the past; future masked out.
        bias = -self.alibi_slopes[:, None, None] * rel.abs()
        if causal:
            bias = bias.masked_fill(rel < 0, float("-inf"))
        return bias.unsqueeze(0)

    # -- encoder / decoder ---------------------------------------------------------------------
    def encode(self, src: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """src (B, S) -> (memory (B, S, D), src_pad (B, S) bool, True at padding)."""
        src_pad = src.eq(PAD_ID)
        mask = (~src_pad)[:, None, None, :]  # (B, 1, 1, S), True = may attend
        if self.cfg.positions == "alibi":
            bias = self._alibi(src.size(1), src.size(1), 0, causal=False)
            mask = bias.masked_fill(~mask, float("-inf"))  # (B, H, S, S)
        x = self._embed(self.encoder_embed, src, 0)
        rope = self._rope(0, src.size(1))
        for layer in self.encoder_layers:
            x = layer(x, mask, rope)
        return self.encoder_norm(x), src_pad

    def decode(
        self,
        prev_output: torch.Tensor,
        memory: torch.Tensor,
        src_pad: torch.Tensor,
        cache: Optional[DecoderCache] = None,
        features_only: bool = False,
    ) -> torch.Tensor:
        """prev_output (B, T) -> logits (B, T, V).

        Without a cache the whole prefix is decoded under the causal mask (training). With a
        cache, prev_output holds only the new token(s) (B, 1) and earlier steps come from it.
        Targets are right-padded, so under the causal mask no real position sees padding.
        """
        offset = cache.length if cache is not None else 0
        t = prev_output.size(1)
        x = self._embed(self.decoder_embed, prev_output, offset, self.cfg.decoder_start == "zero")
        memory_mask = (~src_pad)[:, None, None, :]  # (B, 1, 1, S)
        # A single new step attends to the whole cached prefix: no mask needed.
        causal = t > 1
        self_mask = None
        if causal and offset > 0:  # several new tokens after a cached prefix
            pos = torch.arange(offset + t, device=x.device)
            self_mask = (pos[None, :] <= pos[offset:, None])[None, None]  # (1, 1, T, offset+T)
        if self.cfg.positions == "alibi":
            bias = self._alibi(t, offset + t, offset, causal=True)
            self_mask = bias if self_mask is None else bias.masked_fill(~self_mask, float("-inf"))
        rope = self._rope(offset, t)
        for i, layer in enumerate(self.decoder_layers):
            if cache is None:
                x = layer(x, memory, self_mask, memory_mask, causal, rope=rope)
            else:
                memory_kv = cache.memory_kv(i, layer.cross_attn, memory)
                x = layer(x, memory, self_mask, memory_mask, causal, cache.self_attn[i], memory_kv, rope)
        x = self.decoder_norm(x)
        if features_only:
            return x
        logits = self.output_proj(x)
        return logits if self.output_bias is None else logits + self.output_bias

    def forward(self, src: torch.Tensor, prev_output: torch.Tensor, features_only: bool = False) -> torch.Tensor:
        """Logits (B, T, V), or with features_only the decoder outputs (B, T, D) before the
        output projection and bias (the trainer projects them inside its fused loss)."""
        memory, src_pad = self.encode(src)
        return self.decode(prev_output, memory, src_pad, features_only=features_only)

    # -- incremental decoding ------------------------------------------------------------------
    def new_cache(self, capacity: int = 0) -> DecoderCache:
        """An empty ``DecoderCache`` for ``decode``; ``capacity``: the positions each layer
        preallocates (it grows beyond them when needed)."""
        return DecoderCache(len(self.decoder_layers), capacity)

    def set_dropout(self, p: float) -> None:
        """Set P_drop (cfg.dropout: the embeddings' and every sub-layer output's dropout) to ``p``
        for the updates that follow (xf train --late-dropout); ``cfg`` keeps the value the model
        was built with, and attention and activation dropout are left as they are."""
        for module in (self.dropout, *(m.dropout for m in self.modules() if isinstance(m, Sublayer))):
            module.p = p

    def num_parameters(self) -> int:
        """Parameters counted once, tied tensors included once."""
        return sum(p.numel() for p in self.parameters())


def build_model(arch: str = "base", vocab_size: int = 37000, **overrides) -> Transformer:
    """Build a preset with any ModelConfig field overridden, e.g. build_model("small", 8000, dropout=0.3)."""
    return Transformer(model_config(arch, vocab_size=vocab_size, **overrides))


def config_from_dict(values: dict) -> ModelConfig:
    """ModelConfig from a plain dict (as stored in checkpoints), with strict key checking."""
    return build_options(ModelConfig, dict(values), "model config")


def config_to_dict(cfg: ModelConfig) -> dict:
    return dataclasses.asdict(cfg)
