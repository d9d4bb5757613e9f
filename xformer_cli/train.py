"""xf train: the paper's training recipe (Sec. 5), on one CPU, one GPU or many under torchrun.

Read top to bottom: option checks, checkpoint state in and out, then ``train`` itself, one
visible loop in the style of nanoGPT's train.py:

    for each update:
        forward/backward over update_freq micro-batches (DDP syncs gradients on the last only),
        loss summed over target tokens and divided by the token count of the whole update,
        grad norm (and clipping), optimizer step with the scheduled learning rate,
        log; validate and save at their intervals and at each epoch end.

A run resumes by re-running the same command: everything needed to continue exactly where it
stopped is in ``checkpoint_last.pt`` (weights, optimizer, schedule, loss scale, RNG states and
the position in the epoch), written atomically, so a crash at any moment loses at most the work
since the last save and never a checkpoint.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import random
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Optional

import numpy as np
import torch
import yaml

from . import distributed
from .checkpoint import load_checkpoint, make_checkpoint, save_checkpoint, spm_digest
from .config import ConfigError, to_dict
from .console import stderr_console
from .data import DataDir, batch_by_size, collate
from .errors import XfError
from .fileio import atomic_write, atomic_write_text, remove_stale_temporaries
from .loss import fused_output_loss
from .model import ModelConfig, Transformer, config_to_dict, model_config
from .options import TrainOptions
from .schedule import learning_rate
from .train_log import Reporter, format_seconds
from .validate import validation_bleu, validation_loss

# TrainOptions fields that override a preset's ModelConfig field of the same name.
MODEL_FIELDS = [f.name for f in dataclasses.fields(ModelConfig) if f.name in TrainOptions.__dataclass_fields__]
CHECKPOINT_NAME = re.compile(r"checkpoint_(\d+)_(\d+)\.pt")


# -- options -----------------------------------------------------------------------------------
def check_options(o: TrainOptions, device: torch.device) -> None:
    """Reject impossible combinations before anything is read or written."""
    positive = ("max_tokens", "update_freq", "log_interval", "max_nan_updates")
    non_negative = ("max_update", "max_epoch", "save_interval_updates", "keep_last_checkpoints",
                    "validate_interval_updates", "patience", "clip_norm", "weight_decay", "threads",
                    "warmup_updates", "save_interval_minutes", "stop_time_hours")
    if o.ddp_timeout_minutes <= 0:
        raise ConfigError(f"--ddp-timeout-minutes must be positive, got {o.ddp_timeout_minutes}")
    for name in positive:
        if getattr(o, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(o, name)}")
    for name in non_negative:
        if getattr(o, name) < 0:
            raise ConfigError(f"--{name.replace('_', '-')} must not be negative, got {getattr(o, name)}")
    if not 0 <= o.label_smoothing < 1:
        raise ConfigError(f"--label-smoothing must be in [0, 1), got {o.label_smoothing}")
    if len(o.adam_betas) != 2 or not all(0 <= b < 1 for b in o.adam_betas):
        raise ConfigError(f"--adam-betas needs two values in [0, 1), got {list(o.adam_betas)}")
    if o.lr_scheduler == "noam" and o.warmup_updates < 1:
        raise ConfigError("--lr-scheduler noam needs --warmup-updates of at least 1")
    if o.lr_scheduler == "inverse_sqrt" and o.lr is None:
        raise ConfigError("--lr-scheduler inverse_sqrt needs a peak learning rate: --lr (e.g. 5e-4)")
    if o.precision == "fp16" and device.type != "cuda":
        raise ConfigError("--precision fp16 needs a CUDA device (on CPU use bf16 or fp32)")


def build_config(o: TrainOptions, vocab_size: int) -> ModelConfig:
    """The preset named by --arch with the model options given on the command line applied."""
    return model_config(o.arch, vocab_size=vocab_size, **{name: getattr(o, name) for name in MODEL_FIELDS})


def effective_options(o: TrainOptions, cfg: ModelConfig) -> dict:
    """The options as run: model overrides left unset are filled with the preset's values."""
    values = to_dict(o)
    for name in MODEL_FIELDS:
        values[name] = getattr(cfg, name)
    return values


