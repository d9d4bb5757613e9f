"""xf train: the paper's training recipe (Sec. 5), on one CPU, one GPU or many under torchrun.

Read top to bottom: helpers and checkpoint state; ``train_step``, one update:

    forward/backward over update_freq micro-batches (DDP syncs gradients on the last only),
    loss summed over target tokens and divided by the token count of the whole update,
    grad norm (and clipping), optimizer step with the scheduled learning rate;

then set-up (data, model, optimizer, resume) and the loop that runs the step and follows the
plan of ``train_policy`` (after each update: log? validate? which checkpoints? stop, and why?).

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
import shutil
import signal
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Optional

import numpy as np
import torch
import yaml
from rich.console import Console

from .. import distributed
from ..compiling import compile_forward, compiled_graphs
from ..checkpoint import checkpoint_numbers, load_last_checkpoint, make_checkpoint, same_vocabulary, save_checkpoint
from ..config import ConfigError, to_dict
from ..console import stderr_console
from ..data import DataDir, ParallelDataset, batch_by_size, collate, epoch_order, update_batches
from ..errors import XfError
from ..fileio import atomic_write, atomic_write_text, remove_stale_temporaries
from ..loss import fused_output_loss
from ..model import Transformer, config_to_dict
from ..options import MODEL_OVERRIDES, ModelConfig, TrainOptions, model_config
from ..safety import SaveDirLock
from ..precision import autocast_context, choose_precision, cpu_bf16_instructions, hardware_note
from ..schedule import learning_rate
from ..train_log import Reporter, format_seconds
from ..train_policy import AfterUpdate, improves, plan_after_validation, plan_update
from ..validate import validation_bleu, validation_loss
from ..vocab import load_sentencepiece



# -- options -----------------------------------------------------------------------------------
def check_precision(o: TrainOptions, device: torch.device) -> None:
    """The one check that needs the device (the others are TrainOptions.__post_init__'s)."""
    if o.precision == "fp16" and device.type != "cuda":
        raise ConfigError("--precision fp16 needs a CUDA device (on CPU use bf16 or fp32)")


def build_config(o: TrainOptions, vocab_size: int) -> ModelConfig:
    """The preset named by --arch with the model options given on the command line applied."""
    return model_config(o.arch, vocab_size=vocab_size, **{name: getattr(o, name) for name in MODEL_OVERRIDES})


def effective_options(o: TrainOptions, cfg: ModelConfig) -> dict:
    """The options as run: model overrides left unset are filled with the preset's values."""
    values = to_dict(o)
    for name in MODEL_OVERRIDES:
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
    """Adam, or AdamW (decoupled weight decay, as fairseq's "adam"), with the fused kernel (one
    kernel per tensor: ~2x faster than foreach on CPU, and far less sensitive to other jobs on the
    cores); the foreach one where fused is unavailable."""
    cls = torch.optim.AdamW if o.optimizer == "adamw" else torch.optim.Adam
    kwargs = dict(lr=0.0, betas=tuple(o.adam_betas), eps=o.adam_eps, weight_decay=o.weight_decay)
    try:
        return cls(model.parameters(), fused=True, **kwargs)
    except (RuntimeError, ValueError):
        return cls(model.parameters(), foreach=True, **kwargs)


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


def check_resumable(ckpt: dict, path: Path, spm_model: bytes, data_path: Path, cfg: ModelConfig) -> None:
    """A checkpoint to resume must hold training state and match the data's vocabulary and the model."""
    if not ckpt.get("train_state"):
        raise XfError(f"{path}: has no training state (an averaged or exported checkpoint?); cannot resume from it")
    if not same_vocabulary(ckpt["spm_model"], spm_model):
        raise XfError(
            f"{path}: trained with another vocabulary (its sentencepiece pieces differ from "
            f"{data_path}/spm.model's); use the original data or another --save-dir"
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
        numbers = checkpoint_numbers(p)
        if numbers:
            numbered.append((numbers[1], numbers[0], p))
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


# -- one update ----------------------------------------------------------------------------------
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
                                              rows=batch["target_rows"].to(device, non_blocking=True))
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


# -- set-up: data, model, optimizer, resume ----------------------------------------------------
@dataclasses.dataclass
class Run:
    """Everything set up for training; ``pos`` moves as it trains."""

    o: TrainOptions
    env: distributed.Env
    console: Console
    data: DataDir
    train_set: ParallelDataset
    valid_set: ParallelDataset
    batches: list[np.ndarray]  # the training batches, made once; each epoch shuffles their order
    valid_batches: list[np.ndarray]
    cfg: ModelConfig
    sp: object  # the sentencepiece processor (--eval-bleu), else None
    model: Transformer
    forward: torch.nn.Module  # the model, or DDP around it
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    autocast: contextlib.AbstractContextManager
    pos: Position
    elapsed_before: float  # training wall time of earlier runs (--stop-time-hours counts it)

    @property
    def save_dir(self) -> Path:
        return Path(self.o.save_dir)

    @property
    def per_update(self) -> int:
        """Batches consumed by one update, all ranks together."""
        return self.o.update_freq * self.env.world_size

    @property
    def updates_per_epoch(self) -> int:
        return math.ceil(len(self.batches) / self.per_update)

    @property
    def total_updates(self) -> Optional[int]:
        o = self.o
        total = o.max_update or (o.max_epoch * self.updates_per_epoch if o.max_epoch else None)
        if o.max_update and o.max_epoch:
            total = min(o.max_update, o.max_epoch * self.updates_per_epoch)
        return total


def set_up(o: TrainOptions, env: distributed.Env, lock: SaveDirLock) -> Run:
    """Data, save dir, model configuration and what to resume from (all checked before anything
    is written), then model, optimizer and loss scaler (the same initial weights on every rank)."""
    console = stderr_console(quiet=not env.is_main)  # one line per record when stderr is a log file
    if o.threads:
        torch.set_num_threads(o.threads)
    data = DataDir.open(o.data)
    train_set = data.split("train")
    if "valid" not in data.splits:
        raise XfError(f"{data.path} has no validation split (run xf preprocess with --validpref)")
    valid_set = data.split("valid")
    if len(train_set) == 0:
        raise XfError(f"{data.path}: the training split is empty")
    # Batches of similar lengths up to --max-tokens, made once; each epoch shuffles their order.
    batches = batch_by_size(train_set.src_sizes, train_set.tgt_sizes, o.max_tokens)
    valid_batches = batch_by_size(valid_set.src_sizes, valid_set.tgt_sizes, o.max_tokens)
    cfg = build_config(o, data.vocab_size)
    last_path = Path(o.save_dir) / "checkpoint_last.pt"
    ckpt = load_last_checkpoint(last_path) if last_path.exists() else None
    if ckpt is not None:
        check_resumable(ckpt, last_path, data.spm_model_bytes, data.path, cfg)
    if env.is_main:
        prepare_save_dir(Path(o.save_dir))
        lock.acquire()
        remove_stale_temporaries(Path(o.save_dir))  # of atomic writes killed by kill -9 (safe: we hold the lock)
    sp = None
    if o.eval_bleu:
        sp = load_sentencepiece(data.spm_model_bytes, str(data.path / "spm.model"))

    torch.manual_seed(o.seed)
    model = Transformer(cfg).to(env.device)
    optimizer = make_optimizer(model, o)
    scaler = torch.amp.GradScaler(env.device.type, enabled=o.precision == "fp16")
    pos, elapsed_before = Position(), 0.0
    if ckpt is not None:
        pos, elapsed_before = resume(ckpt, model, optimizer, scaler)
        if ckpt["train_state"].get("num_batches") != len(batches):
            console.print(f"[yellow]warning:[/yellow] the batches differ from those of {last_path} (another "
                          f"--max-tokens or data?): epoch {pos.epoch} restarts from its beginning")
            pos.batch_offset = 0
        del ckpt  # the weights now live in the model; do not hold a second copy
    forward = model
    if env.distributed:
        from torch.nn.parallel import DistributedDataParallel as DDP

        forward = DDP(model, device_ids=[env.device.index] if env.device.type == "cuda" else None)
    if o.compile:
        forward = compile_forward(forward)
    return Run(o, env, console, data, train_set, valid_set, batches, valid_batches, cfg, sp, model, forward,
               optimizer, scaler, autocast_context(o.precision, env.device), pos, elapsed_before)


def resume(ckpt: dict, model: Transformer, optimizer: torch.optim.Optimizer,
           scaler: torch.amp.GradScaler) -> tuple[Position, float]:
    """Load a checkpoint's weights and training state; returns the position and the wall time
    trained so far."""
    model.load_state_dict(ckpt["model"])
    state = ckpt["train_state"]
    optimizer.load_state_dict(state["optimizer"])
    if scaler.is_enabled() and state.get("scaler"):
        scaler.load_state_dict(state["scaler"])
    set_rng_states(state["rng"])
    return Position(**state["position"]), float(state.get("elapsed_seconds", 0.0))


def already_done(run: Run) -> Optional[str]:
    """Why there is nothing to train (a finished run run again), or None."""
    o, pos = run.o, run.pos
    if ((o.max_update and pos.num_updates >= o.max_update) or (o.max_epoch and pos.epoch > o.max_epoch)
            or (o.stop_time_hours and run.elapsed_before >= 3600.0 * o.stop_time_hours)):
        return (f"{run.save_dir / 'checkpoint_last.pt'} has already reached --max-update/--max-epoch/"
                f"--stop-time-hours (update {pos.num_updates:,}, epoch {pos.epoch}); nothing to do. "
                "Raise them to train on")
    return None


def start_report(run: Run) -> Reporter:
    """The start-up table, the effective configuration (config.yaml) and the log's first record."""
    o, env, cfg, pos = run.o, run.env, run.cfg, run.pos
    report = Reporter(run.console, run.save_dir, env.is_main, o.tensorboard_logdir)
    if env.is_main:
        atomic_write_text(run.save_dir / "config.yaml",
                          "# the effective options of this run; reuse with: xf train --config config.yaml\n"
                          + yaml.safe_dump(effective_options(o, cfg), sort_keys=False))
    if o.precision == "bf16" and env.device.type == "cpu" and not cpu_bf16_instructions():
        report.warn("this CPU has no native bf16 matrix instructions (avx512_bf16/AMX): bf16 training "
                    "will be slower than fp32 here")
    report.table("xf train", [
        ("data", f"{run.data.path} ({run.data.source_lang}-{run.data.target_lang}, {len(run.train_set):,} "
                 f"training pairs, {len(run.valid_set):,} validation)"),
        ("model", f"{o.arch}: {cfg.encoder_layers}+{cfg.decoder_layers} layers, d_model {cfg.d_model}, "
                  f"d_ff {cfg.d_ff}, {cfg.heads} heads, vocabulary {cfg.vocab_size:,}"),
        ("parameters", f"{run.model.num_parameters():,}"),
        ("effective batch", f"{o.max_tokens:,} tokens x {o.update_freq} (update freq) x {env.world_size} "
                            f"(processes) = {o.max_tokens * run.per_update:,} tokens per update"),
        ("updates per epoch", f"{run.updates_per_epoch:,} ({len(run.batches):,} batches)"),
        ("device", f"{env.device} x {env.world_size}, {torch.get_num_threads()} thread{'s' * (torch.get_num_threads() != 1)}"
                   + (", compiled (torch.compile, dynamic shapes)" if o.compile else "")),
        ("precision", f"{o.precision} ({hardware_note(env.device)})"),
        ("schedule", f"{o.lr_scheduler}, warmup {o.warmup_updates}"
                     + (f", lr {o.lr:g}" if o.lr is not None else f", lr factor {o.lr_factor:g}")),
        ("save dir", f"{run.save_dir}" + (f" (resuming at update {pos.num_updates:,}, epoch {pos.epoch})"
                                          if pos.num_updates else "")),
    ])
    report.record("start", {"update": pos.num_updates, "epoch": pos.epoch,
                            "parameters": run.model.num_parameters(), "world_size": env.world_size,
                            "options": effective_options(o, cfg)})
    return report


# -- validating and saving -----------------------------------------------------------------------
def validate(run: Run, report: Reporter, epoch: int) -> tuple[dict, bool]:
    """Validation loss (and BLEU); updates the best score and the patience count."""
    o, pos = run.o, run.pos
    valid = validation_loss(run.model, run.valid_set, run.valid_batches, run.env, run.autocast, o.label_smoothing)
    if o.eval_bleu:
        valid["bleu"] = validation_bleu(run.model, run.valid_set, run.sp, run.env, run.autocast, o.max_tokens)
    score = valid["bleu"] if o.eval_bleu else valid["loss"]
    improved = improves(score, pos.best, higher_is_better=o.eval_bleu)
    if improved:
        pos.best, pos.bad_validations = score, 0
    else:
        pos.bad_validations += 1
    report.validation({"epoch": epoch, "update": pos.num_updates, **valid, "best": pos.best}, improved)
    return valid, improved


def save(run: Run, names: list[str], valid: dict, elapsed_seconds: float) -> Path:
    """Write one checkpoint under ``names`` (the first is serialized, the others copied), on rank
    0 only; returns the path of the first."""
    o, pos, save_dir = run.o, run.pos, run.save_dir
    paths = [save_dir / name for name in names]
    if not run.env.is_main:
        return paths[0]
    train_state = {
        "optimizer": run.optimizer.state_dict(),
        "scheduler": {"name": o.lr_scheduler, "num_updates": pos.num_updates},
        "scaler": run.scaler.state_dict() if run.scaler.is_enabled() else None,
        "rng": rng_states(),
        "position": dataclasses.asdict(pos),
        "options": effective_options(o, run.cfg),
        "world_size": run.env.world_size,
        "num_batches": len(run.batches),
        "elapsed_seconds": elapsed_seconds,
    }
    # an epoch has just ended when the position is at the start of the next one
    meta = {"epoch": pos.epoch, "num_updates": pos.num_updates, "end_of_epoch": pos.batch_offset == 0,
            "source_lang": run.data.source_lang,
            "target_lang": run.data.target_lang, **{f"valid_{k}": v for k, v in valid.items()}}
    save_checkpoint(paths[0], make_checkpoint(run.model, run.data.spm_model_bytes, train_state, meta))
    for p in paths[1:]:
        copy_atomic(paths[0], p)
    remove_old_checkpoints(save_dir, o.keep_last_checkpoints)
    return paths[0]


# -- the training loop ---------------------------------------------------------------------------
class Meter:
    """Loss sums and speed: over the run (``timed``: excluding start-up, validation and this
    process's first update, which allocates and warms up) and since the last log line (``window``)."""

    def __init__(self, device: torch.device):
        self.timed = {"seconds": 0.0, "updates": 0, "src": 0.0, "tgt": 0.0}
        self.window = dict(self.timed, finite=0, tokens=0.0)  # finite, tokens: filled by settle()
        # on the device, summed over the window's good updates: loss and nll sums, gradient norms
        self.window_loss = torch.zeros(2, dtype=torch.float64, device=device)
        self.window_gnorm = torch.zeros((), dtype=torch.float64, device=device)
        self.first_update = True
        self.first_update_seconds: Optional[float] = None  # with --compile: the compilation's time

    def add(self, step: Step, ntokens: float, src_tokens: float, seconds: float) -> None:
        self.window_loss += torch.where(step.finite, step.loss_sums, 0.0)  # no read-back
        self.window_gnorm += torch.where(step.finite, step.gnorm.double(), 0.0)
        if not self.first_update:
            for d in (self.timed, self.window):
                d["seconds"] += seconds
                d["updates"] += 1
                d["src"] += src_tokens
                d["tgt"] += ntokens
        else:
            self.first_update_seconds = seconds
        self.first_update = False

    def good_update(self, ntokens: float) -> None:
        """An update of the window turned out finite (known once settled)."""
        self.window["tokens"] += ntokens
        self.window["finite"] += 1

    def eta(self, remaining_updates: Optional[int], time_left: Optional[float]) -> Optional[float]:
        eta = None
        if remaining_updates is not None and self.timed["updates"]:
            eta = remaining_updates * self.timed["seconds"] / self.timed["updates"]
        if time_left is not None:
            eta = min(eta if eta is not None else math.inf, max(0.0, time_left))
        return eta

    def speed(self, d: dict) -> dict:
        s = d["seconds"]
        return {"src_tok_s": d["src"] / s if s else None, "tgt_tok_s": d["tgt"] / s if s else None,
                "ups": d["updates"] / s if s else None}

    def take_window(self, env: distributed.Env, epoch: int, update: int, lr: float) -> Optional[dict]:
        """The log record of the window (None if all its updates were skipped); starts a new one.
        Every rank must call it: the loss sums are summed over ranks."""
        loss_sum, nll_sum = env.sum_tensor(self.window_loss).tolist()
        rec = None
        if self.window["finite"]:
            tok = self.window["tokens"]  # already summed over ranks
            rec = {"epoch": epoch, "update": update, "loss": loss_sum / tok, "nll": nll_sum / tok,
                   "ppl": math.exp(min(nll_sum / tok, 700.0)), "lr": lr,
                   "gnorm": self.window_gnorm.item() / self.window["finite"]}
            if self.window["seconds"] > 0:
                rec.update(self.speed(self.window))
            rec["elapsed"] = round(self.timed["seconds"], 1)
        self.window_loss.zero_()
        self.window_gnorm.zero_()
        self.window.update(seconds=0.0, updates=0, src=0.0, tgt=0.0, finite=0, tokens=0.0)
        return rec


@dataclasses.dataclass
class Loop:
    """What the loop carries from one update to the next, besides the position."""

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

    def elapsed(self) -> float:
        """Training wall time, earlier runs included."""
        return self.elapsed_before + time.monotonic() - self.start


def micro_batches(run: Run, order: np.ndarray, offset: Optional[int] = None) -> list[dict]:
    """This rank's collated micro-batches of the update at ``offset`` (default: the next one); on
    CUDA in pinned memory, so that train_step's copies to the device are asynchronous."""
    offset = run.pos.batch_offset if offset is None else offset
    share = update_batches(order, offset, run.o.update_freq, run.env.rank, run.env.world_size)
    micro = [collate([run.train_set[i] for i in run.batches[b]]) for b in share]
    if run.env.device.type == "cuda":
        micro = [{k: v.pin_memory() if torch.is_tensor(v) else v for k, v in b.items()} for b in micro]
    return micro


class Prefetch:
    """On CUDA, collates the next update's micro-batches in a background thread while the GPU
    trains on this one (numpy's gathers and copies release the GIL for most of that work). On a
    CPU the cores that would collate are the ones computing, so it collates when asked. The
    batches are the same whichever thread made them, so resuming stays exact."""

    def __init__(self, run: Run, background: Optional[bool] = None):
        self.run = run
        background = run.env.device.type == "cuda" if background is None else background
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="xf-collate") if background else None
        self.ahead = None  # ((epoch, offset), future of its micro-batches)
        self.orders: dict[int, np.ndarray] = {}

    def order(self, epoch: int) -> np.ndarray:
        if epoch not in self.orders:
            self.orders = {epoch: epoch_order(len(self.run.batches), self.run.o.seed, epoch)}
        return self.orders[epoch]

    def take(self, epoch: int, offset: int) -> list[dict]:
        """The micro-batches of the update at ``offset`` of ``epoch``; starts collating the next."""
        if self.ahead is not None and self.ahead[0] == (epoch, offset):
            micro = self.ahead[1].result()
        else:
            micro = micro_batches(self.run, self.order(epoch), offset)
        if self.pool is not None:
            offset += self.run.per_update
            if offset >= len(self.run.batches):
                epoch, offset = epoch + 1, 0
            self.ahead = ((epoch, offset), self.pool.submit(micro_batches, self.run, self.order(epoch), offset))
        return micro

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)


