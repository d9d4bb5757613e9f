"""The decoder step of a search, one call whether it runs eagerly or compiled ahead of time.

A step takes one model, each row's newest token (N, 1), the encoder's memory and padding, the
``DecoderCache`` and the rows at their maximum length, and gives log p(next token) (N, V) with
pad and bos forbidden (and only eos where a row is at its maximum), over a shortlist's
candidates where a ``RestrictedProjection`` is given. ``EagerStep`` runs the model as written;
``AotStep`` (xf translate --compile) runs a package that torch.export and AOTInductor compiled
from the same function (``_decoder_step``), kept between runs in ``compiling.AotPackages`` and
keyed by everything the package depends on: the model's config and weights, the precision, the
beams per sentence, the projection, the machine (torch, the CPU flags) and the source of the
code compiled into it (``source_digest``), so an upgrade of that code builds anew.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import time
import warnings
from pathlib import Path
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from ..base import compiling
from ..model.quantization import INT8_ENGINE_ATTR, PackedInt8Linear
from ..model.transformer import DecoderCache, Transformer
from ..text.vocab import BOS_ID, EOS_ID, PAD_ID
from .shortlist import RestrictedProjection, project_candidates

LOG_ZERO = float("-inf")


def forbid_specials(lprobs: torch.Tensor, at_max: Optional[torch.Tensor]) -> torch.Tensor:
    """Never emit pad or bos; rows where ``at_max`` (bool (N,), None: no row) may only emit eos."""
    lprobs[:, PAD_ID] = LOG_ZERO
    lprobs[:, BOS_ID] = LOG_ZERO
    if at_max is not None:
        # one masked select keeps eos (rather than saving it, filling the row and writing it back)
        keep = torch.arange(lprobs.size(1), device=lprobs.device).eq(EOS_ID)  # (V,)
        lprobs = lprobs.masked_fill(at_max[:, None] & ~keep, LOG_ZERO)
    return lprobs


def _decoder_step(model: Transformer, token, memory, src_pad, keys, values, cross_keys, cross_values, length: int,
                  at_max, project: bool) -> torch.Tensor:
    """One incremental decoder step written over tensors and one int, the function AotStep exports
    and compiles: token (N, 1), the layers' self-attention buffers keys/values (capacity, N, H, K)
    with ``length`` positions filled (this step writes the next), their cross-attention
    keys/values (B, H, S, K) -> log p(next token) (N, V) with the specials forbidden; project
    False (a shortlist): the decoder's features (N, D) instead."""
    cache = DecoderCache.of(keys, values, cross_keys, cross_values, length)
    out = model.decode(token, memory, src_pad, cache, features_only=not project)[:, -1]
    return forbid_specials(F.log_softmax(out.float(), dim=-1), at_max) if project else out


def _candidates_step(model: Transformer, token, memory, src_pad, keys, values, cross_keys, cross_values, length: int,
                     at_max, candidates: tuple) -> torch.Tensor:
    """``_decoder_step`` with a shortlist's projection in the graph: ``candidates``, the tensors
    of ``RestrictedProjection.tensors()`` -> log p(next token) (N, |vocab|), the specials forbidden."""
    features = _decoder_step(model, token, memory, src_pad, keys, values, cross_keys, cross_values, length, at_max,
                             False)
    return forbid_specials(F.log_softmax(project_candidates(features, *candidates).float(), dim=-1), at_max)


class EagerStep:
    """The step as the model runs it, one operator at a time: the search's default."""

    compile_seconds, graphs, loaded = 0.0, 0, 0

    def __call__(self, model: Transformer, token: torch.Tensor, memory: torch.Tensor, src_pad: torch.Tensor,
                 cache: DecoderCache, at_max: Optional[torch.Tensor],
                 projection: Optional[RestrictedProjection] = None) -> torch.Tensor:
        if projection is None:
            logits = model.decode(token, memory, src_pad, cache)[:, -1]
        else:
            logits = projection(model.decode(token, memory, src_pad, cache, features_only=True)[:, -1])
        return forbid_specials(F.log_softmax(logits.float(), dim=-1), at_max)


def _whole_projection(model: Transformer, features: torch.Tensor) -> torch.Tensor:
    """features (N, D) -> logits (N, V): the model's output projection and bias, as ``decode`` has them."""
    logits = model.output_proj(features)
    return logits if model.output_bias is None else logits + model.output_bias


# -- ahead of time --------------------------------------------------------------------------------
def step_sources() -> list[Path]:
    """The source files whose code a compiled package holds: this module's step, the model it
    traces (attention, layers, the cache), the int8 products and a shortlist's projection, the
    special ids. Their text is part of the package key (``source_digest``)."""
    from ..model import transformer as model, quantization
    from . import shortlist
    from ..text import vocab

    return [Path(m.__file__) for m in (model, quantization, shortlist, vocab)] + [Path(__file__)]


@functools.lru_cache(maxsize=None)
def source_digest() -> str:
    """A digest of ``step_sources``' text: a package built from other code is not loaded."""
    h = hashlib.sha256()
    for path in step_sources():
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:24]


