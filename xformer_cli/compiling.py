"""torch.compile of a training forward pass: one graph for every batch shape.

Used by ``xf train --compile`` and by bench/bench_train.py for the torch.nn.Transformer reference,
so that both are compiled the same way and count their graphs the same way.

Why the inputs' sizes are marked dynamic, not only ``dynamic=True``: with ``dynamic=True`` alone,
dynamo "duck sizes" the first call's inputs, giving equal sizes one symbol. A first batch with as
many source as target positions (S == T) then compiles a graph that assumes S == T, and the first
batch with S != T recompiles forward and backward (seen on the CPU with TORCH_LOGS=recompiles:
two graphs; in a benchmark, a recompilation inside the timed updates). A size marked dynamic gets
a symbol of its own.

Version-sensitive torch APIs (CI runs torch 2.13; the GPU machine 2.11):
- ``torch._dynamo.maybe_mark_dynamic`` (torch >= 2.3; unlike ``mark_dynamic`` it does not raise
  when a size turns out to be specialized, such as a batch of one sentence): falls back to
  ``mark_dynamic``, which every torch 2.x has.
- ``torch._dynamo.utils.counters["stats"]["unique_graphs"]``: an internal counter, there in every
  torch 2.x; ``compiled_graphs`` reads it with defaults, so a rename reads 0, never raises.
"""

from __future__ import annotations

import torch

COMPILE_BACKEND = "inductor"  # tests use "aot_eager": the same graphs, without minutes of code generation


def mark_dynamic(*tensors: torch.Tensor) -> None:
    """Give every dimension of every tensor a symbolic size of its own (no duck sizing)."""
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


def compile_forward(forward: torch.nn.Module, backend: str | None = None) -> DynamicInputs:
    """torch.compile of the training forward pass (the model, or DDP around it, whose buckets
    dynamo splits the graph at). Dynamic shapes: batches of every (B, S, T) share one compiled
    graph instead of one per shape. Validation and search run the uncompiled model, and xf's output
    projection with the loss (loss.fused_output_loss, a custom autograd function) stays eager."""
    return DynamicInputs(torch.compile(forward, backend=backend or COMPILE_BACKEND, dynamic=True))


def compiled_graphs() -> int:
    """How many graphs torch.compile has made in this process (recompilations included)."""
    from torch._dynamo.utils import counters

    return int(counters.get("stats", {}).get("unique_graphs", 0))