def settle(run: Run, report: Reporter, loop: Loop, meter: Meter) -> None:
    """Read back which of the updates since the last call were skipped (one transfer from the
    device, at log intervals and before validating or saving, so that updates never wait for the
    device), then, update by update: count them, warn, and stop with the last good checkpoint
    when --max-nan-updates skipped updates come in a row."""
    if not loop.pending:
        return
    pending, loop.pending = loop.pending, []
    finite = torch.stack([step.finite for _, step, _ in pending]).tolist()
    scaler = run.scaler
    scales = (torch.stack([torch.stack([step.scale, step.next_scale]) for _, step, _ in pending]).tolist()
              if scaler.is_enabled() else [None] * len(pending))
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
        if loop.bad_in_a_row >= run.o.max_nan_updates:
            what = (f"fp16 gradient overflows (the loss scale fell to {scale[1]:g})"
                    if scale is not None else "non-finite losses or gradients")
            raise XfError(
                f"{loop.bad_in_a_row} consecutive updates with {what}, the last at update {n:,}: training "
                f"diverged. Last good checkpoint: {loop.last_good or 'none written yet'}. Try a lower --lr, "
                "a longer --warmup-updates, --clip-norm, or another --precision"
            )


def train_loop(run: Run, report: Reporter, stop: StopSignal) -> tuple[Loop, Meter]:
    """Train until the policy says stop or a signal comes: for each update, the step, then what
    the policy asks for (log, validate, save)."""
    o, env, pos = run.o, run.env, run.pos
    loop, meter = Loop(run.elapsed_before), Meter(env.device)
    prefetch = Prefetch(run)
    time_limit = 3600.0 * o.stop_time_hours
    report.start(run.total_updates, pos.num_updates, pos.epoch)
    while loop.stop_reason is None:
        epoch = pos.epoch
        order = epoch_order(len(run.batches), o.seed, epoch)
        while pos.epoch == epoch and loop.stop_reason is None:
            t0 = time.perf_counter()
            micro = prefetch.take(epoch, pos.batch_offset)
            # One collective per update: the token counts of all ranks (to normalize the gradient
            # by the whole update's target tokens) and whether a rank was signalled. Rank 0's
            # clock decides --stop-time-hours for all: this update is the last.
            ntokens, src_tokens, signalled, out_of_time = env.sum(
                [sum(b["ntokens"] for b in micro), sum(b["src_tokens"] for b in micro), stop.signum,
                 int(env.is_main and bool(time_limit) and loop.elapsed() >= time_limit)])
            if signalled:
                loop.stop_reason = "signal"
                break
            lr = learning_rate(pos.num_updates + 1, o.lr_scheduler, run.cfg.d_model, o.warmup_updates,
                               o.lr_factor if o.lr_scheduler == "noam" else o.lr, o.warmup_init_lr)
            torch.manual_seed(dropout_seed(o.seed, epoch, pos.batch_offset, env.rank))
            step = train_step(run.model, run.forward, run.optimizer, run.scaler, micro,
                              grad_scale=env.world_size / ntokens, lr=lr, autocast=run.autocast,
                              label_smoothing=o.label_smoothing, clip_norm=o.clip_norm)
            pos.num_updates += 1
            pos.batch_offset = min(pos.batch_offset + run.per_update, len(order))
            meter.add(step, ntokens, src_tokens, time.perf_counter() - t0)
            loop.pending.append((pos.num_updates, step, ntokens))
            remaining = run.total_updates - pos.num_updates if run.total_updates else None
            report.advance(pos.num_updates, epoch,
                           meter.eta(remaining, time_limit - loop.elapsed() if time_limit else None))
            end_of_epoch = pos.batch_offset >= len(order)
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
        plan = plan_after_validation(run.o, plan, after, improved, run.pos.bad_validations)
    if plan.save:
        written = save(run, [*plan.checkpoints, "checkpoint_last.pt"], loop.last_valid, loop.elapsed())
        loop.saved_at, loop.last_save_time = run.pos.num_updates, time.monotonic()
        if loop.bad_in_a_row == 0:
            loop.last_good = f"{written} (update {run.pos.num_updates:,})"
    loop.stop_reason = plan.stop


