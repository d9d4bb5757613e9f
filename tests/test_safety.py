"""One xf train per save directory (an OS lock that kill -9 releases) and outputs that are inputs."""

import os
import signal
import socket
import subprocess
import sys

import pytest

from xformer_cli.base.errors import XfError
from xformer_cli.settings.options import TrainOptions
from xformer_cli.base.safety import SaveDirLock, refuse_unsafe_outputs, same_file

HOLD = """
import sys, time
from xformer_cli.base.safety import SaveDirLock
with SaveDirLock(sys.argv[1]) as lock:
    lock.acquire()
    print("locked", flush=True)
    time.sleep(60)
"""


@pytest.fixture
def holder(tmp_path):
    """Another process that holds the lock on tmp_path/ck until it is killed with SIGKILL."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path / "ck")], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    yield proc
    proc.kill()
    proc.wait()


@pytest.mark.slow
def test_a_second_holder_fails_at_once_naming_the_first_and_kill_9_releases_it(tmp_path, holder):
    save = tmp_path / "ck"
    with pytest.raises(XfError, match=rf"save dir {save} is in use by another xf train \(pid {holder.pid} on "
                                      rf"{socket.gethostname()}\)") as e:
        with SaveDirLock(save):
            pass
    assert "\n" not in str(e.value)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    with SaveDirLock(save) as lock:  # no stale lock to delete by hand
        assert lock.fd is not None
        assert (save / "train.lock").read_text() == f"pid {os.getpid()} on {socket.gethostname()}\n"
    with SaveDirLock(save):  # released at the end of the block, reusable in one process
        pass


@pytest.mark.slow
def test_xf_train_refuses_a_save_dir_in_use_before_reading_any_data(tmp_path, holder):
    from xformer_cli.commands.train import train

    with pytest.raises(XfError, match=f"in use by another xf train .pid {holder.pid} "):
        train(TrainOptions(data=str(tmp_path / "no-such-data"), save_dir=str(tmp_path / "ck"), device="cpu"))


def test_a_new_save_dir_is_locked_once_created_and_disabled_ranks_take_no_lock(tmp_path):
    save = tmp_path / "new"
    with SaveDirLock(save) as lock:
        assert not save.exists()  # not created by entering: bad options leave nothing behind
        lock.acquire()
        with pytest.raises(XfError, match="in use"), SaveDirLock(save):
            pass
        with SaveDirLock(save, enabled=False) as other:
            other.acquire()
            assert other.fd is None


def test_same_file_sees_through_symlinks_and_relative_paths(tmp_path, monkeypatch):
    (tmp_path / "a.txt").write_text("x")
    (tmp_path / "link.txt").symlink_to(tmp_path / "a.txt")
    os.link(tmp_path / "a.txt", tmp_path / "hard.txt")
    (tmp_path / "b.txt").write_text("x")
    monkeypatch.chdir(tmp_path)
    assert same_file("a.txt", tmp_path / "link.txt") and same_file("./hard.txt", "a.txt")
    assert not same_file("a.txt", "b.txt") and not same_file("a.txt", "missing.txt")
    with pytest.raises(XfError, match="--output link.txt is the input --path a.txt"):
        refuse_unsafe_outputs([("--output", "link.txt", "file")], [("--path", "b.txt", "file"), ("--path", "a.txt", "file")])
    refuse_unsafe_outputs([("--output", "new.txt", "file")], [("--path", "a.txt", "file")])
    refuse_unsafe_outputs([("--output", "b.txt", "file")], [("--path", "a.txt", "file")])  # no --overwrite option: replaced
    with pytest.raises(XfError, match="b.txt: exists .pass --overwrite"):
        refuse_unsafe_outputs([("--output", "b.txt", "file")], [("--path", "a.txt", "file")], overwrite=False)
