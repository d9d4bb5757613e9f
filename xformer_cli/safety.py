"""Guards against losing work: one training run per save directory, no output over an input.

``SaveDirLock`` takes an exclusive ``fcntl.flock`` on ``SAVE_DIR/train.lock`` for a whole
``xf train`` run. The kernel drops the lock when the process ends however it ends (kill -9
included), so there is never a stale lock to delete by hand; the file itself stays and only says
who held it last. On NFS, Linux maps flock onto NFS byte-range locks, so two nodes sharing a save
directory exclude each other too.
"""

from __future__ import annotations

import errno
import os
import socket
from pathlib import Path
from typing import Iterable, Optional

from .errors import XfError

LOCK_NAME = "train.lock"


class SaveDirLock:
    """An exclusive lock on ``SAVE_DIR/train.lock``, held from ``acquire`` to the end of the ``with``.

    Entering takes it at once when the save dir exists (a re-queued job finds its own directory:
    it fails before reading any data); otherwise ``acquire`` takes it once set-up has created the
    directory, so that bad options never leave an empty one behind. A second holder fails with an
    XfError naming the process that has it. ``enabled`` False (ranks but the main one): no lock.
    """

    def __init__(self, save_dir: str | Path, enabled: bool = True):
        self.save_dir, self.enabled, self.fd = Path(save_dir), enabled, None

    def __enter__(self) -> "SaveDirLock":
        if self.save_dir.is_dir():
            self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        if self.fd is not None:
            os.close(self.fd)  # releases the lock; the file stays (deleting it would race)
            self.fd = None

    def acquire(self) -> None:
        if not self.enabled or self.fd is not None:
            return
        import fcntl

        path = self.save_dir / LOCK_NAME
        try:
            self.save_dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise XfError(f"save dir {self.save_dir} is not writable: {e.strerror or e}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            holder = os.pread(fd, 200, 0).decode("utf-8", "replace").strip() or "another process"
            os.close(fd)
            if e.errno not in (errno.EWOULDBLOCK, errno.EACCES):
                raise XfError(f"{path}: cannot lock the save dir: {e.strerror}") from None
            raise XfError(f"save dir {self.save_dir} is in use by another xf train ({holder}); wait for it to "
                          "end or pass another --save-dir") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
        self.fd = fd


def save_dir_holder(save_dir: str | Path) -> Optional[str]:
    """Who holds ``SAVE_DIR/train.lock`` ("pid 123 on host"), or None when no xf train does."""
    import fcntl

    try:
        fd = os.open(Path(save_dir) / LOCK_NAME, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno in (errno.EWOULDBLOCK, errno.EACCES):
            return os.pread(fd, 200, 0).decode("utf-8", "replace").strip() or "another process"
        return None
    finally:
        os.close(fd)  # also drops the shared lock just taken
    return None


def refuse_replacing(output: str | Path, inputs: Iterable[Optional[str | Path]], output_flag: str = "--output") -> None:
    """An XfError when replacing ``output`` (a file, or a directory and all it holds) would destroy
    an input or a running training: ``output`` is or contains one of ``inputs`` (a hard link
    included), or is, contains or is inside a save dir whose ``train.lock`` an xf train holds."""
    out = Path(output).resolve()
    for source in inputs:
        if source is None:
            continue
        src = Path(source).resolve()
        if same_file(out, src) or src.is_relative_to(out):
            raise XfError(f"{output_flag} {output} {_relation(out, src)} the input {source}; replacing it would "
                          "destroy the input (choose another output)")
    candidates = [out, *out.parents]
    if out.is_dir():
        candidates += [Path(root) for root, _, files in os.walk(out) if LOCK_NAME in files]
    for save_dir in candidates:
        holder = save_dir_holder(save_dir)
        if holder:
            raise XfError(f"{output_flag} {output} {_relation(out, save_dir)} the save dir {save_dir} of a running "
                          f"xf train ({holder}); choose another output")


def _relation(out: Path, other: Path) -> str:
    if other != out and other.is_relative_to(out):
        return "holds"
    return "is inside" if other != out and out.is_relative_to(other) else "is"  # "is": also a hard link


def same_file(a: str | Path, b: str | Path) -> bool:
    """Whether two paths name one existing file (through symlinks, hard links, relative paths)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def refuse_overwriting_inputs(output: Optional[str | Path], inputs: Iterable[Optional[str | Path]],
                              output_flag: str = "--output") -> None:
    """An XfError when ``output`` is one of ``inputs`` (it would be replaced while, or before, it is read)."""
    if output is None:
        return
    for source in inputs:
        if source is not None and same_file(output, source):
            raise XfError(f"{output_flag} {output} is the input {source}; writing it would destroy the input "
                          "(choose another output file)")