# -- the command -------------------------------------------------------------------------------
def train(options: TrainOptions) -> dict:
    """Train as ``options`` say; returns the final summary (also the last line of train_log.jsonl)."""
    env = distributed.setup(options.device, options.ddp_timeout_minutes)
    try:
        # --precision auto becomes what this device runs best; the run (and its config.yaml) says which
        options = dataclasses.replace(options, precision=choose_precision(options.precision, env.device))
        check_precision(options, env.device)
        resume = f"Start every node again to resume from {Path(options.save_dir) / 'checkpoint_last.pt'}"
        with StopSignal() as stop, distributed.peer_failures(env, resume), \
                SaveDirLock(options.save_dir, env.is_main) as lock:  # one run per save dir
            run = set_up(options, env, lock)
            done = already_done(run)
            if done:
                run.console.print(done)
                return {"num_updates": run.pos.num_updates, "epoch": run.pos.epoch, "stop_reason": "already done"}
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
    o, pos, device = run.o, run.pos, run.env.device
    report.stop()
    stop_reason = loop.stop_reason
    if stop_reason == "signal":
        stop_reason = f"signal {signal.Signals(int(stop.signum or signal.SIGTERM)).name}"
    seconds = meter.timed["seconds"]
    summary = {
        "stop_reason": stop_reason, "num_updates": pos.num_updates, "epoch": pos.epoch,
        "best": pos.best, "best_metric": "bleu" if o.eval_bleu else "loss", "valid": loop.last_valid,
        "skipped_updates": loop.skipped, "train_seconds": round(seconds, 3), **meter.speed(meter.timed),
        "peak_memory_mib": round(peak_memory_mib(device), 1),
    }
    if o.compile:  # compiling is the first update's time, kept apart from the speed above
        summary.update(compile_seconds=round(meter.first_update_seconds or 0.0, 2), compiled_graphs=compiled_graphs())
    report.record("summary", summary)
    report.table("training summary", [
        ("stopped", stop_reason),
        ("updates", f"{pos.num_updates:,} (epoch {pos.epoch if pos.batch_offset else pos.epoch - 1} "
                    f"{'in progress' if pos.batch_offset else 'done'})"),
        (f"best validation {summary['best_metric']}", f"{pos.best:.3f}" if pos.best is not None else "-"),
        ("skipped updates", loop.skipped),
        ("training time", format_seconds(seconds) + " (excluding start-up and validation)"),
        ("speed", f"{summary['src_tok_s']:,.0f} src tok/s, {summary['tgt_tok_s']:,.0f} tgt tok/s, "
                  f"{summary['ups']:.2f} upd/s" if seconds else "- (the first update is not timed)"),
        *([("compile", f"{summary['compile_seconds']:.1f} s (the first update), {summary['compiled_graphs']} "
                       "graph(s)")] if o.compile else []),
        ("peak memory", f"{summary['peak_memory_mib']:,.0f} MiB ({'CUDA allocated' if device.type == 'cuda' else 'RSS'})"),
        ("checkpoints", str(run.save_dir)),
    ])
    report.close()
    if stop_reason.startswith("signal"):
        # Another rank may have been the one signalled; exit as a signalled process would.
        signum = int(stop.signum or signal.SIGTERM)
        run.console.print(f"stopped by {signal.Signals(signum).name} after update {pos.num_updates:,}; "
                          f"{run.save_dir / 'checkpoint_last.pt'} is saved. Resume by running the same "
                          "command again.")
        raise SystemExit(128 + signum)
    return summary
