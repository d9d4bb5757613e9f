"""The names of the checkpoints xf train writes: what the output guard (``safety``, which must
not import torch) and the checkpoint code (``checkpoint``) both know."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Optional

# checkpoint_<epoch>_<update>.pt: the numbered checkpoints that training writes and averaging reads
NUMBERED_NAME = re.compile(r"checkpoint_(\d+)_(\d+)\.pt")


def numbered_name(epoch: int, num_updates: int) -> str:
    return f"checkpoint_{epoch}_{num_updates}.pt"


def checkpoint_numbers(path: Path) -> Optional[tuple[int, int]]:
    """(epoch, update) of a file named checkpoint_<epoch>_<update>.pt, else None."""
    match = NUMBERED_NAME.fullmatch(path.name)
    return (int(match[1]), int(match[2])) if match else None


def is_training_checkpoint(path: Path) -> bool:
    """Whether ``path`` is named as the checkpoints xf train writes (and resumes from)."""
    return path.name in ("checkpoint_last.pt", "checkpoint_best.pt") or checkpoint_numbers(path) is not None
