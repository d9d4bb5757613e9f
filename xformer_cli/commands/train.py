"""xf train: the paper's training recipe (Sec. 5), on one CPU, one GPU or many under torchrun.

The set-up is the library's (``train.setup.set_up``: data, model, optimizer, what to resume
from, all checked before anything is written). Here, read top to bottom: the start report, the
loop (``train_loop``: for each update, one ``train.update.train_step``, then what ``train.policy``
decides: log? validate? which checkpoints? stop, and why?), and ``train``, the command around
them. The library does the rest: batching
and prefetching (``batching.EpochBatches``, ``Prefetch``), the training state that checkpoints
hold (``train.state.TrainState``), what is shown and logged (``train.log``).

A run resumes by re-running the same command: everything needed to continue exactly where it
stopped is in ``checkpoint_last.pt`` (weights and ``TrainState``), written atomically, so a crash
at any moment loses at most the work since the last save and never a checkpoint.
"""

from __future__ import annotations

import dataclasses
import signal
import time
from pathlib import Path
from typing import Optional

import torch
import yaml

from ..base import distributed
from ..base.compiling import compiled_graphs
from ..base.errors import XfError
from ..base.fileio import atomic_write_text, copy_atomic
from ..base.precision import hardware_note, precision_warning, resolve_precision
from ..base.safety import SaveDirLock
from ..base.signals import StopSignal
from ..data.batching import Prefetch
from ..model.checkpoint import make_checkpoint, remove_old_checkpoints, save_checkpoint
from ..settings.config import absolute_paths
from ..settings.options import TrainOptions
from ..train.log import Meter, Reporter, peak_memory_mib, startup_rows, summary_rows
from ..train.policy import AfterUpdate, diverged, nothing_to_do, plan_after_validation, plan_update, regularization
from ..train.policy import score_validation, stop_before_update
from ..train.setup import Run, set_up
from ..train.update import Step, dropout_seed, train_step
from ..train.validate import validation_bleu, validation_loss


# -- the start -----------------------------------------------------------------------------------
def start_report(run: Run) -> Reporter:
    """The start-up table, the effective configuration (config.yaml) and the log's first record."""
    o, env, pos = run.o, run.env, run.state.position
    report = Reporter(run.console, run.save_dir, env.is_main, o.tensorboard_logdir)
    if env.is_main:
        atomic_write_text(run.save_dir / "config.yaml",
                          "# the effective options of this run; reuse with: xf train --config config.yaml\n"
                          + yaml.safe_dump(absolute_paths(TrainOptions, run.options_record), sort_keys=False))
    for warning in (precision_warning(env.device, o.precision), distributed.threads_warning(o.threads)):
        if warning:
            report.warn(warning)
    report.table("xf train", startup_rows(o, run.cfg, run.data, len(run.train_set), len(run.valid_set),
                                          run.model.num_parameters(), run.batches, env.device, env.world_size,
                                          hardware_note(env.device), pos.num_updates, pos.epoch))
    report.record("start", {"update": pos.num_updates, "epoch": pos.epoch,
                            "parameters": run.model.num_parameters(), "world_size": env.world_size,
                            "options": run.options_record})
    return report


# -- validating and saving -----------------------------------------------------------------------
def validate(run: Run, report: Reporter, epoch: int) -> tuple[dict, bool]:
    """Validation loss (and BLEU); the policy updates the best score and the patience count."""
    o, pos = run.o, run.state.position
    valid = validation_loss(run.model, run.valid_set, run.valid_batches, run.env, run.autocast, o.label_smoothing)
    if o.eval_bleu:
        valid["bleu"] = validation_bleu(run.model, run.valid_set, run.sp, run.env, run.autocast, o.max_tokens)
    improved, pos.best, pos.bad_validations = score_validation(
        valid["bleu"] if o.eval_bleu else valid["loss"], pos.best, pos.bad_validations, higher_is_better=o.eval_bleu,
        epsilon=o.patience_epsilon)
    report.validation({"epoch": epoch, "update": pos.num_updates, **valid, "best": pos.best}, improved)
    return valid, improved


