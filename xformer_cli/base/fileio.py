"""Atomic file writes (a crash, kill -9 or full disk never leaves a half-written file behind), and
the one reader of text files line by line as sacreBLEU reads them (`read_lines`).

A file written here gets the permissions any other tool would give it (0666 less the umask, or
the mode of the file it replaces), and a failed write is an XfError that names the file and the
cause ("no space left on device"), with the previous content of the file intact.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import os
import shutil
import signal
import stat
import tempfile
import threading
from pathlib import Path
from typing import IO, Iterator, Optional

from .errors import XfError
from .safety import directory_target, output_route, refuse_running_training

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
def _streamed(path: Path, mode: str, encoding: Optional[str]) -> Iterator[IO]:
    """``path`` opened in place for appending (``output_route``'s stream); a failed write names it."""
    with reporting_write_errors(path):
        with open(path, mode.replace("w", "a"), encoding=encoding) as f:
            yield f


@contextlib.contextmanager
def atomic_write(path: str | Path, mode: str = "wb", encoding: str | None = None) -> Iterator[IO]:
    """Write to a temporary file beside ``path``, fsync, then rename over ``path``.

    On any exception the temporary file is removed and ``path`` keeps its previous content; an
    OSError (a full disk) becomes an XfError naming ``path``. A symlink is written through (its
    target replaced); a FIFO or device is written in place (``output_route``).
    """
    route, path = output_route(path)
    if route == "stream":
        with _streamed(path, mode, encoding) as f:
            yield f
        return
    with reporting_write_errors(path):
        fd, tmp = tempfile.mkstemp(prefix=temporary_prefix(path), suffix=".tmp", dir=path.parent)
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
    remove_stale_temporaries_of(path)


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


def temporary_prefix(path: str | Path) -> str:
    """The name prefix of this process's temporaries for ``path``: ``.NAME.PID.`` (they end in
    ``.tmp``), so that a later run can tell a dead writer's leftovers from a live writer's files."""
    return f".{Path(path).name}.{os.getpid()}."


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def remove_stale_temporaries_of(path: str | Path) -> list[Path]:
    """Remove the temporary files and directories of ``path`` (``.NAME.PID.*.tmp`` beside it)
    that a writer killed by kill -9, or signalled before its clean-up was in place, left behind:
    those whose process is gone. Called after each successful write of ``path``. A writer on
    another host (NFS) is not seen: a live one there would find its temporary gone and fail."""
    path = Path(path)
    removed = []
    for p in path.parent.glob(f".{glob.escape(path.name)}.*.tmp"):
        pid = p.name[len(path.name) + 2:].split(".", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid() or _alive(int(pid)):
            continue
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
            removed.append(p)
    return removed


@contextlib.contextmanager
def stop_signals_deferred() -> Iterator[None]:
    """SIGINT and SIGTERM that arrive inside the ``with`` take effect at its end, handled then as
    they would have been (in a thread other than the main one, where handlers cannot be changed,
    nothing is deferred). Blocking them (pthread_sigmask) is not enough: the kernel hands a
    signal to any thread that does not block it, and torch has many."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    previous = {s: signal.signal(s, lambda signum, frame: pending.append(signum)) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        for s in dict.fromkeys(pending):
            signal.raise_signal(s)


def replace_path(new: Path, target: Path) -> None:
    """Put ``new`` (a finished file or directory beside ``target``) in the place of ``target``,
    which may be a directory: the old one is renamed aside, the new one renamed in, and only then
    is the old one deleted. SIGINT and SIGTERM wait while the two renames run, so that a signal
    never leaves neither in place; a failed second rename puts the old one back."""
    if not (target.exists() or target.is_symlink()):
        os.replace(new, target)
        return
    aside = target.parent / f"{temporary_prefix(target)}old.tmp"
    with stop_signals_deferred():
        os.rename(target, aside)
        try:
            os.replace(new, target)
        except BaseException:
            os.rename(aside, target)
            raise
    shutil.rmtree(aside) if aside.is_dir() and not aside.is_symlink() else aside.unlink()


@contextlib.contextmanager
def atomic_directory(output: str | Path) -> Iterator[Path]:
    """A temporary directory beside ``output`` to fill, put in the place of ``output`` at the end.

    Whether ``output`` may be written at all is the frame's output guard's (``safety``), checked
    before the command started; here the parent must be writable, and a training that started
    meanwhile in or around ``output`` is refused before the swap. An old ``output`` is renamed
    aside and deleted only once the new one is in place (``replace_path``). On any exception the
    temporary directory is removed and ``output`` is as it was; after success, the leftovers of
    killed earlier writers of ``output`` are removed.
    """
    output = directory_target(output)
    parent = output.resolve().parent
    if not parent.is_dir():
        raise XfError(f"{output}: its directory does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise XfError(f"{output}: its directory {parent} is not writable")
    try:
        tmp = Path(tempfile.mkdtemp(prefix=temporary_prefix(output), suffix=".tmp", dir=parent))
    except OSError as e:
        raise XfError(f"{output}: cannot write there: {e.strerror}") from None
    try:
        tmp.chmod(0o777 & ~current_umask())  # mkdtemp makes it private; the result is an ordinary directory
        with reporting_write_errors(output):
            yield tmp
            refuse_running_training(output)
            replace_path(tmp, output)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    fsync_dir(parent)
    remove_stale_temporaries_of(output)


def read_lines(path: str | Path | None, stream: Optional[IO[bytes]] = None) -> list[str]:
    """The lines of a UTF-8 file (or of the byte ``stream`` when path is None), right-stripped.

    Lines are split on "\\n" only and right-stripped, exactly as the ``sacrebleu`` command reads
    its files, so scores agree with it to the last digit. Empty lines are kept (they score 0).
    """
    name = str(path) if path is not None else "<stdin>"
    if path is None:
        raw = stream.read() if stream is not None else b""
    else:
        try:
            raw = Path(path).read_bytes()
        except FileNotFoundError:
            raise XfError(f"{name}: file not found") from None
        except IsADirectoryError:
            raise XfError(f"{name}: is a directory, expected a text file") from None
        except OSError as e:
            raise XfError(f"{name}: cannot read: {e.strerror or e}") from None
    lines = raw.split(b"\n")
    if lines[-1] == b"":
        lines.pop()  # the newline that ends the last line does not start another
    out = []
    for lineno, line in enumerate(lines, 1):
        try:
            out.append(line.decode("utf-8").rstrip())
        except UnicodeDecodeError as e:
            raise XfError(f"{name}:{lineno}: invalid UTF-8 ({e.reason} at byte {e.start})") from None
    return out
