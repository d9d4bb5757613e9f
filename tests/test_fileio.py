"""Atomic writes: the umask is honoured, and a failed write names the file,
says why, and leaves the previous content and no temporary file."""

import errno
import os
import stat

import pytest
import torch

from xformer_cli.checkpoint import load_checkpoint, make_checkpoint, save_checkpoint
from xformer_cli.errors import XfError
from xformer_cli.fileio import atomic_write, atomic_write_text, remove_stale_temporaries
from xformer_cli.model import build_model


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
