"""Memory that grows with the number of distinct batch shapes, bounded; and the process's resident set.

xf batches are bucketed in two dimensions, so a Multi30k epoch at --max-tokens 4096 has 88
distinct (B, S, T) shapes among its 119 batches, and each makes its own matrix products: an update
of `small` makes 174, of 27-51 distinct (shape, layout) problems (forward, both backward
products, attention's batched products), and three updates share 3 of them. Where bf16 matmuls run through oneDNN (CPUs with avx512_bf16/AMX; on an AVX2-only CPU
torch multiplies bf16 in its own emulating kernel and oneDNN is not used for them), oneDNN
JIT-compiles a primitive for each and keeps it in its primitive cache, keyed by shape, default
capacity 1024 entries, never freed: RSS grows with every new shape until the cache is full, while
fp32 matmuls go to MKL and stay flat (docs/benchmarks.md, "Memory in bf16").

An epoch so asks for some 4,000 distinct primitives, each shape once an epoch in a shuffled
order: 1024 entries hold about 20 updates' worth, so lookups across updates miss anyway; what
hits is within one update (the layers of a stack share their shapes), which needs about 50. ``ONEDNN_CACHE_CAPACITY`` keeps that and
bounds the rest. oneDNN reads ONEDNN_PRIMITIVE_CACHE_CAPACITY when it creates its first
primitive, so ``bound_native_memory`` must run before the first matmul of the process; a value
the user exported wins.
"""

from __future__ import annotations

import os
from pathlib import Path

# Over twice one update's distinct products (at most 51 measured): the layers' shared shapes stay cached.
ONEDNN_CACHE_CAPACITY = 128
ONEDNN_CACHE_VARIABLE = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"


def bound_native_memory() -> int:
    """Bound oneDNN's primitive cache (a value already in the environment is kept); returns
    the capacity in effect. Call it before the process's first matmul."""
    os.environ.setdefault(ONEDNN_CACHE_VARIABLE, str(ONEDNN_CACHE_CAPACITY))
    return int(os.environ[ONEDNN_CACHE_VARIABLE])


def resident_mib(pid: int | str = "self") -> dict[str, float]:
    """VmRSS (resident now) and VmHWM (the peak) of a process, in MiB; empty where /proc is absent."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return {}
    return {line.split(":")[0]: int(line.split()[1]) / 1024 for line in lines if line.startswith(("VmRSS:", "VmHWM:"))}
