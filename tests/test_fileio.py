"""Atomic writes: the umask is honoured, and a failed write names the file,
says why, and leaves the previous content and no temporary file."""

import errno
import os
import stat
from pathlib import Path

import pytest
import torch

from xformer_cli.model.checkpoint import load_checkpoint, make_checkpoint, save_checkpoint
from xformer_cli.base.errors import XfError
from xformer_cli.base.fileio import atomic_directory, atomic_write, atomic_write_text, remove_stale_temporaries
from xformer_cli.model.transformer import build_model


@pytest.fixture
def umask():
    previous = os.umask(0o022)
    yield lambda mask: os.umask(mask)
    os.umask(previous)


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.mark.parametrize("mask", [0o022, 0o002, 0o077])
def test_new_files_get_0666_less_the_umask(tmp_path, umask, mask):
    umask(mask)
    atomic_write_text(tmp_path / "config.yaml", "a: 1\n")
    torch.manual_seed(0)
    model = build_model("tiny", vocab_size=50, d_model=16, d_ff=32, heads=2, encoder_layers=1, decoder_layers=1)
    save_checkpoint(tmp_path / "checkpoint_last.pt", make_checkpoint(model, b"spm"))
    assert mode(tmp_path / "config.yaml") == mode(tmp_path / "checkpoint_last.pt") == 0o666 & ~mask
    assert load_checkpoint(tmp_path / "checkpoint_last.pt")["spm_model"] == b"spm"


def test_a_replaced_file_keeps_its_mode(tmp_path, umask):
    umask(0o022)
    path = tmp_path / "out.txt"
    path.write_text("old\n")
    path.chmod(0o640)
    atomic_write_text(path, "new\n")
    assert path.read_text() == "new\n" and mode(path) == 0o640


def test_a_failed_write_names_the_file_and_keeps_the_old_content(tmp_path):
    path = tmp_path / "checkpoint_last.pt"
    path.write_bytes(b"good")
    with pytest.raises(XfError, match=rf"^cannot write {path}: no space left on device$"):
        with atomic_write(path) as f:
            f.write(b"partial")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    # torch.save reports its file object's failed write as a RuntimeError ("unexpected pos")
    with pytest.raises(XfError, match=rf"^cannot write {path}: disk quota exceeded$"):
        with atomic_write(path) as f:
            try:
                raise OSError(errno.EDQUOT, os.strerror(errno.EDQUOT))
            except OSError:
                raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")
    assert path.read_bytes() == b"good" and os.listdir(tmp_path) == ["checkpoint_last.pt"]
    with pytest.raises(ValueError):  # other errors pass through unchanged
        with atomic_write(path) as f:
            raise ValueError("not a disk problem")


def test_remove_stale_temporaries_leaves_other_files(tmp_path):
    for name in (".checkpoint_last.pt.abc123.tmp", ".config.yaml.x.tmp", "checkpoint_last.pt", "notes.tmp"):
        (tmp_path / name).write_text("x")
    assert sorted(p.name for p in remove_stale_temporaries(tmp_path)) == [".checkpoint_last.pt.abc123.tmp",
                                                                          ".config.yaml.x.tmp"]
    assert sorted(os.listdir(tmp_path)) == ["checkpoint_last.pt", "notes.tmp"]


@pytest.mark.slow  # starts a process (to have a pid that no process has)
def test_a_write_removes_the_temporaries_that_killed_writers_of_the_same_file_left(tmp_path):
    """kill -9 of translate, average or export (or a signal before the clean-up is in place) leaves
    .NAME.PID.*.tmp; the next successful write of NAME removes those of dead processes."""
    import subprocess

    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = tmp_path / f".out.txt.{dead.pid}.abc.tmp"
    stale.write_bytes(b"")  # the 0-byte one of a signal right after mkstemp
    live = tmp_path / ".out.txt.1.def.tmp"  # pid 1 runs: a live writer's, kept
    live.write_bytes(b"x")
    mine = tmp_path / f".out.txt.{os.getpid()}.ghi.tmp"  # this process's own: another write in flight
    mine.write_bytes(b"x")
    other = tmp_path / f".out.txt.bak.{dead.pid}.jkl.tmp"  # another file's (out.txt.bak)
    other.write_bytes(b"x")
    atomic_write_text(tmp_path / "out.txt", "done\n")
    assert (tmp_path / "out.txt").read_text() == "done\n"
    assert not stale.exists() and live.exists() and mine.exists() and other.exists()
    with atomic_write(tmp_path / "x.bin"):
        assert [p.name.startswith(f".x.bin.{os.getpid()}.") for p in tmp_path.glob(".x.bin.*")] == [True]


# -- outputs that are not regular files (fileio.output_route, the one rule) -------------------------
def test_a_fifo_is_written_in_place_and_stays_a_fifo(tmp_path):
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # its reader is there: the write does not wait
    try:
        with atomic_write(fifo, "w", encoding="utf-8") as f:
            f.write("Ein Hund.\n")
        assert os.read(reader, 100) == b"Ein Hund.\n" and stat.S_ISFIFO(os.stat(fifo).st_mode)
    finally:
        os.close(reader)
    assert [p.name for p in tmp_path.iterdir()] == ["out.fifo"]  # no temporary beside it


def test_a_character_device_is_written_in_place(tmp_path):
    with atomic_write("/dev/null", "wb") as f:
        f.write(b"gone")
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_a_symlink_is_written_through_and_stays_a_symlink(tmp_path):
    target = tmp_path / "real.txt"
    target.write_text("old")
    link = tmp_path / "link.txt"
    link.symlink_to(target.name)  # relative, as ln -s makes it
    with atomic_write(link, "w", encoding="utf-8") as f:
        f.write("new")
    assert link.is_symlink() and target.read_text() == "new"
    dangling = tmp_path / "dangling.txt"
    dangling.symlink_to(tmp_path / "made.txt")
    atomic_write_text(dangling, "made")
    assert dangling.is_symlink() and (tmp_path / "made.txt").read_text() == "made"


def test_a_descriptor_through_a_symlink_is_written_to_the_open_file(tmp_path):
    read, write = os.pipe()
    link = tmp_path / "mystdout"
    link.symlink_to(f"/proc/self/fd/{write}")
    try:
        atomic_write_text(link, "eins\nzwei\n")
        os.close(write)
        assert os.read(read, 100) == b"eins\nzwei\n" and link.is_symlink()
    finally:
        os.close(read)


def test_a_socket_or_a_block_device_is_refused_in_one_line(tmp_path):
    import socket

    path = tmp_path / "s.sock"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(path))
        with pytest.raises(XfError, match=r"s.sock: is a socket; xf writes files, FIFOs and character devices only"):
            atomic_write_text(path, "x")


def test_a_directory_output_goes_through_a_symlink_and_refuses_a_fifo(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (real / "old.txt").write_text("old")
    link = tmp_path / "model"
    link.symlink_to(real)
    with atomic_directory(link) as tmp:
        (tmp / "new.txt").write_text("new")
    assert link.is_symlink() and sorted(p.name for p in real.iterdir()) == ["new.txt"]
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(XfError, match="fifo: is a FIFO, not a directory"):
        with atomic_directory(fifo):
            pass