def prepare_save_dir(path: Path) -> None:
    """Create the save directory and prove that it is writable, before any training."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".xf-write-test.", dir=path)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise XfError(f"save dir {path} is not writable: {e.strerror or e}") from None


def autocast_context(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    """bf16 or fp16 autocast (matmuls in half precision, reductions and the loss in float32)."""
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device.type, dtype=dtype)


def cpu_has_native_bf16() -> bool:
    check = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    try:
        return bool(check()) if check is not None else True
    except RuntimeError:
        return True


def peak_memory_mib(device: torch.device) -> float:
    """Peak CUDA memory allocated by tensors, or the process's peak resident set on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    try:  # Linux: VmHWM is this process's own peak (ru_maxrss may be inherited from its parent)
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1024 if sys.platform != "darwin" else 2**20)


def make_optimizer(model: torch.nn.Module, o: TrainOptions) -> torch.optim.Optimizer:
    """Adam(W) with the fused kernel (one kernel per tensor: ~2x faster than foreach on CPU, and
    far less sensitive to other jobs on the cores); the foreach one where fused is unavailable."""
    kwargs = dict(lr=0.0, betas=tuple(o.adam_betas), eps=o.adam_eps, weight_decay=o.weight_decay)
    try:
        return torch.optim.AdamW(model.parameters(), fused=True, **kwargs)
    except (RuntimeError, ValueError):
        return torch.optim.AdamW(model.parameters(), foreach=True, **kwargs)


# -- state in and out of checkpoints -----------------------------------------------------------
@dataclasses.dataclass
class Position:
    """Where training stands: what a checkpoint must restore besides weights and optimizer."""

    epoch: int = 1
    batch_offset: int = 0  # batches of this epoch's shuffled order already trained on
    num_updates: int = 0
    best: Optional[float] = None  # lowest validation loss, or highest BLEU with --eval-bleu
    bad_validations: int = 0  # validations since the last improvement (--patience)


def rng_states() -> dict:
    """Every global random generator as tensors and plain lists (weights_only-loadable)."""
    py_version, py_state, py_gauss = random.getstate()
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "python": [py_version, list(py_state), py_gauss],
        "numpy": [np_name, np_keys.tolist(), int(np_pos), int(np_has_gauss), float(np_gauss)],
    }


def set_rng_states(states: dict) -> None:
    torch.set_rng_state(states["torch"])
    if states["cuda"] and torch.cuda.is_available() and len(states["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(states["cuda"])
    version, state, gauss = states["python"]
    random.setstate((version, tuple(state), gauss))
    name, keys, pos, has_gauss, cached = states["numpy"]
    np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))


def dropout_seed(seed: int, epoch: int, batch_offset: int, rank: int) -> int:
    """The seed of an update's dropout masks: a function of where it is in the data and of the
    rank, so a resumed run draws the same masks as an uninterrupted one, and ranks differ."""
    return int(np.random.SeedSequence([seed, epoch, batch_offset, rank]).generate_state(1)[0])


def epoch_order(num_batches: int, seed: int, epoch: int) -> np.ndarray:
    """The order of the length-grouped batches in ``epoch``: shuffled, reproducibly from the seed."""
    return np.random.default_rng([seed, epoch]).permutation(num_batches)


def rank_share(chunk: np.ndarray, order: np.ndarray, rank: int, world_size: int) -> np.ndarray:
    """This rank's micro-batches of one update: every world_size-th batch of ``chunk``.

    The last update of an epoch may have fewer batches than ranks; it borrows batches from the
    start of the epoch so that every rank takes part in the gradient all-reduce.
    """
    if len(chunk) < world_size:
        chunk = np.concatenate([chunk, order[: world_size - len(chunk)]])
    return chunk[rank::world_size]


def check_resumable(ckpt: dict, path: Path, spm_model: bytes, data_path: Path, cfg: ModelConfig) -> None:
    """A checkpoint to resume must hold training state and match the data's vocabulary and the model."""
    if not ckpt.get("train_state"):
        raise XfError(f"{path}: has no training state (an averaged or exported checkpoint?); cannot resume from it")
    theirs, ours = ckpt.get("spm_sha256"), spm_digest(spm_model)
    if theirs != ours:
        raise XfError(
            f"{path}: trained with another vocabulary (spm.model sha256 {str(theirs)[:12]}..., "
            f"{data_path}/spm.model is {ours[:12]}...); use the original data or another --save-dir"
        )
    wanted = config_to_dict(cfg)
    diffs = [f"{k} {ckpt['model_config'].get(k)!r} there, {v!r} here" for k, v in wanted.items()
             if ckpt["model_config"].get(k) != v]
    if diffs:
        raise XfError(f"{path}: the checkpoint's model differs from the options ({'; '.join(diffs)}); "
                      "use the same options to resume, or another --save-dir")


