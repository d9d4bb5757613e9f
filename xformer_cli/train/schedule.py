"""Learning-rate schedules as pure functions of the update number (1-based: the update being made).

``noam`` is the paper's formula (Sec. 5.3) verbatim; ``inverse_sqrt`` is fairseq's form of the
same shape with an explicit peak learning rate, which is how most later recipes state it.
"""

from __future__ import annotations

import math
from typing import Callable


def noam(step: int, d_model: int, warmup: int, factor: float = 1.0) -> float:
    """lrate = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), times ``factor`` (paper: 1).

    Rises linearly for ``warmup`` steps, then decays with 1/sqrt(step); the peak, at step ==
    warmup, is (d_model * warmup)^-0.5: 6.988e-4 for d_model 512 and warmup 4000.
    """
    step = max(step, 1)  # step 0 would divide by zero; the first update is step 1
    return factor * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


def inverse_sqrt(step: int, peak: float, warmup: int, init: float = 0.0) -> float:
    """fairseq's inverse_sqrt: linear from ``init`` to ``peak`` over ``warmup`` steps, then
    peak * sqrt(warmup / step). With peak = (d_model * warmup)^-0.5 and init 0 it equals noam."""
    if warmup > 0 and step < warmup:
        return init + (peak - init) * step / warmup
    return peak * math.sqrt(max(warmup, 1) / max(step, 1))


def make_schedule(scheduler: str, d_model: int, warmup: int, lr: float | None, init: float) -> Callable[[int], float]:
    """The learning rate of each update (1-based) for the options of ``xf train``, chosen once.

    noam: ``lr`` (default 1) multiplies the paper's formula (xf train's --lr-factor);
    inverse_sqrt: ``lr`` is the peak (xf train's --lr).
    """
    if scheduler == "noam":
        factor = 1.0 if lr is None else lr
        return lambda step: noam(step, d_model, warmup, factor)
    if scheduler == "inverse_sqrt":
        if lr is None:
            raise ValueError("inverse_sqrt needs a peak learning rate (--lr)")
        return lambda step: inverse_sqrt(step, lr, warmup, init)
    raise ValueError(f"unknown lr scheduler {scheduler!r}")
