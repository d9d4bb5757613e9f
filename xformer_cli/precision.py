"""Which precision training runs in: ``--precision auto`` (the default) picks bf16 autocast where
the hardware multiplies bf16 natively, fp32 elsewhere, decided at start-up from what it finds.

Measured (issue 10): on a 2-core AVX-512 CPU with avx512_bf16, bf16 autocast trained the `small`
model 1.35-1.39x faster than fp32; on an AVX2-only CPU (no bf16 instructions, so oneDNN emulates them)
bf16 is about 0.03x fp32. Hence the choice is made per machine, never assumed.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Optional

import torch

from .errors import ConfigError

# CPU flags (Linux /proc/cpuinfo) of native bf16 matrix instructions: AVX512-BF16 (Cooper Lake,
# Zen 4 and later) and AMX (Sapphire Rapids and later).
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_bf16_instructions(cpuinfo: str | None = None) -> list[str]:
    """The native bf16 matrix instruction sets of this CPU, by their /proc/cpuinfo flag names;
    empty where there are none, or where /proc/cpuinfo does not exist (not Linux)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return []
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            return [f for f in BF16_CPU_FLAGS if f in flags]
    return []


def cuda_has_bf16(device: torch.device) -> bool:
    """bf16 tensor cores: compute capability 8.0 (Ampere) and later (not an emulation)."""
    return torch.cuda.get_device_capability(device) >= (8, 0)


def hardware_note(device: torch.device) -> str:
    """What the precision choice was based on, for the start-up table."""
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        bf16 = "bf16 tensor cores" if cuda_has_bf16(device) else "no bf16 tensor cores"
        return f"{torch.cuda.get_device_name(device)}, sm_{major}{minor}: {bf16}"
    found = cpu_bf16_instructions()
    return f"CPU with {' and '.join(found)}" if found else "CPU without bf16 instructions (avx512_bf16/amx_bf16)"


def autocast_context(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    """bf16 or fp16 autocast (matmuls in half precision, reductions and the loss in float32)."""
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device.type, dtype=dtype)


def resolve_precision(device: torch.device, precision: str, quantize: str = "none") -> str:
    """The precision a command runs in, by one policy for xf train, xf translate and the
    engines: ``auto`` is bf16 where the device multiplies bf16 natively (CUDA sm_80+, CPUs with
    avx512_bf16 or AMX), else fp32; a named precision is kept as asked, except fp16 on a CPU
    (refused: fp16 is for GPUs older than bf16); bf16 on a CPU without bf16 instructions runs,
    emulated and slow (``precision_warning`` says so). ``--quantize int8`` (CPU inference) runs
    its int8 layers with fp32 around them."""
    cpu = device.type == "cpu"
    if quantize == "int8":
        if not cpu:
            raise ConfigError("--quantize int8 is for CPUs (dynamic int8 linear layers); on CUDA use --precision")
        if precision not in ("auto", "fp32"):
            raise ConfigError(f"--quantize int8 runs around its int8 layers in fp32, not --precision {precision}")
        return "fp32"
    if precision == "auto":
        bf16 = bool(cpu_bf16_instructions()) if cpu else cuda_has_bf16(device)
        return "bf16" if bf16 else "fp32"
    if precision == "fp16" and cpu:
        raise ConfigError("--precision fp16 is for CUDA; on a CPU use fp32 (or bf16)")
    return precision


def precision_warning(device: torch.device, precision: str) -> Optional[str]:
    """A warning for a precision that runs but runs badly here, or None."""
    if precision == "bf16" and device.type == "cpu" and not cpu_bf16_instructions():
        return ("this CPU has no native bf16 matrix instructions (avx512_bf16/AMX): bf16 runs emulated, "
                "far slower than fp32 here")
    return None


def ct2_compute_type(device: str, precision: str, quantize: str, native_bf16: bool) -> str:
    """CTranslate2's compute_type for xf's --precision and --quantize (same meanings)."""
    if quantize == "int8":
        if device != "cpu":
            raise ConfigError("--quantize int8 is for CPUs; on CUDA use --precision")
        return "int8"
    if precision == "auto":
        precision = "bf16" if (device == "cuda" or native_bf16) else "fp32"
    return {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}[precision]
