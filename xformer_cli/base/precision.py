"""Which precision training runs in: ``--precision auto`` (the default) picks bf16 autocast where
the hardware multiplies bf16 natively, fp32 elsewhere, decided at start-up from what it finds.

The rule: bf16 where the CPU has bf16 instructions (faster than fp32 there), never where it emulates
them (far slower than fp32); figures in docs/benchmarks.md. Hence the choice is made per machine,
never assumed.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Optional

import torch

from .errors import ConfigError

# CPU flags (Linux /proc/cpuinfo) of native bf16 matrix instructions: AVX512-BF16 and AMX.
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_flags(cpuinfo: str | None = None) -> set[str]:
    """This CPU's instruction-set flags (the first "flags" line of /proc/cpuinfo); empty where
    there is none (not Linux)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return set()
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def cpu_vendor(cpuinfo: str | None = None) -> str:
    """This CPU's vendor_id (GenuineIntel, AuthenticAMD, ...); "" where /proc/cpuinfo has none."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return ""
    return next((line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if line.startswith("vendor_id")), "")


def cpu_bf16_instructions(cpuinfo: str | None = None) -> list[str]:
    """The native bf16 matrix instruction sets of this CPU, by their /proc/cpuinfo flag names;
    empty where there are none, or where /proc/cpuinfo does not exist (not Linux)."""
    flags = cpu_flags(cpuinfo)
    return [f for f in BF16_CPU_FLAGS if f in flags]


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


# One policy for xf train, xf translate and both engines: each engine says what it computes in on
# its device (its real capabilities: a precision, native or emulated), and resolve_precision
# applies the same rules to that.
CT2_TYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "int8": "int8"}
ENGINE_NAMES = {"xf": "the xf engine", "ctranslate2": "the CTranslate2 engine"}
NATIVE, EMULATED = "native", "emulated"


def xf_precisions(device: torch.device, bf16_native: Optional[bool] = None) -> dict[str, str]:
    """What xf (torch) computes in on ``device``, each native or emulated: fp32; bf16, native where
    the hardware multiplies it (CUDA sm_80+, avx512_bf16 or AMX), else emulated and far slower than
    fp32 (docs/benchmarks.md); fp16 on CUDA only; int8 (dynamic int8 linear layers, torch.ao) on
    CPU only. bf16_native: whether the device multiplies bf16 natively (None: asked here)."""
    if device.type == "cuda":
        bf16 = cuda_has_bf16(device) if bf16_native is None else bf16_native
        return {"fp32": NATIVE, "fp16": NATIVE, "bf16": NATIVE if bf16 else EMULATED}
    bf16 = bool(cpu_bf16_instructions()) if bf16_native is None else bf16_native
    return {"fp32": NATIVE, "int8": NATIVE, "bf16": NATIVE if bf16 else EMULATED}


def ct2_precisions(compute_types: set[str]) -> dict[str, str]:
    """What the CTranslate2 engine computes in, from ``ctranslate2.get_supported_compute_types``
    of its device: on CPU float32 and int8 (int16 on some builds, unused), never bfloat16 or
    float16, whatever bf16 instructions the CPU has."""
    return {CT2_TYPES[t]: NATIVE for t in compute_types if t in CT2_TYPES}


def resolve_precision(device: torch.device, precision: str, quantize: str = "none",
                      available: dict[str, str] | None = None, engine: str = "xf") -> str:
    """The precision a command runs in, by one policy for xf train, xf translate and both
    engines, from what the engine computes in on this device (``available``:
    ``xf_precisions(device)`` unless given; ``engine``: --engine): ``auto`` is bf16 where bf16 is
    native, else fp32; a named precision runs if the engine has it (emulated bf16 with
    ``precision_warning``'s warning), else is refused; ``--quantize int8`` runs its int8 layers
    with fp32 around them, where the engine has int8."""
    available = xf_precisions(device) if available is None else available
    where = f"{ENGINE_NAMES[engine]} on {'CUDA' if device.type == 'cuda' else 'a CPU'}"
    if quantize == "int8":
        if "int8" not in available:
            raise ConfigError(f"--quantize int8: {where} has no int8 layers (--quantize int8 is for CPUs); "
                              "use --precision")
        if precision not in ("auto", "fp32"):
            raise ConfigError(f"--quantize int8 runs around its int8 layers in fp32, not --precision {precision}")
        return "fp32"
    if precision == "auto":
        return "bf16" if available.get("bf16") == NATIVE else "fp32"
    if precision not in available:
        why = {("xf", "fp16"): "fp16 is for CUDA", ("ctranslate2", "bf16"): "CTranslate2 has no bf16 on CPU",
               ("ctranslate2", "fp16"): "CTranslate2 has no fp16 on CPU"}.get((engine, precision))
        known = ", ".join(p for p in ("fp32", "bf16", "fp16") if p in available)
        raise ConfigError(f"--precision {precision}: {where} computes in {known}"
                          f"{' or int8 (--quantize int8)' if 'int8' in available else ''}, not {precision}"
                          f"{f' ({why})' if why and device.type == 'cpu' else ''}; use auto or one of those")
    return precision


def precision_warning(device: torch.device, precision: str, available: dict[str, str] | None = None) -> Optional[str]:
    """A warning for a precision that runs but runs badly here (``available``: as resolve_precision's), or None."""
    available = xf_precisions(device) if available is None else available
    if available.get(precision) == EMULATED and device.type == "cpu":
        return ("this CPU has no native bf16 matrix instructions (avx512_bf16/AMX): bf16 runs emulated, "
                "far slower than fp32 here")
    return None


def ct2_compute_type(precision: str, quantize: str) -> str:
    """CTranslate2's compute_type for a precision that ``resolve_precision`` chose."""
    return "int8" if quantize == "int8" else {v: k for k, v in CT2_TYPES.items()}[precision]