def copy_atomic(src: Path, dst: Path) -> None:
    with open(src, "rb") as f, atomic_write(dst, "wb") as out:
        shutil.copyfileobj(f, out, 1 << 22)


def remove_old_checkpoints(save_dir: Path, keep: int) -> None:
    """Keep the ``keep`` newest checkpoint_<epoch>_<update>.pt (0 keeps all)."""
    if keep <= 0:
        return
    numbered = []
    for p in save_dir.glob("checkpoint_*_*.pt"):
        m = CHECKPOINT_NAME.fullmatch(p.name)
        if m:
            numbered.append((int(m.group(2)), int(m.group(1)), p))
    for _, _, p in sorted(numbered)[:-keep]:
        p.unlink(missing_ok=True)


class StopSignal:
    """SIGINT and SIGTERM (cluster preemption) ask training to stop after the current update.

    A second Ctrl-C aborts at once (the last checkpoint written stays intact: writes are atomic).
    """

    def __init__(self):
        self.signum = 0
        self._previous: dict = {}

    def _handle(self, signum, frame):
        if self.signum == signal.SIGINT and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signum = self.signum or signum

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for s in (signal.SIGINT, signal.SIGTERM):
                self._previous[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc):
        for s, handler in self._previous.items():
            signal.signal(s, handler)


# -- the command -------------------------------------------------------------------------------
def train(options: TrainOptions) -> dict:
    """Train as ``options`` say; returns the final summary (also the last line of train_log.jsonl)."""
    env = distributed.setup(options.device, options.ddp_timeout_minutes)
    try:
        check_options(options, env.device)
        resume = f"Start every node again to resume from {Path(options.save_dir) / 'checkpoint_last.pt'}"
        with StopSignal() as stop, distributed.peer_failures(env, resume):
            return _train(options, env, stop)
    finally:
        distributed.shutdown()


