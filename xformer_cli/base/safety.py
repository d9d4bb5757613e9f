"""Guards against losing work: one training run per save directory, no output over an input.

``SaveDirLock`` takes an exclusive ``fcntl.flock`` on ``SAVE_DIR/train.lock`` for a whole
``xf train`` run. The kernel drops the lock when the process ends however it ends (kill -9
included), so there is never a stale lock to delete by hand; the file itself stays and only says
who held it last. On NFS, Linux maps flock onto NFS byte-range locks, so two nodes sharing a save
directory exclude each other too.
"""

from __future__ import annotations

import errno
import io
import os
import socket
import stat
import sys
from pathlib import Path
from typing import Optional

from .checkpoint_names import is_training_checkpoint
from .errors import ConfigError, XfError

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


# -- where an output goes: replaced (a file), streamed (a FIFO, a device, a descriptor) or refused --
def _descriptor(path: Path) -> bool:
    """Whether ``path`` names an open file by its descriptor (/dev/stdout, /dev/fd/1,
    /proc/self/fd/1): the file the shell opened, to write where it stands, not a name to replace."""
    name = str(path)
    return name.startswith(("/dev/fd/", "/dev/stdout", "/dev/stderr")) or (name.startswith("/proc/") and "/fd/" in name)


def _link_chain(path: Path) -> list[Path]:
    """``path`` and every path its symlinks lead to, in order (at most 40 links, as the kernel)."""
    chain = [path]
    while chain[-1].is_symlink() and len(chain) <= 40:
        link = Path(os.readlink(chain[-1]))
        chain.append(link if link.is_absolute() else chain[-1].parent / link)
    return chain


