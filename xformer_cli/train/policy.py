"""What xf train does, as pure functions of where training stands: log? validate? which
checkpoints to write? stop, and why? Every stop rule is here; the loop in commands/train.py
acts on what these functions decide. Before an update it asks ``stop_before_update`` (a signal);
after it, ``plan_update``, then validates when the plan says so and asks
``plan_after_validation`` (patience, the best checkpoint); ``diverged`` says when skipped
updates end the run, ``nothing_to_do`` when a finished run is started again, and
``regularization`` the dropout and label smoothing of an update (--late-after).

The rules: a log line every --log-interval updates; validation every
--validate-interval-updates, at each epoch end and at every stop; a numbered checkpoint
(checkpoint_<epoch>_<update>.pt) every --save-interval-updates, at each epoch end and at every
stop but a signal's (so that averaging sees the final weights), checkpoint_best.pt when
validation improves, and checkpoint_last.pt with each of them and every --save-interval-minutes.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

from ..base.checkpoint_names import numbered_name
from ..settings.options import TrainOptions


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


def regularization(o: TrainOptions, update: int, dropout: float) -> tuple[float, float]:
    """(P_drop, label smoothing epsilon) of update number ``update`` (counting from 1): the
    --late-* values once --late-after updates are done, else the model's ``dropout`` (--dropout
    or the --arch preset's) and --label-smoothing."""
    if o.late_after and update > o.late_after:
        return (dropout if o.late_dropout is None else o.late_dropout,
                o.label_smoothing if o.late_label_smoothing is None else o.late_label_smoothing)
    return dropout, o.label_smoothing


def plan_update(o: TrainOptions, s: AfterUpdate) -> Plan:
    """Log? validate? which checkpoints? stop, and why? Decided before validation; validation at
    each epoch end and at every stop, a numbered checkpoint at every stop too (so that averaging
    sees the final weights)."""
    stop = limit_reached(o, s.num_updates, s.epoch if s.end_of_epoch else s.epoch - 1, s.out_of_time)
    validate = s.end_of_epoch or stop is not None or every(s.num_updates, o.validate_interval_updates)
    numbered = s.end_of_epoch or stop is not None or every(s.num_updates, o.save_interval_updates)
    checkpoints = (numbered_name(s.epoch, s.num_updates),) if numbered else ()
    periodic = bool(o.save_interval_minutes) and s.seconds_since_save >= 60 * o.save_interval_minutes
    return Plan(log=every(s.num_updates, o.log_interval), validate=validate, checkpoints=checkpoints,
                save=numbered or validate or periodic, stop=stop)


def limit_reached(o: TrainOptions, num_updates: int, epochs_done: int, out_of_time: bool) -> Optional[str]:
    """The limit of --max-update, --max-epoch or --stop-time-hours that training has reached, or
    None: the one rule for stopping in a run and for refusing to start a finished one."""
    if o.max_update and num_updates >= o.max_update:
        return f"reached --max-update {o.max_update}"
    if o.max_epoch and epochs_done >= o.max_epoch:
        return f"reached --max-epoch {o.max_epoch}"
    if out_of_time:
        return f"reached --stop-time-hours {o.stop_time_hours:g}"
    return None


def nothing_to_do(o: TrainOptions, num_updates: int, epoch: int, elapsed_seconds: float) -> Optional[str]:
    """The limit a resumed run (at update ``num_updates``, in ``epoch``, after ``elapsed_seconds``
    of training) has already reached, or None: then there is nothing to train."""
    out_of_time = bool(o.stop_time_hours) and elapsed_seconds >= 3600.0 * o.stop_time_hours
    return limit_reached(o, num_updates, epoch - 1, out_of_time)


def stop_before_update(signalled: bool) -> Optional[str]:
    """A SIGINT or SIGTERM on any rank stops training before the next update (the update under
    way when it came is finished and saved)."""
    return "signal" if signalled else None


def diverged(o: TrainOptions, skipped_in_a_row: int) -> bool:
    """--max-nan-updates skipped (non-finite) updates in a row end the run as diverged."""
    return skipped_in_a_row >= o.max_nan_updates


def score_validation(score: float, best: Optional[float], bad_validations: int,
                     higher_is_better: bool, epsilon: float = 0.0) -> tuple[bool, Optional[float], int]:
    """(improved, best score, validations since the last improvement) after a validation.

    An improvement smaller than ``epsilon`` (--patience-epsilon) is still the new best (and
    checkpoint_best.pt), but counts for --patience as none: a run whose validations each gain
    less than epsilon stops as if it had stalled."""
    if not improves(score, best, higher_is_better):
        return False, best, bad_validations + 1
    gain = math.inf if best is None else abs(score - best)
    return True, score, 0 if gain > epsilon else bad_validations + 1


def plan_after_validation(o: TrainOptions, plan: Plan, s: AfterUpdate, improved: bool,
                          bad_validations: int) -> Plan:
    """The plan once validation has spoken: checkpoint_best.pt when the score improved, and the
    --patience stop, which writes a numbered checkpoint like every other stop."""
    checkpoints, stop = plan.checkpoints, plan.stop
    if o.patience and bad_validations >= o.patience:
        stop = f"no improvement in {o.patience} validations (--patience)" if not o.patience_epsilon else (
            f"no improvement above {o.patience_epsilon:g} in {o.patience} validations (--patience, --patience-epsilon)")
        if not checkpoints:
            checkpoints = (numbered_name(s.epoch, s.num_updates),)
    if improved:
        checkpoints += ("checkpoint_best.pt",)
    return dataclasses.replace(plan, checkpoints=checkpoints, stop=stop)


def improves(score: float, best: Optional[float], higher_is_better: bool) -> bool:
    """Whether a validation score beats the best so far (BLEU: higher; loss: lower)."""
    return best is None or (score > best if higher_is_better else score < best)
