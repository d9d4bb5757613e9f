"""The set-up of a training run: data, model configuration, model, optimizer and what to resume
from, all checked before anything is written (``set_up``), and ``Run``, what the loop of ``xf
train`` trains with. Bench scripts set up the same run to time the same update.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import tempfile
from pathlib import Path
from typing import Callable, Optional

import torch
from rich.console import Console

from ..base import distributed
from ..base.compiling import compile_forward
from ..base.console import stderr_console, warn
from ..base.errors import XfError
from ..base.fileio import remove_stale_temporaries
from ..base.memory import bound_native_memory
from ..base.precision import autocast_context
from ..base.safety import SaveDirLock
from ..data.batching import EpochBatches, batch_by_size
from ..data.dataset import DataDir, ParallelDataset, check_trainable
from ..data.sampling import epoch_sampler, undrawn
from ..model.checkpoint import load_initial_model, load_last_checkpoint
from ..model.transformer import Transformer
from ..settings.config import to_dict
from ..settings.options import MODEL_OVERRIDES, ModelConfig, TrainOptions, model_config
from ..text.vocab import load_sentencepiece
from .schedule import make_schedule
from .state import TrainState, check_resumable
from .update import make_optimizer


def build_config(o: TrainOptions, data: DataDir) -> tuple[ModelConfig, Optional[dict]]:
    """The model that trains, built once: --init-from's (with its weights; --arch and the model
    options given must agree with it, but for its regularization), else the preset named by
    --arch with the model options given applied (and no weights)."""
    given = {name: getattr(o, name) for name in MODEL_OVERRIDES}
    if o.init_from:
        return load_initial_model(o.init_from, data.spm_model_bytes, data.path, given, o.arch)
    return model_config(o.arch or "base", vocab_size=data.vocab_size, **given), None


def effective_options(o: TrainOptions, cfg: ModelConfig) -> dict:
    """The options as run: model overrides left unset are filled with the model's values."""
    values = to_dict(o)
    values["arch"] = o.arch or (None if o.init_from else "base")
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


@dataclasses.dataclass
class Run:
    """Everything set up for training; ``state`` moves as it trains."""

    o: TrainOptions
    env: distributed.Env
    console: Console
    data: DataDir
    train_set: ParallelDataset
    valid_set: ParallelDataset
    batches: EpochBatches  # the training batches of every epoch
    valid_batches: list
    cfg: ModelConfig  # built once, here
    options_record: dict  # the effective options: config.yaml, the log's start record, checkpoints
    sp: object  # the sentencepiece processor (--eval-bleu), else None
    model: Transformer
    forward: torch.nn.Module  # the model, or DDP around it, maybe compiled
    state: TrainState
    autocast: contextlib.AbstractContextManager
    learning_rate: Callable[[int], float]  # of update n (1-based)

    @property
    def save_dir(self) -> Path:
        return Path(self.o.save_dir)

    @property
    def total_updates(self) -> Optional[int]:
        o, per_epoch = self.o, self.batches.updates_per_epoch()  # (a drawn epoch's varies a little: about)
        limits = [n for n in (o.max_update, o.max_epoch * per_epoch if o.max_epoch else 0) if n]
        return min(limits) if limits else None


def set_up(o: TrainOptions, env: distributed.Env, lock: SaveDirLock) -> Run:
    """Data, save dir, model configuration and what to resume from (all checked before anything
    is written), then model, optimizer and loss scaler (the same initial weights on every rank)."""
    bound_native_memory()  # before the first matmul: oneDNN reads its cache bound then
    console = stderr_console(quiet=not env.is_main)  # one line per record when stderr is a log file
    if o.threads:
        torch.set_num_threads(o.threads)
    data = DataDir.open(o.data)
    train_set = data.split("train")
    if "valid" not in data.splits:
        raise XfError(f"{data.path} has no validation split (run xf preprocess with --validpref)")
    valid_set = data.split("valid")
    cfg, init_weights = build_config(o, data)  # the one model configuration of the run: every check below uses it
    check_trainable(data, train_set, valid_set, cfg.max_positions)  # empty splits, pairs over max_positions
    # Batches of similar lengths up to --max-tokens, made once (each epoch shuffles their order), or
    # made per epoch from the pairs it draws across a multilingual corpus's directions (data/sampling.py)
    directions = data.directions("train")
    draw = epoch_sampler(list(directions.values()), data.sampling_temperature, o.seed) if directions else None
    left_out = [list(directions)[i] for i in undrawn(list(directions.values()), data.sampling_temperature)] \
        if directions else []
    if left_out:  # never silent: the run trains without them
        warn(f"{data.path / 'meta.json'}: sampling_temperature {data.sampling_temperature:g} draws no pair of "
             f"{', '.join(left_out)} in an epoch (below 1, the temperature favours the larger directions; 1 takes "
             "the data as it is)")
    batches = EpochBatches(train_set, o.max_tokens, seed=o.seed, update_freq=o.update_freq, rank=env.rank,
                           world_size=env.world_size, pin_memory=env.device.type == "cuda", draw=draw)
    valid_batches = batch_by_size(valid_set.src_sizes, valid_set.tgt_sizes, o.max_tokens)
    last_path = Path(o.save_dir) / "checkpoint_last.pt"
    ckpt = load_last_checkpoint(last_path) if last_path.exists() else None
    if ckpt is not None:
        check_resumable(ckpt, last_path, data.spm_model_bytes, data.path, cfg, effective_options(o, cfg))
    if env.is_main:
        prepare_save_dir(Path(o.save_dir))
        lock.acquire()
        remove_stale_temporaries(Path(o.save_dir))  # of atomic writes killed by kill -9 (safe: we hold the lock)
    sp = load_sentencepiece(data.spm_model_bytes, str(data.path / "spm.model")) if o.eval_bleu else None

    torch.manual_seed(o.seed)
    model = Transformer(cfg).to(env.device)
    state = TrainState(make_optimizer(model, o), torch.amp.GradScaler(env.device.type, enabled=o.precision == "fp16"))
    if ckpt is not None:
        model.load_state_dict(ckpt["model"])
        state.load_state_dict(ckpt["train_state"])
        if state.num_batches != batches.num_batches(state.position.epoch):
            console.print(f"[yellow]warning:[/yellow] the batches differ from those of {last_path} (another "
                          f"--max-tokens or data?): epoch {state.position.epoch} restarts from its beginning")
            state.position.batch_offset = 0
        del ckpt  # the weights now live in the model; do not hold a second copy
    elif init_weights is not None:
        model.load_state_dict(init_weights)
    del init_weights
    forward = model
    if env.distributed:
        from torch.nn.parallel import DistributedDataParallel as DDP

        forward = DDP(model, device_ids=[env.device.index] if env.device.type == "cuda" else None)
    if o.compile:
        forward = compile_forward(forward)
    schedule = make_schedule(o.lr_scheduler, cfg.d_model, o.warmup_updates,
                             o.lr_factor if o.lr_scheduler == "noam" else o.lr, o.warmup_init_lr)
    return Run(o, env, console, data, train_set, valid_set, batches, valid_batches, cfg, effective_options(o, cfg),
               sp, model, forward, state, autocast_context(o.precision, env.device), schedule)