def special_kind(path: str | Path) -> Optional[str]:
    """What an existing ``path`` (symlinks followed) is when it is neither a regular file nor a
    directory ("a FIFO", "a character device", "a block device", "a socket"), else None."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return None


def output_route(path: str | Path) -> tuple[str, Path]:
    """How an output file is written, the one rule of every command (the guard, ``safety``, asks
    it first): ("stream", path) for an existing FIFO or character device, or an open file named
    through /dev or /proc (``/dev/stdout``, ``/proc/self/fd/1``, directly or by a symlink):
    written in place, appended to as the shell's ``>>`` (renaming over it would replace the
    system's /dev/null, or leave a FIFO's reader waiting); ("replace", target) for anything
    else: ``target`` is the final target of a symlink (the link stays, as the shell writes through
    it), else ``path``. An XfError for a block device or a socket."""
    path = Path(path)
    kind = special_kind(path)
    if kind in ("a block device", "a socket"):
        raise XfError(f"{path}: is {kind}; xf writes files, FIFOs and character devices only")
    chain = _link_chain(path)
    if kind or (path.exists() and any(map(_descriptor, chain))):
        return "stream", path
    return "replace", Path(os.path.realpath(path)) if len(chain) > 1 else path


def directory_target(output: str | Path) -> Path:
    """Where a directory output goes: through a symlink to its target (the link stays); an
    XfError for an existing path that is not a directory or regular file (a FIFO, a device)."""
    kind = special_kind(output)
    if kind:
        raise XfError(f"{output}: is {kind}, not a directory")
    return Path(os.path.realpath(output)) if Path(output).is_symlink() else Path(output)


INTO = ("into", "locked")  # the output kinds written into, not replaced


def refuse_unsafe_outputs(outputs: list[tuple[str, str, str]], inputs: list[tuple[str, str, str]],
                          overwrite: Optional[bool] = None, stdin: bool = False) -> None:
    """The output guard the frame applies to every command before it starts (``frame.check_outputs``).

    ``outputs``: (flag, path, kind) with kind ``file`` or ``directory`` (replaced whole),
    ``stdout`` (a file, or ``-`` for stdout), ``into`` (written into) or ``locked`` (written into
    under the command's own lock: xf train's save dir); ``inputs``: (flag, path,
    kind) with kind ``file``, ``directory`` or ``path`` (either; a directory given for a file is
    the command's error); ``stdin``: the command reads stdin. A ConfigError of one line when an
    output is, holds or lies inside an input (symlinks resolved; a hard link is the file it
    links; stdin's file included), is, holds or lies inside the save dir of a running xf train,
    or is or holds a training checkpoint (only xf train writes those): each even with
    ``--overwrite``. A new file inside an input directory is no harm unless it takes a name that
    a data directory or a training reads (``reserved_name``). A FIFO or character device (or a
    descriptor, /dev/stdout) is written in place, never replaced (``fileio.output_route``); a
    block device, a socket, or one of those for a directory, is refused. ``overwrite`` (None:
    the command has no such option and replaces its outputs freely) False: an existing file, or a
    directory that is not empty, is refused. A file output's directory must exist.
    """
    for flag, output, kind in outputs:
        if kind == "stdout" and output == "-":
            continue  # the command writes to stdout
        if output == "-":
            raise ConfigError(f"{flag} -: this output is a {'directory' if kind != 'file' else 'file'}; xf writes "
                              "only translations and scores to stdout (name a path)")
        _refuse_stdin(flag, output, stdin)
        if _route(flag, output, kind) == "stream":
            continue
        _refuse_over_input(flag, output, kind, inputs)
        _refuse_over_training(flag, output, kind)
        if kind not in INTO:
            _refuse_replacing(flag, output, kind, overwrite)


def _route(flag: str, output: str, kind: str) -> str:
    """``fileio.output_route`` of a file output ("stream" or "replace"); a ConfigError for what
    no output can be (a socket, a block device) and for a FIFO or device given for a directory."""
    if kind == "directory" or kind in INTO:
        special = special_kind(output)
        if special:
            raise ConfigError(f"{flag} {output}: is {special}, not a directory")
        return "replace"
    try:
        return output_route(output)[0]
    except XfError as e:
        raise ConfigError(f"{flag} {e}") from None


def _refuse_stdin(flag: str, output: str, stdin: bool) -> None:
    """A ConfigError when the command reads stdin and stdin is the file ``output`` names."""
    if not stdin:
        return
    try:
        read = os.fstat(sys.stdin.fileno())
        written = os.stat(output)
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):  # no such output, or no stdin file
        return
    if stat.S_ISREG(read.st_mode) and (read.st_dev, read.st_ino) == (written.st_dev, written.st_ino):
        raise ConfigError(f"{flag} {output} is the input stdin; writing it could destroy the input "
                          "(choose another output)")


def _refuse_over_input(flag: str, output: str, kind: str, inputs: list[tuple[str, str, str]]) -> None:
    path = Path(output)
    out = path.resolve()
    for in_flag, source, in_kind in inputs:
        if not os.path.lexists(source):
            continue  # a missing input is the command's own error, named as it reads it
        relation = _relation_to_input(path, out, Path(source), directory=in_kind != "file")
        if relation == "lies inside" and kind in ("file", "stdout") and not os.path.lexists(path) \
                and not reserved_name(path.name):
            continue  # a new file beside what the command reads: nothing to destroy (avg.pt in a save dir)
        if relation:
            raise ConfigError(f"{flag} {output} {relation} the input {in_flag} {source}; writing it could "
                              "destroy the input (choose another output)")


def _refuse_over_training(flag: str, output: str, kind: str) -> None:
    """Every output against a running xf train: its save dir, a parent of it or (a directory to
    replace) a directory that holds one. xf train's own --save-dir is the lock's (SaveDirLock)."""
    out = Path(output).resolve()
    running = _running_training(out, walk=kind not in INTO, itself=kind != "locked")
    if running:
        save_dir, holder = running
        raise ConfigError(f"{flag} {output} {_relation(out, save_dir)} the save dir {save_dir} of a running "
                          f"xf train ({holder}); choose another output")


def _refuse_replacing(flag: str, output: str, kind: str, overwrite: Optional[bool]) -> None:
    out = Path(output).resolve()
    checkpoint = _training_checkpoint_at(out)
    if checkpoint is not None:
        raise ConfigError(f"{flag} {output} {_relation(out, checkpoint)} the training checkpoint {checkpoint}; "
                          "only xf train replaces one (xf train resumes from it; choose another output)")
    if kind != "directory" and out.is_dir():
        raise ConfigError(f"{flag} {output}: is a directory, not a file")
    if kind == "directory" and out.is_file() and not overwrite:
        raise ConfigError(f"{flag} {output}: exists and is a file, not a directory"
                          + (" (pass --overwrite to replace it)" if overwrite is False else ""))
    if overwrite is False and (out.is_file() or (out.is_dir() and any(out.iterdir()))):
        what = "exists" if out.is_file() else "exists and is not empty"
        raise ConfigError(f"{flag} {output}: {what} (pass --overwrite to replace it)")
    if kind != "directory" and not out.parent.is_dir():
        raise ConfigError(f"{flag} {output}: its directory does not exist")


# Names that a data directory or a training reads or writes: a new file of one of these inside
# an input directory could be read as the input (or replaced by the training) next time.
RESERVED_NAMES = ("meta.json", "spm.model", "spm.vocab", LOCK_NAME, "train_log.jsonl", "config.yaml")


def reserved_name(name: str) -> bool:
    return name in RESERVED_NAMES or name.endswith((".bin", ".idx")) or is_training_checkpoint(Path(name))


def _relation_to_input(path: Path, out: Path, source: Path, directory: bool) -> Optional[str]:
    """How output ``path`` (``out`` resolved) meets input ``source``: "is", "holds", "lies inside",
    "is a hard link to a file of", or None. Only an input that may be a directory (``directory``)
    has an inside."""
    src = source.resolve()
    if out == src or same_file(path, source):
        return "is"
    if src.is_relative_to(out):
        return "holds"
    if not (directory and src.is_dir()):
        return None
    if out.is_relative_to(src):
        return "lies inside"
    if path.is_file() and path.stat().st_nlink > 1:  # a hard link placed elsewhere
        inode = path.stat().st_ino, path.stat().st_dev
        for root, _, files in os.walk(src):
            if any((s.st_ino, s.st_dev) == inode for s in (os.stat(Path(root, f)) for f in files)):
                return "is a hard link to a file of"
    return None


def _running_training(out: Path, walk: bool, itself: bool = True) -> Optional[tuple[Path, str]]:
    """(save dir, holder) of a running xf train whose save dir is ``out`` (``itself``), one of its
    parents or (``walk``: a directory to replace whole) inside it; None when there is none."""
    candidates = [out, *out.parents] if itself else list(out.parents)
    if walk and out.is_dir():
        candidates += [Path(root) for root, _, files in os.walk(out) if LOCK_NAME in files]
    for save_dir in candidates:
        holder = save_dir_holder(save_dir)
        if holder:
            return save_dir, holder
    return None


def _training_checkpoint_at(out: Path) -> Optional[Path]:
    """``out`` when it is a training checkpoint, or the first one inside the directory ``out``."""
    if not out.exists():
        return None
    if out.is_file():
        return out if is_training_checkpoint(out) else None
    if out.is_dir():
        for root, _, files in os.walk(out):
            for name in sorted(files):
                if is_training_checkpoint(Path(name)):
                    return Path(root, name)
    return None


def refuse_running_training(output: str | Path) -> None:
    """An XfError when replacing ``output`` would destroy a running training: the last check
    before a directory is swapped into place (the guard checked the same before the command
    started; a training may have started since)."""
    out = Path(output).resolve()
    running = _running_training(out, walk=True)
    if running:
        save_dir, holder = running
        raise XfError(f"{output} {_relation(out, save_dir)} the save dir {save_dir} of an xf train that started "
                      f"meanwhile ({holder}); nothing was replaced")


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