def save(run: Run, names: list[str], valid: dict, elapsed_seconds: float) -> Path:
    """Write one checkpoint under ``names`` (the first is serialized, the others copied), on rank
    0 only; returns the path of the first."""
    pos, save_dir = run.state.position, run.save_dir
    paths = [save_dir / name for name in names]
    if not run.env.is_main:
        return paths[0]
    train_state = run.state.state_dict(elapsed_seconds=elapsed_seconds, num_batches=run.batches.num_batches(pos.epoch),
                                       options=run.options_record)
    # an epoch has just ended when the position is at the start of the next one
    meta = {"epoch": pos.epoch, "num_updates": pos.num_updates, "end_of_epoch": pos.batch_offset == 0,
            "source_lang": run.data.source_lang, "target_lang": run.data.target_lang,
            **({"pairs": run.data.pairs} if run.data.pairs else {}),  # a multilingual model (text/languages.py)
            **({"formality": run.data.meta["formality"]} if run.data.meta.get("formality") else {}),  # text/formality_tags.py
            **{f"valid_{k}": v for k, v in valid.items()}}
    save_checkpoint(paths[0], make_checkpoint(run.model, run.data.spm_model_bytes, train_state, meta))
    for p in paths[1:]:
        copy_atomic(paths[0], p)
    remove_old_checkpoints(save_dir, run.o.keep_last_checkpoints)
    return paths[0]


# -- the training loop ---------------------------------------------------------------------------
@dataclasses.dataclass
class Loop:
    """What the loop carries from one update to the next, besides the training state."""

    elapsed_before: float
    start: float = dataclasses.field(default_factory=time.monotonic)
    stop_reason: Optional[str] = None
    last_valid: dict = dataclasses.field(default_factory=dict)
    bad_in_a_row: int = 0  # consecutive skipped (non-finite) updates
    skipped: int = 0
    last_good: Optional[str] = None  # for error messages: the last checkpoint before a bad streak
    saved_at: int = -1  # the update of the last checkpoint_last.pt written by this process
    last_save_time: float = dataclasses.field(default_factory=time.monotonic)
    # updates whose outcome (finite or skipped) is still on the device: (update, step, target tokens)
    pending: list[tuple[int, Step, float]] = dataclasses.field(default_factory=list)
    regularization: Optional[tuple[float, float]] = None  # (P_drop, label smoothing) in force (--late-after)

    def elapsed(self) -> float:
        """Training wall time, earlier runs included."""
        return self.elapsed_before + time.monotonic() - self.start


def settle(run: Run, report: Reporter, loop: Loop, meter: Meter) -> None:
    """Read back which of the updates since the last call were skipped (one transfer from the
    device, at log intervals and before validating or saving, so that updates never wait for the
    device), then, update by update: count them, warn, and stop with the last good checkpoint
    when the policy says the run diverged."""
    if not loop.pending:
        return
    pending, loop.pending = loop.pending, []
    finite = torch.stack([step.finite for _, step, _ in pending]).tolist()
    scales = (torch.stack([torch.stack([step.scale, step.next_scale]) for _, step, _ in pending]).tolist()
              if run.state.scaler.is_enabled() else [None] * len(pending))
    for (n, _, ntokens), ok, scale in zip(pending, finite, scales):
        if ok:
            meter.good_update(ntokens)
            loop.bad_in_a_row = 0
            continue
        loop.bad_in_a_row += 1
        loop.skipped += 1
        if scale is not None:
            report.warn(f"fp16 gradient overflow at update {n:,}: step skipped, loss scale {scale[0]:g} -> "
                        f"{scale[1]:g}", "overflow", {"update": n, "scale": scale[1]})
        else:
            report.warn(f"non-finite loss or gradient at update {n:,}: step skipped", "skip", {"update": n})
        if diverged(run.o, loop.bad_in_a_row):
            what = (f"fp16 gradient overflows (the loss scale fell to {scale[1]:g})"
                    if scale is not None else "non-finite losses or gradients")
            raise XfError(
                f"{loop.bad_in_a_row} consecutive updates with {what}, the last at update {n:,}: training "
                f"diverged. Last good checkpoint: {loop.last_good or 'none written yet'}. Try a lower --lr, "
                "a longer --warmup-updates, --clip-norm, or another --precision"
            )


