"""torch.compile helpers shared by training (``compile_forward``, as xf train --compile uses it) and search
(``search.CompiledStep``): the backend, dynamic shapes for every input dimension, and the count
of compiled graphs.

Private torch APIs used here, checked with torch 2.4-2.13, each with its fallback:
``torch._dynamo.maybe_mark_dynamic`` (from 2.3; before it: ``mark_dynamic``), dynamo's
``counters["stats"]["unique_graphs"]`` (the compiled-graph count; 0 where absent).
"""

from __future__ import annotations

from typing import Optional

import torch

COMPILE_BACKEND = "inductor"  # tests use "aot_eager": the same graphs, without minutes of code generation


def mark_dynamic(*tensors: torch.Tensor) -> None:
    """Give every dimension of every tensor a symbolic size of its own. ``dynamic=True`` alone
    "duck sizes" the first call: equal sizes share one symbol, so a first batch with as many source
    as target positions (S == T) makes a graph that assumes S == T, and the first batch with
    S != T recompiles forward and backward (seen with TORCH_LOGS=recompiles: two graphs).
    ``torch._dynamo.maybe_mark_dynamic`` (torch >= 2.3; unlike ``mark_dynamic`` it does not raise
    when a size gets specialized, as a batch of one sentence does) falls back to ``mark_dynamic``."""
    mark = getattr(torch._dynamo, "maybe_mark_dynamic", None) or torch._dynamo.mark_dynamic
    for t in tensors:
        for dim in range(t.dim()):
            mark(t, dim)


class DynamicInputs:
    """A compiled module whose tensor arguments are marked dynamic before each call. Attribute
    reads go to the compiled module (and through it to the module itself: DDP's ``no_sync``)."""

    def __init__(self, compiled: torch.nn.Module):
        self.compiled = compiled

    def __call__(self, *args, **kwargs):
        mark_dynamic(*(a for a in args if torch.is_tensor(a)))
        return self.compiled(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.compiled, name)


def compile_forward(forward: torch.nn.Module, backend: Optional[str] = None) -> DynamicInputs:
    """torch.compile of the training forward pass (the model, or DDP around it, whose buckets
    dynamo splits the graph at; bench/bench_train.py compiles its torch.nn.Transformer reference
    with it too). Dynamic shapes, inputs marked dynamic: batches of every (B, S, T) share one
    compiled graph instead of one per shape. Validation and search run the uncompiled model, and
    the output projection with the loss (loss.fused_output_loss, a custom autograd function)
    stays eager."""
    return DynamicInputs(torch.compile(forward, backend=backend or COMPILE_BACKEND, dynamic=True))


def compiled_graphs() -> int:
    """How many graphs torch.compile has made in this process (recompilations included)."""
    try:
        from torch._dynamo.utils import counters
    except ImportError:  # pragma: no cover - a torch without dynamo
        return 0
    return int(counters["stats"].get("unique_graphs", 0))
