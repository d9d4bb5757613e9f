"""One training update and what it needs: the optimizer, the gradient norm, the dropout seed
(torch.compile of the forward pass is ``compiling.compile_forward``). ``train_step`` has no
outer state: the loop in ``commands/train.py`` calls it once per update.

    forward/backward over update_freq micro-batches (DDP syncs gradients on the last only),
    loss summed over target tokens and divided by the token count of the whole update,
    grad norm (and clipping), optimizer step with the scheduled learning rate.

Private torch APIs used here, checked with torch 2.4-2.13 (the GPU machine has 2.11), each with
its fallback: ``GradScaler._get_scale_async`` (fp16 only: the scale without a host sync; no
fallback needed on 2.4+), ``Optimizer._step_supports_amp_scaling`` and ``found_inf`` (the fused
Adam(W) skip flag; without it: one read of the norm per update), ``torch.nn.utils.get_total_norm``
(public from 2.6; before it: clip_grad_norm_ with an infinite bound).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from typing import Optional

import numpy as np
import torch

from ..model.transformer import Transformer
from ..settings.options import TrainOptions
from .loss import fused_output_loss


def make_optimizer(model: torch.nn.Module, o: TrainOptions) -> torch.optim.Optimizer:
    """Adam, or AdamW (decoupled weight decay, as fairseq's "adam"), with the fused kernel (one
    kernel per tensor: faster than foreach on CPU (docs/benchmarks.md), and far less sensitive to other jobs on the
    cores); the foreach one where fused is unavailable."""
    cls = torch.optim.AdamW if o.optimizer == "adamw" else torch.optim.Adam
    kwargs = dict(lr=0.0, betas=tuple(o.adam_betas), eps=o.adam_eps, weight_decay=o.weight_decay)
    try:
        return cls(model.parameters(), fused=True, **kwargs)
    except (RuntimeError, ValueError):
        return cls(model.parameters(), foreach=True, **kwargs)


def dropout_seed(seed: int, epoch: int, batch_offset: int, rank: int) -> int:
    """The seed of an update's dropout masks: a function of where it is in the data and of the
    rank, so a resumed run draws the same masks as an uninterrupted one, and ranks differ."""
    return int(np.random.SeedSequence([seed, epoch, batch_offset, rank]).generate_state(1)[0])


@dataclasses.dataclass(frozen=True)
class Step:
    """What an update leaves behind for the log: tensors on the device, so that an update never
    waits for the device; they are read at log intervals (``Meter``, ``settle``)."""

    loss_sums: torch.Tensor  # (2,) float64: label-smoothed loss and nll summed over tokens
    gnorm: torch.Tensor  # () gradient norm before clipping (inf or nan: the step was skipped)
    finite: torch.Tensor  # () bool: the optimizer step was taken
    scale: Optional[torch.Tensor]  # () the fp16 loss scale the update ran with (None without fp16)
    next_scale: Optional[torch.Tensor]  # () the scale after the update (lowered after an overflow)


def train_step(
    model: Transformer,
    forward: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    micro: list[dict],
    *,
    grad_scale: float,
    lr: float,
    autocast: contextlib.AbstractContextManager,
    label_smoothing: float,
    clip_norm: float,
) -> Step:
    """One update: forward/backward over this rank's micro-batches, then the optimizer step.

    ``forward`` runs the model: ``model`` itself, or DDP around it, which all-reduces gradients
    during the backward of the last micro-batch only. ``grad_scale`` divides the summed loss by
    the target tokens of the whole update (all micro-batches, all ranks), times the world size
    (DDP averages over ranks).
    """
    for group in optimizer.param_groups:
        group["lr"] = lr
    device = model.output_proj.weight.device
    # The loss is a sum over target tokens; scaling it by grad_scale makes the gradient the
    # per-token mean of the update, as if it were one big batch, not a mean of batch means.
    # (Scaling the loss before backward equals scaling the gradients after it, and keeps fp16
    # gradients in range.)
    loss_sums = torch.zeros(2, dtype=torch.float64, device=device)
    no_sync = getattr(forward, "no_sync", None)
    for i, batch in enumerate(micro):
        last_micro = i == len(micro) - 1
        with contextlib.nullcontext() if last_micro or no_sync is None else no_sync():
            with autocast:
                features = forward(batch["src"].to(device, non_blocking=True),
                                   batch["prev_output"].to(device, non_blocking=True), features_only=True)
                loss, nll = fused_output_loss(features, model.output_proj.weight,
                                              batch["target"].to(device, non_blocking=True), label_smoothing,
                                              rows=batch["target_rows"].to(device, non_blocking=True),
                                              bias=model.output_bias)
            scaler.scale(loss * grad_scale).backward()
        loss_sums += torch.stack([loss.detach().double(), nll.double()])
        del features, loss, nll

    # -- optimizer step, skipped on a non-finite gradient (fp16: an overflow) --------------------
    # Decided on the device, without reading anything back: the fused optimizer skips its step
    # when ``found_inf`` is set (the flag GradScaler itself hands it).
    if scaler.is_enabled():
        scaler.unscale_(optimizer)
    gnorm = gradient_norm(model, clip_norm)
    finite = torch.isfinite(gnorm)  # the same on every rank: gradients are synced
    scale = next_scale = None
    if scaler.is_enabled():
        scale = scaler._get_scale_async().clone()
        scaler.step(optimizer)  # skips the step when it found inf/nan gradients
        scaler.update()  # and then lowers the scale
        next_scale = scaler._get_scale_async().clone()
    elif getattr(optimizer, "_step_supports_amp_scaling", False):  # fused Adam(W)
        optimizer.found_inf = (~finite).float()
        optimizer.step()
        del optimizer.found_inf
    elif finite.item():  # an optimizer without the flag: one read of the norm per update
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return Step(loss_sums, gnorm, finite, scale, next_scale)


def gradient_norm(model: torch.nn.Module, clip_norm: float) -> torch.Tensor:
    """The norm of all gradients (a tensor on the device); with ``clip_norm`` they are scaled down
    to it. Without clipping the gradients are left alone (no pass multiplying them by 1)."""
    if clip_norm:
        return torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
    total_norm = getattr(torch.nn.utils, "get_total_norm", None)  # torch >= 2.6
    if total_norm is None:
        return torch.nn.utils.clip_grad_norm_(model.parameters(), math.inf)
    return total_norm([p.grad for p in model.parameters() if p.grad is not None])