def train_loop(run: Run, report: Reporter, stop: StopSignal) -> tuple[Loop, Meter]:
    """Train until the policy says stop: for each update, the step, then what the policy asks
    for (log, validate, save)."""
    o, env, pos, batches = run.o, run.env, run.state.position, run.batches
    loop, meter = Loop(run.state.elapsed_before), Meter(env.device, compiled_graphs if o.compile else None)
    prefetch = Prefetch(batches, background=env.device.type == "cuda")  # on a CPU its cores compute
    time_limit = 3600.0 * o.stop_time_hours
    report.start(run.total_updates, pos.num_updates, pos.epoch)
    while loop.stop_reason is None:
        epoch = pos.epoch
        while pos.epoch == epoch and loop.stop_reason is None:
            t0 = time.perf_counter()
            micro = prefetch.take(epoch, pos.batch_offset)
            # One collective per update: the token counts of all ranks (to normalize the gradient
            # by the whole update's target tokens) and whether a rank was signalled. Rank 0's
            # clock decides --stop-time-hours for all: this update is the last.
            ntokens, src_tokens, signalled, out_of_time = env.sum(
                [sum(b["ntokens"] for b in micro), sum(b["src_tokens"] for b in micro), stop.signum,
                 int(env.is_main and bool(time_limit) and loop.elapsed() >= time_limit)])
            loop.stop_reason = stop_before_update(bool(signalled))
            if loop.stop_reason:
                break
            lr = run.learning_rate(pos.num_updates + 1)
            label_smoothing = regularize(run, report, loop, pos.num_updates + 1)
            torch.manual_seed(dropout_seed(o.seed, epoch, pos.batch_offset, env.rank))
            step = train_step(run.model, run.forward, run.state.optimizer, run.state.scaler, micro,
                              grad_scale=env.world_size / ntokens, lr=lr, autocast=run.autocast,
                              label_smoothing=label_smoothing, clip_norm=o.clip_norm)
            pos.num_updates += 1
            pos.batch_offset = min(pos.batch_offset + batches.per_update, batches.num_batches(epoch))
            meter.add(step, ntokens, src_tokens, time.perf_counter() - t0)
            loop.pending.append((pos.num_updates, step, ntokens))
            remaining = run.total_updates - pos.num_updates if run.total_updates else None
            report.advance(pos.num_updates, epoch,
                           meter.eta(remaining, time_limit - loop.elapsed() if time_limit else None))
            end_of_epoch = pos.batch_offset >= batches.num_batches(epoch)
            if end_of_epoch:
                pos.epoch, pos.batch_offset = epoch + 1, 0  # a checkpoint from here starts the next epoch
            after = AfterUpdate(epoch, pos.num_updates, end_of_epoch, bool(out_of_time),
                                time.monotonic() - loop.last_save_time)
            follow_plan(run, report, loop, meter, after, lr)
    settle(run, report, loop, meter)
    if loop.stop_reason == "signal" and loop.saved_at != pos.num_updates:
        save(run, ["checkpoint_last.pt"], loop.last_valid, loop.elapsed())
    prefetch.close()
    return loop, meter


def regularize(run: Run, report: Reporter, loop: Loop, update: int) -> float:
    """Give the model the P_drop of update number ``update`` and return its label smoothing
    epsilon; the switch of --late-after is logged (in train_log.jsonl too) by the process that
    makes it."""
    now = regularization(run.o, update, run.cfg.dropout)
    if now != loop.regularization:
        if loop.regularization is not None or (run.o.late_after and update == run.o.late_after + 1):
            report.record("regularization", {"update": update, "dropout": now[0], "label_smoothing": now[1]})
            if run.env.is_main:
                run.console.print(f"update {update:,}: late regularization from here on (--late-after "
                                  f"{run.o.late_after:,}): dropout {now[0]:g}, label smoothing {now[1]:g}")
        run.model.set_dropout(now[0])
        loop.regularization = now
    return now[1]


