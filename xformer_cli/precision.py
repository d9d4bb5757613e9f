"""Which precision training runs in: ``--precision auto`` (the default) picks bf16 autocast where
the hardware multiplies bf16 natively, fp32 elsewhere, decided at start-up from what it finds.

Measured (issue 10): on a 2-core AVX-512 CPU with avx512_bf16, bf16 autocast trained the `small`
model 1.35-1.39x faster than fp32; on an AVX2-only CPU (no bf16 instructions, so oneDNN emulates them)
bf16 is about 0.03x fp32. Hence the choice is made per machine, never assumed.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch

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


def choose_precision(option: str, device: torch.device) -> str:
    """The precision to train in: ``option`` itself, or for ``auto`` bf16 where the device has
    native bf16 matrix instructions, else fp32. fp16 (with loss scaling) is never chosen: it is
    for GPUs older than bf16, and asked for by name."""
    if option != "auto":
        return option
    if device.type == "cuda":
        return "bf16" if cuda_has_bf16(device) else "fp32"
    return "bf16" if cpu_bf16_instructions() else "fp32"


def autocast_context(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    """bf16 or fp16 autocast (matmuls in half precision, reductions and the loss in float32)."""
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device.type, dtype=dtype)
