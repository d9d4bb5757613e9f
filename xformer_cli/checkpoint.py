"""Self-contained, versioned checkpoints that load without executing code.

A checkpoint is a plain dict of tensors and plain Python data, saved with torch.save and read
with ``torch.load(weights_only=True)``, so a malicious pickle is refused instead of run:

    format            "xf-checkpoint"
    version           CHECKPOINT_VERSION
    model_config      dict of ModelConfig fields
    model             state dict (tied weights stored once, shared on load)
    spm_model         bytes of the sentencepiece model (translation needs nothing else)
    spm_sha256        hex digest of spm_model (vocabulary identity)
    train_state       optional: optimizer, scheduler, scaler, RNG, data position, options, ...
    meta              optional plain dict (epoch, num_updates, validation loss, ...)
"""

from __future__ import annotations

import hashlib
import pickle
import re
import struct
import zipfile
from pathlib import Path
from typing import Any, Optional

import torch

from .errors import XfError
from .fileio import atomic_write
from .model import ModelConfig, Transformer, config_from_dict, config_to_dict

CHECKPOINT_FORMAT = "xf-checkpoint"
CHECKPOINT_VERSION = 1

# One function per version change: UPGRADES[v] turns a version-v dict into version v + 1.
UPGRADES: dict[int, Any] = {}


# checkpoint_<epoch>_<update>.pt: the numbered checkpoints that training writes and averaging reads
NUMBERED_NAME = re.compile(r"checkpoint_(\d+)_(\d+)\.pt")


def numbered_name(epoch: int, num_updates: int) -> str:
    return f"checkpoint_{epoch}_{num_updates}.pt"


def checkpoint_numbers(path: Path) -> Optional[tuple[int, int]]:
    """(epoch, update) of a file named checkpoint_<epoch>_<update>.pt, else None."""
    match = NUMBERED_NAME.fullmatch(path.name)
    return (int(match[1]), int(match[2])) if match else None


def spm_digest(spm_model: bytes) -> str:
    return hashlib.sha256(spm_model).hexdigest()


def make_checkpoint(
    model: Transformer,
    spm_model: bytes,
    train_state: Optional[dict] = None,
    meta: Optional[dict] = None,
) -> dict:
    """The checkpoint dict of ``model`` (unwrapped from DDP/compile by the caller)."""
    return {
        "format": CHECKPOINT_FORMAT,
        "version": CHECKPOINT_VERSION,
        "model_config": config_to_dict(model.cfg),
        "model": model.state_dict(),
        "spm_model": spm_model,
        "spm_sha256": spm_digest(spm_model),
        "train_state": train_state,
        "meta": dict(meta or {}),
    }


def save_checkpoint(path: str | Path, checkpoint: dict) -> None:
    """Atomic save: temporary file, fsync, rename. The previous file survives any crash."""
    with atomic_write(path, "wb") as f:
        torch.save(checkpoint, f)


def load_checkpoint(path: str | Path) -> dict:
    """Load and validate an xf checkpoint; refuse anything else with a clear error."""
    path = Path(path)
    if not path.is_file():
        raise XfError(f"{path}: checkpoint not found")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else "unsafe content"
        raise XfError(
            f"{path}: not a valid xf checkpoint (refused to load objects that could run code: {first})"
        ) from None
    # Garbage bytes fail deep inside the unpickler with almost any error (struct.error, IndexError, ...).
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError, ValueError, struct.error, IndexError, KeyError) as e:
        raise XfError(f"{path}: not a valid xf checkpoint (corrupt or truncated: {e})") from None
    if not isinstance(ckpt, dict) or ckpt.get("format") != CHECKPOINT_FORMAT:
        raise XfError(f"{path}: not an xf checkpoint")
    version = ckpt.get("version")
    if not isinstance(version, int) or version > CHECKPOINT_VERSION:
        raise XfError(
            f"{path}: checkpoint format version {version} is newer than this xf "
            f"(reads up to {CHECKPOINT_VERSION}); upgrade xf"
        )
    while version < CHECKPOINT_VERSION:
        ckpt = UPGRADES[version](ckpt)
        version = ckpt["version"]
    for key in ("model_config", "model", "spm_model"):
        if key not in ckpt:
            raise XfError(f"{path}: xf checkpoint is missing '{key}'")
    return ckpt


def model_from_checkpoint(ckpt: dict, path: str | Path = "checkpoint") -> Transformer:
    """Rebuild the model of a loaded checkpoint with its weights."""
    try:
        cfg: ModelConfig = config_from_dict(ckpt["model_config"])
        model = Transformer(cfg)
        model.load_state_dict(ckpt["model"])
    except (XfError, RuntimeError, TypeError) as e:
        raise XfError(f"{path}: model does not match its configuration: {e}") from None
    return model
