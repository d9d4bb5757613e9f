"""Atomic file writes: a crash, kill -9 or full disk never leaves a half-written file behind.

A file written here gets the permissions any other tool would give it (0666 less the umask, or
the mode of the file it replaces), and a failed write is an XfError that names the file and the
cause ("no space left on device"), with the previous content of the file intact.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import tempfile
import threading
from pathlib import Path
from typing import IO, Iterator

from .errors import XfError

_umask_lock = threading.Lock()


def current_umask() -> int:
    """The process's umask (reading it means setting it: os.umask has no read-only form)."""
    with _umask_lock:
        mask = os.umask(0o022)
        os.umask(mask)
    return mask


def write_error(path: str | Path, e: OSError) -> XfError:
    """The one-line error of a failed write to ``path``: ``cannot write PATH: no space left on device``."""
    reason = os.strerror(e.errno) if e.errno else str(e)
    return XfError(f"cannot write {path}: {reason[:1].lower()}{reason[1:]}")


DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


@contextlib.contextmanager
def reporting_write_errors(path: str | Path) -> Iterator[None]:
    """Turn an OSError raised while writing ``path`` (its temporary file, or the files inside a
    directory ``path``) into ``write_error``'s XfError: a full disk, or an error of a write
    (which names no file). An error that names another file passes through unchanged."""
    path = Path(path)
    try:
        yield
    except OSError as e:
        ours = e.filename is None or Path(e.filename).name.startswith((path.name, f".{path.name}."))
        if not ours and e.errno not in DISK_FULL:
            raise
        raise write_error(path, e) from None


def fsync_dir(path: Path) -> None:
    """Make a rename inside ``path`` durable (no-op where directories cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _new_file_mode(path: Path) -> int:
    """What ``open(path, "w")`` would leave: the mode of the file replaced, else 0666 & ~umask."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        return 0o666 & ~current_umask()


@contextlib.contextmanager
def atomic_write(path: str | Path, mode: str = "wb", encoding: str | None = None) -> Iterator[IO]:
    """Write to a temporary file beside ``path``, fsync, then rename over ``path``.

    On any exception the temporary file is removed and ``path`` keeps its previous content; an
    OSError (a full disk) becomes an XfError naming ``path``.
    """
    path = Path(path)
    with reporting_write_errors(path):
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with reporting_write_errors(path):
            with os.fdopen(fd, mode, encoding=encoding) as f:
                os.fchmod(f.fileno(), _new_file_mode(path))  # mkstemp makes 0600 whatever the umask
                try:
                    yield f
                except RuntimeError as e:
                    # torch.save reports a failed write of its file object as "unexpected pos";
                    # the cause is in the file system: find it, to say it (a full disk, usually)
                    raise _disk_error(path, f, e) from None
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def _disk_error(path: Path, f: IO, e: RuntimeError) -> BaseException:
    """The OSError behind a RuntimeError raised while writing ``f`` (for ``path``), else ``e``."""
    cause = e.__cause__ or e.__context__
    if isinstance(cause, OSError):
        return write_error(path, cause)
    try:  # a write that failed inside C++ fails here too: this learns its errno
        f.flush()
        os.fsync(f.fileno())
    except OSError as oserror:
        return write_error(path, oserror)
    return e


def atomic_write_text(path: str | Path, text: str) -> None:
    with atomic_write(path, "w", encoding="utf-8") as f:
        f.write(text)


def remove_stale_temporaries(directory: Path) -> list[Path]:
    """Remove the temporary files that a killed atomic_write left in ``directory``.

    Only safe while no other process writes there (xf train holds the save directory's lock).
    """
    removed = []
    for p in directory.glob(".*.tmp"):
        with contextlib.suppress(FileNotFoundError):
            p.unlink()
            removed.append(p)
    return removed


def copy_atomic(src: Path, dst: Path) -> None:
    """Copy ``src`` to ``dst`` through an atomic write (a reader never sees half a copy)."""
    with open(src, "rb") as f, atomic_write(dst, "wb") as out:
        shutil.copyfileobj(f, out, 1 << 22)
