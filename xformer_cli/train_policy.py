"""What xf train does after each update, as pure functions of where training stands: log?
validate? which checkpoints to write? stop, and why? The loop in train.py asks ``plan_update``
after every update, validates when the plan says so, and then asks ``plan_after_validation``.

The rules: a log line every --log-interval updates; validation every
--validate-interval-updates, at each epoch end and at every stop; a numbered checkpoint
(checkpoint_<epoch>_<update>.pt) every --save-interval-updates, at each epoch end and at every
stop but a signal's (so that averaging sees the final weights), checkpoint_best.pt when
validation improves, and checkpoint_last.pt with each of them and every --save-interval-minutes.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from .checkpoint import numbered_name
from .options import TrainOptions


@dataclasses.dataclass(frozen=True)
class AfterUpdate:
    """All that the policy looks at after an update."""

    epoch: int  # the epoch the update belongs to
    num_updates: int  # counting this update
    end_of_epoch: bool  # the update took the epoch's last batches
    out_of_time: bool  # --stop-time-hours is spent (rank 0's clock decides for all ranks)
    seconds_since_save: float  # since checkpoint_last.pt was last written


@dataclasses.dataclass(frozen=True)
class Plan:
    """What to do after an update. When ``save``, checkpoint_last.pt is written, and the files
    of ``checkpoints`` with it (the same contents)."""

    log: bool
    validate: bool
    checkpoints: tuple[str, ...]
    save: bool
    stop: Optional[str]  # why training stops after this update; None: it goes on


def every(num_updates: int, interval: int) -> bool:
    """True every ``interval`` updates (never when the interval is 0: off)."""
    return bool(interval) and num_updates % interval == 0


def plan_update(o: TrainOptions, s: AfterUpdate) -> Plan:
    """Log? validate? which checkpoints? stop, and why? Decided before validation; validation at
    each epoch end and at every stop, a numbered checkpoint at every stop too (so that averaging
    sees the final weights)."""
    stop = None
    if o.max_update and s.num_updates >= o.max_update:
        stop = f"reached --max-update {o.max_update}"
    elif s.end_of_epoch and o.max_epoch and s.epoch >= o.max_epoch:
        stop = f"reached --max-epoch {o.max_epoch}"
    elif s.out_of_time:
        stop = f"reached --stop-time-hours {o.stop_time_hours:g}"
    validate = s.end_of_epoch or stop is not None or every(s.num_updates, o.validate_interval_updates)
    numbered = s.end_of_epoch or stop is not None or every(s.num_updates, o.save_interval_updates)
    checkpoints = (numbered_name(s.epoch, s.num_updates),) if numbered else ()
    periodic = bool(o.save_interval_minutes) and s.seconds_since_save >= 60 * o.save_interval_minutes
    return Plan(log=every(s.num_updates, o.log_interval), validate=validate, checkpoints=checkpoints,
                save=numbered or validate or periodic, stop=stop)


def plan_after_validation(o: TrainOptions, plan: Plan, s: AfterUpdate, improved: bool,
                          bad_validations: int) -> Plan:
    """The plan once validation has spoken: checkpoint_best.pt when the score improved, and the
    --patience stop, which writes a numbered checkpoint like every other stop."""
    checkpoints, stop = plan.checkpoints, plan.stop
    if o.patience and bad_validations >= o.patience:
        stop = f"no improvement in {o.patience} validations (--patience)"
        if not checkpoints:
            checkpoints = (numbered_name(s.epoch, s.num_updates),)
    if improved:
        checkpoints += ("checkpoint_best.pt",)
    return dataclasses.replace(plan, checkpoints=checkpoints, stop=stop)


def improves(score: float, best: Optional[float], higher_is_better: bool) -> bool:
    """Whether a validation score beats the best so far (BLEU: higher; loss: lower)."""
    return best is None or (score > best if higher_is_better else score < best)