def _train(o: TrainOptions, env: distributed.Env, stop: StopSignal) -> dict:
    console = stderr_console(quiet=not env.is_main)  # one line per record when stderr is a log file
    device = env.device
    if o.threads:
        torch.set_num_threads(o.threads)

    # -- data, save dir, model configuration, and what to resume from: all checked before writing
    data = DataDir.open(o.data)
    train_set = data.split("train")
    if "valid" not in data.splits:
        raise XfError(f"{data.path} has no validation split (run xf preprocess with --validpref)")
    valid_set = data.split("valid")
    if len(train_set) == 0:
        raise XfError(f"{data.path}: the training split is empty")
    spm_model = data.spm_model_bytes
    # Batches of similar lengths up to --max-tokens, made once; each epoch shuffles their order.
    batches = batch_by_size(train_set.src_sizes, train_set.tgt_sizes, o.max_tokens)
    valid_batches = batch_by_size(valid_set.src_sizes, valid_set.tgt_sizes, o.max_tokens)
    cfg = build_config(o, data.vocab_size)
    save_dir = Path(o.save_dir)
    last_path = save_dir / "checkpoint_last.pt"
    ckpt = load_checkpoint(last_path) if last_path.exists() else None
    if ckpt is not None:
        check_resumable(ckpt, last_path, spm_model, data.path, cfg)
    if env.is_main:
        prepare_save_dir(save_dir)
        remove_stale_temporaries(save_dir)  # of atomic writes killed by kill -9
    sp = None
    if o.eval_bleu:
        from .translate import load_sentencepiece

        sp = load_sentencepiece(spm_model, str(data.path / "spm.model"))

    # -- model, optimizer, loss scaler (the same initial weights on every rank) ----------------
    torch.manual_seed(o.seed)
    model = Transformer(cfg).to(device)
    # Decoupled weight decay as fairseq's Adam; with --weight-decay 0 (default) this is Adam.
    optimizer = make_optimizer(model, o)
    scaler = torch.amp.GradScaler(device.type, enabled=o.precision == "fp16")
    autocast = autocast_context(o.precision, device)
    pos = Position()
    elapsed_before = 0.0  # training wall time of earlier runs (--stop-time-hours counts it)
    if ckpt is not None:
        model.load_state_dict(ckpt["model"])
        state = ckpt["train_state"]
        optimizer.load_state_dict(state["optimizer"])
        if scaler.is_enabled() and state.get("scaler"):
            scaler.load_state_dict(state["scaler"])
        set_rng_states(state["rng"])
        pos = Position(**state["position"])
        elapsed_before = float(state.get("elapsed_seconds", 0.0))
        if state.get("num_batches") != len(batches):
            console.print(f"[yellow]warning:[/yellow] the batches differ from those of {last_path} (another "
                          f"--max-tokens or data?): epoch {pos.epoch} restarts from its beginning")
            pos.batch_offset = 0
        del ckpt  # the weights now live in the model; do not hold a second copy
    train_model = model
    if env.distributed:
        from torch.nn.parallel import DistributedDataParallel as DDP

        train_model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)

    per_update = o.update_freq * env.world_size  # batches consumed by one update, all ranks together
    updates_per_epoch = math.ceil(len(batches) / per_update)
    total_updates = o.max_update or (o.max_epoch * updates_per_epoch if o.max_epoch else None)
    if o.max_update and o.max_epoch:
        total_updates = min(o.max_update, o.max_epoch * updates_per_epoch)
    time_limit = 3600.0 * o.stop_time_hours
    if ((o.max_update and pos.num_updates >= o.max_update) or (o.max_epoch and pos.epoch > o.max_epoch)
            or (time_limit and elapsed_before >= time_limit)):
        console.print(f"{last_path} has already reached --max-update/--max-epoch/--stop-time-hours (update "
                      f"{pos.num_updates:,}, epoch {pos.epoch}); nothing to do. Raise them to train on")
        return {"num_updates": pos.num_updates, "epoch": pos.epoch, "stop_reason": "already done"}

    # -- start-up report, effective configuration, log --------------------------------------------
    report = Reporter(console, save_dir, env.is_main, o.tensorboard_logdir)
    if env.is_main:
        atomic_write_text(save_dir / "config.yaml",
                          "# the effective options of this run; reuse with: xf train --config config.yaml\n"
                          + yaml.safe_dump(effective_options(o, cfg), sort_keys=False))
    if o.precision == "bf16" and device.type == "cpu" and not cpu_has_native_bf16():
        report.warn("this CPU has no native bf16 matrix instructions (avx512_bf16/AMX): bf16 training "
                    "will be slower than fp32 here")
    report.table("xf train", [
        ("data", f"{data.path} ({data.source_lang}-{data.target_lang}, {len(train_set):,} training pairs, "
                 f"{len(valid_set):,} validation)"),
        ("model", f"{o.arch}: {cfg.encoder_layers}+{cfg.decoder_layers} layers, d_model {cfg.d_model}, "
                  f"d_ff {cfg.d_ff}, {cfg.heads} heads, vocabulary {cfg.vocab_size:,}"),
        ("parameters", f"{model.num_parameters():,}"),
        ("effective batch", f"{o.max_tokens:,} tokens x {o.update_freq} (update freq) x {env.world_size} "
                            f"(processes) = {o.max_tokens * per_update:,} tokens per update"),
        ("updates per epoch", f"{updates_per_epoch:,} ({len(batches):,} batches)"),
        ("device", f"{device} x {env.world_size}, {o.precision}, {torch.get_num_threads()} threads"),
        ("schedule", f"{o.lr_scheduler}, warmup {o.warmup_updates}" + (f", lr {o.lr:g}" if o.lr is not None else "")),
        ("save dir", f"{save_dir}" + (f" (resuming at update {pos.num_updates:,}, epoch {pos.epoch})"
                                      if pos.num_updates else "")),
    ])
    report.record("start", {"update": pos.num_updates, "epoch": pos.epoch, "parameters": model.num_parameters(),
                            "world_size": env.world_size, "options": effective_options(o, cfg)})

    # -- saving, validating --------------------------------------------------------------------
    last_good: Optional[str] = None  # for error messages: the last checkpoint before a bad streak
    saved_at = -1  # the update of the last checkpoint_last.pt written by this process
    last_valid: dict = {}

    def save(names: list[str], valid: dict) -> None:
        """Write one checkpoint under ``names`` (the first is serialized, the others copied)."""
        nonlocal last_good, saved_at
        if not env.is_main:
            return
        train_state = {
            "optimizer": optimizer.state_dict(),
            "scheduler": {"name": o.lr_scheduler, "num_updates": pos.num_updates},
            "scaler": scaler.state_dict() if scaler.is_enabled() else None,
            "rng": rng_states(),
            "position": dataclasses.asdict(pos),
            "options": effective_options(o, cfg),
            "world_size": env.world_size,
            "num_batches": len(batches),
            "elapsed_seconds": elapsed(),
        }
        # an epoch has just ended when the position is at the start of the next one
        meta = {"epoch": pos.epoch, "num_updates": pos.num_updates, "end_of_epoch": pos.batch_offset == 0,
                "source_lang": data.source_lang,
                "target_lang": data.target_lang, **{f"valid_{k}": v for k, v in valid.items()}}
        paths = [save_dir / name for name in names]
        save_checkpoint(paths[0], make_checkpoint(model, spm_model, train_state, meta))
        for p in paths[1:]:
            copy_atomic(paths[0], p)
        remove_old_checkpoints(save_dir, o.keep_last_checkpoints)
        saved_at = pos.num_updates
        if bad_in_a_row == 0:
            last_good = f"{paths[0]} (update {pos.num_updates:,})"

    def validate(epoch: int) -> tuple[dict, bool]:
        """Validation loss (and BLEU); updates the best score and the patience count."""
        valid = validation_loss(model, valid_set, valid_batches, env, autocast, o.label_smoothing)
        if o.eval_bleu:
            valid["bleu"] = validation_bleu(model, valid_set, sp, env, autocast, o.max_tokens)
        score = valid["bleu"] if o.eval_bleu else valid["loss"]
        improved = pos.best is None or (score > pos.best if o.eval_bleu else score < pos.best)
        if improved:
            pos.best, pos.bad_validations = score, 0
        else:
            pos.bad_validations += 1
        report.validation({"epoch": epoch, "update": pos.num_updates, **valid, "best": pos.best}, improved)
        return valid, improved

    # -- the training loop ---------------------------------------------------------------------
    report.start(total_updates, pos.num_updates, pos.epoch)
    timed = {"seconds": 0.0, "updates": 0, "src": 0.0, "tgt": 0.0}  # excludes start-up and validation
    window = dict(timed, gnorm=0.0, finite=0, tokens=0.0)  # since the last log line
    window_loss = torch.zeros(2, dtype=torch.float64, device=device)  # loss and nll sums of the window
    bad_in_a_row, skipped = 0, 0
    first_update_of_process = True
    last_save_time = time.monotonic()
    stop_reason = None
    loop_start = time.monotonic()

    def elapsed() -> float:
        return elapsed_before + time.monotonic() - loop_start

    model.train()
    try:
        while stop_reason is None:
            epoch = pos.epoch
            order = epoch_order(len(batches), o.seed, epoch)
            end_of_epoch = False
            while not end_of_epoch and stop_reason is None:
                t0 = time.perf_counter()
                # -- this rank's micro-batches of the update -----------------------------------
                chunk = order[pos.batch_offset : pos.batch_offset + per_update]
                share = rank_share(chunk, order, env.rank, env.world_size)
                micro = [collate([train_set[i] for i in batches[b]]) for b in share]
                # One collective per update: the token counts of all ranks (to normalize the
                # gradient by the whole update's target tokens) and whether a rank was signalled.
                # Rank 0's clock decides --stop-time-hours for all: this update is the last.
                ntokens, src_tokens, signalled, out_of_time = env.sum(
                    [sum(b["ntokens"] for b in micro), sum(b["src_tokens"] for b in micro), stop.signum,
                     int(env.is_main and bool(time_limit) and elapsed() >= time_limit)]
                )
                if signalled:
                    stop_reason = "signal"
                    break
                lr = learning_rate(pos.num_updates + 1, o.lr_scheduler, cfg.d_model, o.warmup_updates, o.lr,
                                   o.warmup_init_lr)
                for group in optimizer.param_groups:
                    group["lr"] = lr
                torch.manual_seed(dropout_seed(o.seed, epoch, pos.batch_offset, env.rank))

                # -- forward/backward over the micro-batches -----------------------------------
                # The loss is a sum over target tokens; dividing it by the token count of the
                # whole update (all micro-batches, all ranks) makes the gradient the per-token
                # mean of the update, as if it were one big batch, not a mean of batch means.
                # (Scaling the loss before backward equals scaling the gradients after it, and
                # keeps fp16 gradients in range.) DDP averages over ranks: hence world_size.
                grad_scale = env.world_size / ntokens
                update_loss = torch.zeros(2, dtype=torch.float64, device=device)
                for i, batch in enumerate(micro):
                    # DDP all-reduces gradients during the backward of the last micro-batch only.
                    last_micro = i == len(micro) - 1
                    sync = contextlib.nullcontext() if last_micro or not env.distributed else train_model.no_sync()
                    with sync:
                        with autocast:
                            features = train_model(batch["src"].to(device, non_blocking=True),
                                                   batch["prev_output"].to(device, non_blocking=True),
                                                   features_only=True)
                            loss, nll = fused_output_loss(features, model.output_proj.weight,
                                                          batch["target"].to(device, non_blocking=True),
                                                          o.label_smoothing)
                        scaler.scale(loss * grad_scale).backward()
                    update_loss += torch.stack([loss.detach().double(), nll.double()])
                    del features, loss, nll

                # -- optimizer step, skipped on a non-finite gradient (fp16: an overflow) ------
                if scaler.is_enabled():
                    scaler.unscale_(optimizer)
                gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), o.clip_norm or math.inf).item()
                finite = math.isfinite(gnorm)  # the same on every rank: gradients are synced
                if scaler.is_enabled():
                    scale = scaler.get_scale()
                    scaler.step(optimizer)  # skips the step when it finds inf/nan gradients
                    scaler.update()  # and then lowers the scale
                elif finite:
                    optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                pos.num_updates += 1
                pos.batch_offset = min(pos.batch_offset + per_update, len(order))
                seconds = time.perf_counter() - t0

                if finite:
                    bad_in_a_row = 0
                    window_loss += update_loss
                    window["tokens"] += ntokens
                    window["gnorm"] += gnorm
                    window["finite"] += 1
                else:
                    bad_in_a_row += 1
                    skipped += 1
                    if scaler.is_enabled():
                        report.warn(f"fp16 gradient overflow at update {pos.num_updates:,}: step skipped, "
                                    f"loss scale {scale:g} -> {scaler.get_scale():g}", "overflow",
                                    {"update": pos.num_updates, "scale": scaler.get_scale()})
                    else:
                        report.warn(f"non-finite loss or gradient at update {pos.num_updates:,}: step skipped",
                                    "skip", {"update": pos.num_updates})
                    if bad_in_a_row >= o.max_nan_updates:
                        what = (f"fp16 gradient overflows (the loss scale fell to {scaler.get_scale():g})"
                                if scaler.is_enabled() else "non-finite losses or gradients")
                        raise XfError(
                            f"{bad_in_a_row} consecutive updates with {what}, the last at update "
                            f"{pos.num_updates:,}: training diverged. Last good checkpoint: "
                            f"{last_good or 'none written yet'}. Try a lower --lr, a longer "
                            "--warmup-updates, --clip-norm, or another --precision"
                        )

                # -- speed, excluding this process's first update (allocation, warm-up) --------
                if not first_update_of_process:
                    for d in (timed, window):
                        d["seconds"] += seconds
                        d["updates"] += 1
                        d["src"] += src_tokens
                        d["tgt"] += ntokens
                first_update_of_process = False
                eta = None
                if total_updates and timed["updates"]:
                    eta = (total_updates - pos.num_updates) * timed["seconds"] / timed["updates"]
                if time_limit:
                    eta = min(eta if eta is not None else math.inf, max(0.0, time_limit - elapsed()))
                report.advance(pos.num_updates, epoch, eta)

                # -- log -------------------------------------------------------------------------
                if pos.num_updates % o.log_interval == 0:
                    loss_sum, nll_sum = env.sum_tensor(window_loss).tolist()
                    if window["finite"]:
                        tok = window["tokens"]  # already summed over ranks
                        rec = {"epoch": epoch, "update": pos.num_updates, "loss": loss_sum / tok,
                               "nll": nll_sum / tok, "ppl": math.exp(min(nll_sum / tok, 700.0)), "lr": lr,
                               "gnorm": window["gnorm"] / window["finite"]}
                        if window["seconds"] > 0:
                            rec.update(src_tok_s=window["src"] / window["seconds"],
                                       tgt_tok_s=window["tgt"] / window["seconds"],
                                       ups=window["updates"] / window["seconds"])
                        rec["elapsed"] = round(timed["seconds"], 1)
                        report.train_log(rec)
                    window_loss.zero_()
                    window.update(seconds=0.0, updates=0, src=0.0, tgt=0.0, gnorm=0.0, finite=0, tokens=0.0)

                # -- validate and save: at their intervals, at the epoch's end, when stopping --
                end_of_epoch = pos.batch_offset >= len(order)
                if end_of_epoch:
                    pos.epoch, pos.batch_offset = epoch + 1, 0  # a checkpoint from here starts the next epoch
                if o.max_update and pos.num_updates >= o.max_update:
                    stop_reason = f"reached --max-update {o.max_update}"
                elif end_of_epoch and o.max_epoch and epoch >= o.max_epoch:
                    stop_reason = f"reached --max-epoch {o.max_epoch}"
                elif out_of_time:
                    stop_reason = f"reached --stop-time-hours {o.stop_time_hours:g}"
                validate_now = end_of_epoch or stop_reason is not None or (
                    o.validate_interval_updates and pos.num_updates % o.validate_interval_updates == 0)
                names = []
                # a numbered checkpoint at every stop too, so that averaging sees the final weights
                if end_of_epoch or stop_reason is not None or (
                        o.save_interval_updates and pos.num_updates % o.save_interval_updates == 0):
                    names.append(f"checkpoint_{epoch}_{pos.num_updates}.pt")
                if validate_now:
                    last_valid, improved = validate(epoch)
                    if improved:
                        names.append("checkpoint_best.pt")
                    if o.patience and pos.bad_validations >= o.patience:
                        stop_reason = f"no improvement in {o.patience} validations (--patience)"
                periodic = o.save_interval_minutes and time.monotonic() - last_save_time >= 60 * o.save_interval_minutes
                if names or validate_now or periodic:
                    save(names + ["checkpoint_last.pt"], last_valid)
                    last_save_time = time.monotonic()

        if stop_reason == "signal" and saved_at != pos.num_updates:
            save(["checkpoint_last.pt"], last_valid)
    except BaseException:
        report.close()
        raise

    # -- summary -------------------------------------------------------------------------------
    report.stop()
    if stop_reason == "signal":
        stop_reason = f"signal {signal.Signals(int(stop.signum or signal.SIGTERM)).name}"
    summary = {
        "stop_reason": stop_reason, "num_updates": pos.num_updates, "epoch": pos.epoch,
        "best": pos.best, "best_metric": "bleu" if o.eval_bleu else "loss", "valid": last_valid,
        "skipped_updates": skipped, "train_seconds": round(timed["seconds"], 3),
        "src_tok_s": timed["src"] / timed["seconds"] if timed["seconds"] else None,
        "tgt_tok_s": timed["tgt"] / timed["seconds"] if timed["seconds"] else None,
        "ups": timed["updates"] / timed["seconds"] if timed["seconds"] else None,
        "peak_memory_mib": round(peak_memory_mib(device), 1),
    }
    report.record("summary", summary)
    report.table("training summary", [
        ("stopped", stop_reason),
        ("updates", f"{pos.num_updates:,} (epoch {pos.epoch if pos.batch_offset else pos.epoch - 1} "
                    f"{'in progress' if pos.batch_offset else 'done'})"),
        (f"best validation {summary['best_metric']}", f"{pos.best:.3f}" if pos.best is not None else "-"),
        ("skipped updates", skipped),
        ("training time", format_seconds(timed["seconds"]) + " (excluding start-up and validation)"),
        ("speed", f"{summary['src_tok_s']:,.0f} src tok/s, {summary['tgt_tok_s']:,.0f} tgt tok/s, "
                  f"{summary['ups']:.2f} upd/s" if timed["seconds"] else "- (the first update is not timed)"),
        ("peak memory", f"{summary['peak_memory_mib']:,.0f} MiB ({'CUDA allocated' if device.type == 'cuda' else 'RSS'})"),
        ("checkpoints", str(save_dir)),
    ])
    report.close()
    if stop_reason.startswith("signal"):
        # Another rank may have been the one signalled; exit as a signalled process would.
        signum = int(stop.signum or signal.SIGTERM)
        console.print(f"stopped by {signal.Signals(signum).name} after update {pos.num_updates:,}; "
                      f"{last_path} is saved. Resume by running the same command again.")
        raise SystemExit(128 + signum)
    return summary