def follow_plan(run: Run, report: Reporter, loop: Loop, meter: Meter, after: AfterUpdate, lr: float) -> None:
    """Do what the policy asks after an update: log, validate, save; note its stop reason."""
    plan = plan_update(run.o, after)
    if plan.log or plan.validate or plan.save or plan.stop:
        settle(run, report, loop, meter)
    if plan.log:
        rec = meter.take_window(run.env, after.epoch, after.num_updates, lr)
        if rec is not None:
            report.train_log(rec)
    if plan.validate:
        loop.last_valid, improved = validate(run, report, after.epoch)
        plan = plan_after_validation(run.o, plan, after, improved, run.state.position.bad_validations)
    if plan.save:
        written = save(run, [*plan.checkpoints, "checkpoint_last.pt"], loop.last_valid, loop.elapsed())
        loop.saved_at, loop.last_save_time = run.state.position.num_updates, time.monotonic()
        if loop.bad_in_a_row == 0:
            loop.last_good = f"{written} (update {run.state.position.num_updates:,})"
    loop.stop_reason = plan.stop


# -- the command -------------------------------------------------------------------------------
def train(options: TrainOptions) -> dict:
    """Train as ``options`` say; returns the final summary (also the last line of train_log.jsonl)."""
    env = distributed.setup(options.device, options.ddp_timeout_minutes)
    try:
        # --precision auto becomes what this device runs best; the run (and its config.yaml) says which
        options = dataclasses.replace(options, precision=resolve_precision(env.device, options.precision))
        resume = f"Start every node again to resume from {Path(options.save_dir) / 'checkpoint_last.pt'}"
        with StopSignal() as stop, distributed.peer_failures(env, resume), \
                SaveDirLock(options.save_dir, env.is_main) as lock:  # one run per save dir
            run = set_up(options, env, lock)
            pos = run.state.position
            done = nothing_to_do(run.o, pos.num_updates, pos.epoch, run.state.elapsed_before)
            if done:
                run.console.print(f"{run.save_dir / 'checkpoint_last.pt'} has already {done} (update "
                                  f"{pos.num_updates:,}, epoch {pos.epoch}); nothing to do. Raise it to train on")
                return {"num_updates": pos.num_updates, "epoch": pos.epoch, "stop_reason": "already done"}
            report = start_report(run)
            try:
                loop, meter = train_loop(run, report, stop)
            except BaseException:
                report.close()
                raise
            return finish(run, report, loop, meter, stop)
    finally:
        distributed.shutdown()


def finish(run: Run, report: Reporter, loop: Loop, meter: Meter, stop: StopSignal) -> dict:
    """The summary (returned, logged and shown); a signalled run exits as a signalled process."""
    o, pos, device = run.o, run.state.position, run.env.device
    report.stop()
    stop_reason = loop.stop_reason
    signum = int(stop.signum or signal.SIGTERM)  # another rank may have been the one signalled
    if stop_reason == "signal":
        stop_reason = f"signal {signal.Signals(signum).name}"
    summary = {
        "stop_reason": stop_reason, "num_updates": pos.num_updates, "epoch": pos.epoch,
        "best": pos.best, "best_metric": "bleu" if o.eval_bleu else "loss", "valid": loop.last_valid,
        "skipped_updates": loop.skipped, "train_seconds": round(meter.timed["seconds"], 3),
        **meter.speed(meter.timed), "peak_memory_mib": round(peak_memory_mib(device), 1),
    }
    if o.compile:  # the updates that compiled a graph, kept apart from the speed above
        summary.update(compile_seconds=round(meter.compile_seconds, 2), compiled_graphs=compiled_graphs())
    report.record("summary", summary)
    report.table("training summary", summary_rows(summary, pos.batch_offset, o.compile, device, run.save_dir))
    report.close()
    if stop_reason.startswith("signal"):
        run.console.print(f"stopped by {signal.Signals(signum).name} after update {pos.num_updates:,}; "
                          f"{run.save_dir / 'checkpoint_last.pt'} is saved. Resume by running the same "
                          "command again.")
        raise SystemExit(128 + signum)
    return summary
