"""The tests marked ``kernels`` (int8, bf16, compiled graphs: results that rest on the CPU's own
kernels) once more with every instruction-set cap the libraries honour set to AVX2, so that a
tolerance that only this machine's AVX-512 (or another's AMX) kernels meet fails in ``make test``
here, not on a user's AVX2 machine. The caps are read when the libraries load, before torch is
imported, hence a subprocess:

- ``ATEN_CPU_CAPABILITY=avx2``: torch's own vectorized CPU kernels (softmax, LayerNorm, the
  loss, Adam) and inductor's generated code;
- ``ONEDNN_MAX_CPU_ISA=AVX2``: oneDNN, which runs bf16 products and ``--int8-engine onednn``;
- ``FBGEMM_ENABLE_INSTRUCTIONS=AVX2``: fbgemm, the default int8 engine (it takes AVX2, AVX512,
  AVX512_E1 for VNNI; there is no AMX path to cap);
- ``MKL_ENABLE_INSTRUCTIONS=AVX2``: MKL's fp32 products, set for completeness but not checked
  here: MKL_VERBOSE does not name the instruction set it picked.

The first test proves that the three checked caps take effect; the second runs the marked tests
under them (about a minute and a half on two cores).
"""

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
CAPS = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "FBGEMM_ENABLE_INSTRUCTIONS": "AVX2",
        "MKL_ENABLE_INSTRUCTIONS": "AVX2"}

# Run under the caps: which kernels each library chose. fbgemm says so through arithmetic: its
# AVX2 (and pre-VNNI AVX-512) kernel adds adjacent u8 x s8 products into a saturating int16, VNNI
# and AMX into int32. 64 inputs of 255 (the first 0) against weights of -128 at scale 1: exact,
# -255 * 128 * 63 = -2,056,320; pair-saturated, -32,640 - 31 * 32,768 = -1,048,448.
PROBE = r"""
import json, torch
torch.backends.quantized.engine = "fbgemm"
w = torch.quantize_per_tensor(torch.full((8, 64), -128.0), 1.0, 0, torch.qint8)
x = torch.full((1, 64), 255.0)
x[0, 0] = 0.0
fbgemm = torch.ops.quantized.linear_dynamic(x, torch.ops.quantized.linear_prepack(w, None), reduce_range=False)
torch.backends.quantized.engine = "onednn"  # a oneDNN primitive, so that oneDNN reports its ISA
torch.ops.quantized.linear_dynamic(x, torch.ops.quantized.linear_prepack(w, None), reduce_range=False)
print(json.dumps({"aten": torch.backends.cpu.get_cpu_capability(), "fbgemm": float(fbgemm[0, 0])}))
"""
EXACT, SATURATED = -2_056_320.0, -1_048_448.0

needs_avx2 = pytest.mark.skipif(
    platform.machine().lower() not in ("x86_64", "amd64") or torch.backends.cpu.get_cpu_capability() == "DEFAULT",
    reason="the caps are x86 instruction sets: this CPU has no AVX2 to cap at")


def capped(args: list[str], timeout: float, inductor_cache: Path, **extra) -> subprocess.CompletedProcess:
    """``python args`` under the caps, with an inductor cache of its own (``inductor_cache``): torch
    2.13's FX graph cache keys a graph without the vector ISA inductor picks from
    ATEN_CPU_CAPABILITY, so a capped process that shares the uncapped run's cache
    (/tmp/torchinductor_$USER) takes its generated C++, written for 16 floats a vector (AVX-512),
    and compiles it for AVX2's 8: half of every vector is garbage, the log-probabilities NaN, and
    a search finishes no hypothesis. This is what lost a constrained sentence's translation under
    the caps (the one torch.compile'd search of the capped run then), not the constraints.
    AOTInductor builds skip that cache."""
    env = {**os.environ, **CAPS, "PYTHONPATH": str(REPO), "TORCHINDUCTOR_CACHE_DIR": str(inductor_cache), **extra}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, cwd=REPO, timeout=timeout)


@pytest.mark.slow
@needs_avx2
def test_the_caps_take_effect(tmp_path):
    done = capped(["-W", "ignore", "-c", PROBE], 120, tmp_path / "inductor", ONEDNN_VERBOSE="1")
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    found = json.loads(lines[-1])
    assert found["aten"] == "AVX2"
    assert found["fbgemm"] == SATURATED  # fbgemm's AVX2 kernel ran (on a VNNI CPU uncapped: EXACT)
    isa = [line.split("isa:", 1)[1] for line in lines if ",info,cpu,isa:" in line]
    assert isa == ["Intel AVX2"], lines[:5]


@pytest.mark.kernels
def test_this_process_runs_at_the_capability_it_was_given():
    """Collected by the capped run below too: there, torch's kernels are AVX2 ones."""
    asked = os.environ.get("ATEN_CPU_CAPABILITY")
    if asked:
        assert torch.backends.cpu.get_cpu_capability() == asked.upper()


@pytest.mark.slow
@needs_avx2
def test_kernel_tests_hold_capped_at_avx2(tmp_path):
    done = capped(["-m", "pytest", "-q", "-m", "kernels", "-p", "no:cacheprovider", "-W", "ignore::DeprecationWarning",
                   "tests"], 600, tmp_path / "inductor")
    tail = (done.stdout + done.stderr)[-4000:]
    assert done.returncode == 0, tail
    assert " passed" in tail and " failed" not in tail
