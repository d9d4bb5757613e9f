"""memory.bound_native_memory: oneDNN keeps a bounded number of primitives however many distinct
shapes a run makes (unbounded, bf16 RSS grew 3.1 -> 4.3 GB with the batch shapes on an AMX CPU)."""

import os
import subprocess
import sys

import pytest
from helpers import bench_module

from xformer_cli.base.memory import ONEDNN_CACHE_CAPACITY, ONEDNN_CACHE_VARIABLE, bound_native_memory, resident_mib

# Two passes over SHAPES distinct input lengths. oneDNN makes about four primitives per shape
# (the convolution and its reorders), so a cache of 1024 (oneDNN's default) keeps all of them and
# the second pass only hits; a bounded cache has evicted the first shapes' by then and misses.
# On this project's AVX2 machine bf16 matmuls do not go through oneDNN (torch emulates them), so
# fp32 convolutions, which do, stand in for them: the cache and its bound are the same.
SHAPES = 60
PROGRAM = f"""
import sys
from xformer_cli.base.memory import bound_native_memory
if sys.argv[1] == "bound":
    bound_native_memory()
import torch
torch.set_num_threads(1)
w = torch.randn(16, 16, 3)
for rnd in range(2):
    print("pass", rnd, flush=True)
    for length in range(8, 8 + {SHAPES}):
        torch.nn.functional.conv1d(torch.randn(2, 16, length), w)
"""


def second_pass_creations(mode: str) -> dict[str, int]:
    env = {k: v for k, v in os.environ.items() if k != ONEDNN_CACHE_VARIABLE}
    env["ONEDNN_VERBOSE"] = "all"  # prints create:cache_hit / create:cache_miss per primitive
    out = subprocess.run([sys.executable, "-c", PROGRAM, mode], env=env, capture_output=True, text=True,
                         timeout=600, check=True).stdout
    second = out.split("pass 1", 1)[1]
    return {kind: second.count(f"create:cache_{kind}") for kind in ("hit", "miss")}


@pytest.mark.slow
def test_bounded_cache_evicts_old_shapes_and_still_hits():
    free, bound = second_pass_creations("free"), second_pass_creations("bound")
    if free["hit"] + free["miss"] == 0:
        pytest.skip("this torch's oneDNN does not report its primitive cache (ONEDNN_VERBOSE)")
    assert free["miss"] == 0 and free["hit"] > ONEDNN_CACHE_CAPACITY  # default: every shape kept
    assert bound["miss"] > 0  # bounded: the oldest shapes' primitives were evicted
    assert bound["hit"] > 0  # and the cache still serves what repeats (the weight's reorder)


def test_bound_keeps_a_value_the_user_exported(monkeypatch):
    monkeypatch.setenv(ONEDNN_CACHE_VARIABLE, "7")
    assert bound_native_memory() == 7
    monkeypatch.delenv(ONEDNN_CACHE_VARIABLE)
    assert bound_native_memory() == ONEDNN_CACHE_CAPACITY
    assert os.environ[ONEDNN_CACHE_VARIABLE] == str(ONEDNN_CACHE_CAPACITY)


def test_resident_mib_reads_this_process():
    mem = resident_mib()
    if not mem:
        pytest.skip("no /proc")
    assert 0 < mem["VmRSS"] <= mem["VmHWM"]
    assert resident_mib(2**31) == {}  # no such process


def test_bench_growth_is_the_slope_after_the_first_updates():
    growth_per_1000 = bench_module("bench_scale").growth_per_1000
    flat_then_rising = [(n, 500.0) for n in range(0, 101, 10)] + [(n, 500.0 + 0.02 * n) for n in range(110, 2001, 10)]
    assert abs(growth_per_1000(flat_then_rising, skip=100) - 20.0) < 1e-6  # 0.02 MiB an update
    assert abs(growth_per_1000([(n, 300.0) for n in range(0, 3000, 50)])) < 1e-9  # flat
    assert growth_per_1000([(50, 1.0), (200, 2.0)], skip=100) is None  # one sample after the skip
