"""Training state: what a checkpoint holds besides the weights, as one object (JoeyNMT's
TrainManager state, torch's ``state_dict()``/``load_state_dict()``), so that saving and resuming
share one schema and a reader sees it in one place.

The schema (``train.state`` in a checkpoint; every key is read back by ``load_state_dict``
except ``options``, kept as the record of what the run was trained with):

    optimizer        the optimizer's state_dict (moments, step counts)
    scaler           the fp16 GradScaler's state_dict, or None
    rng              every global random generator (torch, CUDA, Python, numpy)
    position         Position: epoch, batch offset, updates, best score, bad validations
    num_batches      batches per epoch when saved: other batches restart the epoch on resume
    elapsed_seconds  training wall time so far (--stop-time-hours counts it)
    options          the effective options of the run
"""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from ..base.errors import XfError
from ..model.checkpoint import same_vocabulary
from ..model.transformer import ModelConfig, config_to_dict


@dataclasses.dataclass
class Position:
    """Where training stands: what a checkpoint must restore besides weights and optimizer."""

    epoch: int = 1
    batch_offset: int = 0  # batches of this epoch's shuffled order already trained on
    num_updates: int = 0
    best: Optional[float] = None  # lowest validation loss, or highest BLEU with --eval-bleu
    bad_validations: int = 0  # validations since the last improvement (--patience)


@dataclasses.dataclass
class TrainState:
    """Position, optimizer, loss scaler, random generators and wall time of a training run."""

    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    position: Position = dataclasses.field(default_factory=Position)
    elapsed_before: float = 0.0  # training wall time of earlier runs (restored on resume)
    num_batches: Optional[int] = None  # batches per epoch of the checkpoint resumed from

    def state_dict(self, *, elapsed_seconds: float, num_batches: int, options: dict) -> dict:
        """The ``train.state`` of a checkpoint, taken now (the RNG states included)."""
        return {
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler.is_enabled() else None,
            "rng": rng_states(),
            "position": dataclasses.asdict(self.position),
            "num_batches": num_batches,
            "elapsed_seconds": elapsed_seconds,
            "options": options,
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore a checkpoint's ``train.state`` (and the global random generators)."""
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scaler.is_enabled() and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        set_rng_states(state["rng"])
        self.position = Position(**state["position"])
        self.elapsed_before = float(state.get("elapsed_seconds", 0.0))
        self.num_batches = state.get("num_batches")


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


# The training options that regularize, beside the model's dropouts: a resume continues the run
# with the regularization it was trained with, as it does with the model's --dropout.
RESUME_REGULARIZATION = ("label_smoothing", "late_after", "late_dropout", "late_label_smoothing")


def check_resumable(ckpt: dict, path: Path, spm_model: bytes, data_path: Path, cfg: ModelConfig,
                    options: Optional[dict] = None) -> None:
    """A checkpoint to resume must hold training state and match the data's vocabulary, the model
    and (``options``: the run's effective options) the regularization it was trained with."""
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
    trained = ckpt["train_state"].get("options") or {}
    diffs += [f"{k} {trained.get(k)!r} there, {options[k]!r} here" for k in RESUME_REGULARIZATION
              if options is not None and k in trained and trained[k] != options.get(k)]
    if diffs:
        raise XfError(f"{path}: the checkpoint's model or regularization differs from the options ({'; '.join(diffs)}); "
                      "use the same options to resume, or another --save-dir")