class _ExportedStep(torch.nn.Module):
    """``_decoder_step`` of one model as torch.export takes it: tensors only, the filled length
    as the size of ``filled`` less one (a size is a dynamic dimension of the graph, an int
    argument would be a constant; one more, so that the size is at least 2 from the first
    filled position on: torch.export specializes sizes 0 and 1), the projection (``project``)
    fixed per package."""

    def __init__(self, model: Transformer, project: bool):
        super().__init__()
        self.model, self.project = model, project

    def forward(self, token, memory, src_pad, filled, at_max, keys, values, cross_keys, cross_values, candidates=()):
        length = filled.size(0) - 1
        torch._check(length < keys[0].size(0))  # the buffers have room for the position written
        if candidates:  # a shortlist's projection (a list of its tensors), in the graph
            return _candidates_step(self.model, token, memory, src_pad, keys, values, cross_keys, cross_values,
                                    length, at_max, tuple(candidates))
        return _decoder_step(self.model, token, memory, src_pad, keys, values, cross_keys, cross_values, length,
                             at_max, self.project)


class AotStep:
    """The decoder step compiled ahead of time (``xf translate --compile`` on fp32 and bf16
    models): exported (torch.export, every size dynamic) and compiled by AOTInductor into a
    package kept between runs (``compiling.AotPackages``, keyed by the model's config and
    weights, the precision, the beams per sentence, the projection and the code), so a second
    run loads it in about a second instead of compiling. One package per (model, projection,
    beams per sentence): greedy search's rows are its sentences, beam search's are beam x
    sentences (the grouped cross-attention). Called as ``EagerStep`` is; compile_seconds: the time of
    the calls that built or loaded a package, graphs: packages built, loaded: packages loaded,
    each with what --workers processes reported (``remote``: their longest compile time, since
    they compile side by side, and their packages built and loaded)."""

    def __init__(self, packages: Optional[compiling.AotPackages] = None):
        self.packages = packages or compiling.AotPackages()
        self.runners: dict[tuple, Callable] = {}
        self.digests: dict[int, str] = {}
        self.local_seconds, self.local_built, self.local_loaded = 0.0, 0, 0
        self.remote: tuple[float, int, int] = (0.0, 0, 0)

    @property
    def compile_seconds(self) -> float:
        return self.local_seconds + self.remote[0]

    @property
    def graphs(self) -> int:
        return self.local_built + self.remote[1]

    @property
    def loaded(self) -> int:
        return self.local_loaded + self.remote[2]

    def counters(self) -> tuple[float, int, int]:
        """This process's own (seconds, packages built, packages loaded)."""
        return self.local_seconds, self.local_built, self.local_loaded

    def _runner(self, model: Transformer, project, beams: int, like: tuple) -> Callable:
        """project: True (the whole vocabulary), False (the features, for packed int8 rows to project
        outside the graph), or "candidates N" (a shortlist's projection of N
        tensors in the graph, ``like`` ending with them)."""
        found = self.runners.get((id(model), project, beams))
        if found is not None:
            return found
        start = time.perf_counter()
        if id(model) not in self.digests:
            self.digests[id(model)] = compiling.weights_digest(model)
        param = next(model.parameters())
        key = (f"{model.cfg}; weights {self.digests[id(model)]}; {param.dtype}; {param.device.type}; "
               f"project {project}; beams {beams}; int8 engine {getattr(model, INT8_ENGINE_ATTR, None)}; "
               f"code {source_digest()}")
        with warnings.catch_warnings():  # torch.export's own deprecations (LeafSpec), not the user's concern
            warnings.simplefilter("ignore", FutureWarning)
            runner, built = self.packages.load(key), False
            if runner is None:
                with self.packages.building(key):  # another --workers process may be building it
                    runner = self.packages.load(key)
                    if runner is None:
                        self.packages.build(key, self._export(model, project, beams, like))
                        runner, built = self.packages.load(key), True
            if runner is None:  # pragma: no cover - a package just built that does not load
                raise RuntimeError(f"{self.packages.path(key)}: the compiled package does not load")
        self.local_built += built
        self.local_loaded += not built
        self.runners[(id(model), project, beams)] = runner
        self.local_seconds += time.perf_counter() - start
        return runner

    @staticmethod
    def _export(model: Transformer, project, beams: int, like: tuple):
        """torch.export of the step over example inputs shaped as ``like``'s (their layer count,
        heads, widths and dtypes), every size different so that none is taken for another."""
        from torch.export import Dim

        token, memory, cross_key, key = like[:4]
        candidates = like[4] if len(like) > 4 else None
        sentences, source, filled, capacity = 3, 7, 5 + 1, 11
        rows = sentences * beams
        top = model.cfg.max_positions + 1
        example = (torch.full((rows, 1), EOS_ID, dtype=token.dtype, device=token.device),
                   memory.new_zeros(sentences, source, memory.size(-1)),
                   torch.zeros(sentences, source, dtype=torch.bool, device=token.device),
                   torch.empty(filled, dtype=torch.uint8, device=token.device),
                   torch.zeros(rows, dtype=torch.bool, device=token.device),
                   [key.new_zeros(capacity, rows, *key.shape[2:]) for _ in range(model.cfg.decoder_layers)],
                   [key.new_zeros(capacity, rows, *key.shape[2:]) for _ in range(model.cfg.decoder_layers)],
                   [cross_key.new_zeros(sentences, cross_key.size(1), source, cross_key.size(3))
                    for _ in range(model.cfg.decoder_layers)],
                   [cross_key.new_zeros(sentences, cross_key.size(1), source, cross_key.size(3))
                    for _ in range(model.cfg.decoder_layers)])
        b = Dim("sentences", min=1, max=1 << 16)
        r = b * beams if beams > 1 else b
        # one position filled (bos) or more, below max_positions: the size is one more
        s, t, c = Dim("source", min=1, max=top), Dim("filled", min=2, max=top - 1), Dim("capacity", min=3, max=top + 1)
        layers = model.cfg.decoder_layers
        shapes = ({0: r}, {0: b, 1: s}, {0: b, 1: s}, {0: t}, {0: r}, [{0: c, 1: r}] * layers, [{0: c, 1: r}] * layers,
                  [{0: b, 2: s}] * layers, [{0: b, 2: s}] * layers)
        if candidates is not None:  # the shortlist's rows: (V', D) float or (D, V') int8, then (V',) each
            size, v = 13, Dim("candidates", min=4, max=model.cfg.vocab_size)
            weight = candidates[0]
            example = (*example, [weight.new_zeros((size, weight.size(1)) if weight.is_floating_point() else
                                                   (weight.size(0), size))]
                       + [t.new_zeros(size) for t in candidates[1:]])
            shapes = (*shapes, [{0: v} if weight.is_floating_point() else {1: v}] + [{0: v}] * (len(candidates) - 1))
        # the step's module without the encoder: the step never runs it, and an int8 encoder of
        # torch.ao's packed layers (quantize_int8_matmul) is not exportable
        decoder = copy.copy(model)
        decoder._modules = {**model._modules, "encoder_layers": torch.nn.ModuleList()}
        with torch.no_grad():
            return torch.export.export(_ExportedStep(decoder, project), example, dynamic_shapes=shapes, strict=False)

    def __call__(self, model: Transformer, token: torch.Tensor, memory: torch.Tensor, src_pad: torch.Tensor,
                 cache: DecoderCache, at_max: Optional[torch.Tensor],
                 projection: Optional[RestrictedProjection] = None) -> torch.Tensor:
        """``EagerStep``'s call. A batch's first step, which projects the cross-attention keys and
        values and allocates the buffers, runs eagerly; a shortlist's projection
        (``RestrictedProjection.tensors()``) runs in the graph, with its log-softmax. A packed int8
        model's (``quantize_int8_packed``) graph gives the decoder's features, and its projection
        (the whole one, or a shortlist's packed rows, which no graph takes) runs here, as in
        ``EagerStep``: in its graph, projection and log-softmax were slower, with the same outputs
        (docs/benchmarks.md, "The packed int8 compiled step")."""
        if cache.length == 0:
            return EagerStep()(model, token, memory, src_pad, cache, at_max, projection)
        if isinstance(model.output_proj, PackedInt8Linear):  # the graph gives features: project them here
            candidates = None
            outside = projection if projection is not None else functools.partial(_whole_projection, model)
        else:
            candidates, outside = projection.tensors() if projection is not None else None, None
        keys, values, cross_keys, cross_values = cache.tensors()
        rows_at_max = at_max  # None while no row is at its maximum: nothing to mask after the graph
        if at_max is None:  # one graph for both: no row at its maximum length yet
            at_max = torch.zeros(token.size(0), dtype=torch.bool, device=token.device)
        if not all(t.is_contiguous() for t in (*keys, *values, *cross_keys, *cross_values)):
            # the package's kernels assume contiguous buffers
            args = (model, token, memory, src_pad, keys, values, cross_keys, cross_values, cache.length, at_max)
            out = _candidates_step(*args, candidates) if candidates else _decoder_step(*args, outside is None)
        else:
            beams = token.size(0) // memory.size(0)
            kind = f"candidates {len(candidates)}" if candidates else outside is None
            run = self._runner(model, kind, beams,
                               (token, memory, cross_keys[0], keys[0], *([candidates] if candidates else [])))
            filled = torch.empty(cache.length + 1, dtype=torch.uint8, device=token.device)
            # the package's kernels assume its example's contiguous layouts (the token is a column of
            # the search's token matrix, a strided view)
            token, memory, src_pad, at_max = (t.contiguous() for t in (token, memory, src_pad, at_max))
            extra = ([t.contiguous() for t in candidates],) if candidates else ()
            out = run(token, memory, src_pad, filled, at_max, keys, values, cross_keys, cross_values, *extra)
        cache.advance()  # the step wrote the next position of every buffer
        if outside is not None:
            out = forbid_specials(F.log_softmax(outside(out).float(), dim=-1), rows_at_max)
        return out
