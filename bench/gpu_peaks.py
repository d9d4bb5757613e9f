"""The denominator of MFU: the datasheet's dense peak of the GPU, as PaLM (Appendix B) defines
MFU, not what one product reached here (a measured peak is the ceiling of one F.linear shape, and
MFU against it overstates how much of the chip is used). The measured peak is reported beside it.
Where no datasheet peak is known (CPUs, other GPUs, fp32), MFU is against the measured peak, and
the note says so."""

from __future__ import annotations

import torch

# Dense (no 2:4 sparsity) bf16/fp16 tensor-core TFLOP/s by NVIDIA's datasheets, keyed by the name
# torch.cuda.get_device_name gives: the H100 SXM5 and the H200 SXM share the H100's tensor cores.
DENSE_HALF_TFLOPS = {
    "NVIDIA H100 80GB HBM3": 989.4,  # H100 SXM5
    "NVIDIA H200": 989.4,  # H200 SXM (the NVL part is named "NVIDIA H200 NVL", and slower)
    "NVIDIA A100-SXM4-80GB": 312.0,
    "NVIDIA A100-SXM4-40GB": 312.0,
}


def mfu_peak(measured: float, device: torch.device, precision: str) -> tuple[float, str]:
    """(FLOP/s to divide by, a note saying which peak it is) for a run in ``precision``."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else ""
    datasheet = DENSE_HALF_TFLOPS.get(name) if precision in ("bf16", "fp16") else None
    here = f"{precision} matmul peak measured here {measured / 1e12:.3g} TFLOP/s"
    if datasheet is None:
        what = name or "this CPU"
        return measured, f"MFU against the {here} (no datasheet {precision} peak known for {what})"
    return datasheet * 1e12, (f"MFU against the datasheet's dense {precision} peak of the {name}, {datasheet:g} "
                              f"TFLOP/s; {here} ({100 * measured / (datasheet * 1e12):.0f}% of it)")
