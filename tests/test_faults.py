"""Fault injection: kill -9 at random moments, a full disk at every write site,
signals during preprocessing and translation, and two torchrun nodes on loopback of which one
dies. Every run is a real ``xf`` process on a tiny model and a 160-pair slice of Multi30k.

``pytest --slow`` runs the long variants (20 kills instead of 4)."""

import os
import random
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import cli_args, opts, records
from xformer_cli.model.checkpoint import load_checkpoint, make_checkpoint, save_checkpoint
from xformer_cli.frame import load_command_options
from xformer_cli.settings.options import TrainOptions
from xformer_cli.model.transformer import build_model
from xformer_cli.commands.train import train

REPO = Path(__file__).resolve().parents[1]
XF = [sys.executable, "-m", "xformer_cli"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}


@pytest.fixture(scope="session")
def enospc(tmp_path_factory) -> str:
    """tests/faults/enospc.c built as an LD_PRELOAD library: a full disk for chosen files."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None or not sys.platform.startswith("linux"):
        pytest.skip("the full-disk shim needs Linux and a C compiler")
    lib = tmp_path_factory.mktemp("shim") / "enospc.so"
    out = subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", str(lib), str(REPO / "tests/faults/enospc.c"), "-ldl"],
                         capture_output=True, text=True)
    if out.returncode != 0:
        pytest.skip(f"cannot build the full-disk shim: {out.stderr.strip()[:200]}")
    return str(lib)


def disk_full(enospc: str, path_part: str, after: int = 100) -> dict:
    """The environment of a process whose writes to files named like ``path_part`` hit a full
    disk after ``after`` bytes."""
    return {**ENV, "LD_PRELOAD": enospc, "XF_TEST_ENOSPC_PATH": path_part, "XF_TEST_ENOSPC_AFTER": str(after)}


def xf(*args, env=ENV, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([*XF, *map(str, args)], capture_output=True, text=True, env=env, timeout=300, **kw)


def one_line_error(out: subprocess.CompletedProcess) -> str:
    """The error line of a failed command, after checking that it is one line and no traceback."""
    assert out.returncode != 0, out.stderr
    assert "Traceback" not in out.stderr, out.stderr
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("xf: error: "), out.stderr
    return last


def files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


def assert_same_training_state(a_path: Path, b_path: Path) -> None:
    a, b = load_checkpoint(a_path), load_checkpoint(b_path)
    assert a["model"].keys() == b["model"].keys()
    for name in a["model"]:
        assert torch.equal(a["model"][name], b["model"][name]), name
    sa, sb = a["train_state"]["optimizer"]["state"], b["train_state"]["optimizer"]["state"]
    for k in sa:
        for key in sa[k]:
            assert torch.equal(sa[k][key], sb[k][key]), (k, key)
    assert a["train_state"]["position"] == b["train_state"]["position"]


def umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


# -- chaos resume ------------------------------------------------------------------------------
def count_starts(log: Path) -> int:
    return log.read_text().count('"type": "start"') if log.exists() else 0


@pytest.mark.slow
def test_kill_9_at_random_moments_then_resume_equals_an_uninterrupted_run(data_dir, tmp_path, request):
    """kill -9 during whatever the run is doing (forward, optimizer step, checkpoint write,
    validation, epoch boundary: a checkpoint every update and a validation every 7 make all of
    them likely), resume, repeat; the end is bit for bit the uninterrupted run's, and every
    checkpoint on disk loads at every moment."""
    slow = request.config.getoption("--slow")
    kills = 20 if slow else 4
    kw = dict(max_update=60 if slow else 30, save_interval_updates=1, keep_last_checkpoints=3,
              validate_interval_updates=7, dropout=0.1, save_interval_minutes=0.0)  # 21 updates an epoch
    began = time.monotonic()
    reference = train(opts(data_dir, tmp_path / "reference", **kw))
    run_seconds = time.monotonic() - began
    assert reference["num_updates"] == kw["max_update"]

    save = tmp_path / "chaos"
    log = save / "train_log.jsonl"
    command = [*XF, "train", *cli_args(data_dir, save, **kw)]
    rng = random.Random(12)
    killed_after = []  # the update of checkpoint_last.pt after each kill
    for _ in range(kills):
        starts = count_starts(log)
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV)
        deadline = time.monotonic() + 120
        while count_starts(log) == starts and proc.poll() is None:  # until it is about to train
            assert time.monotonic() < deadline, "xf train did not start"
            time.sleep(0.01)
        time.sleep(rng.uniform(0, run_seconds / kills))  # on average half a kills-th of the run: all land
        if proc.poll() is not None:
            break  # it finished first
        proc.kill()
        proc.wait()
        for p in save.glob("checkpoint*.pt"):  # every checkpoint there loads, whenever the kill
            load_checkpoint(p)
        killed_after.append(load_checkpoint(save / "checkpoint_last.pt")["train_state"]["position"]["num_updates"]
                            if (save / "checkpoint_last.pt").exists() else 0)
    print(f"checkpoint_last.pt after each kill -9: update {killed_after} of {kw['max_update']}")
    assert sum(u < kw["max_update"] for u in killed_after) >= 2, killed_after  # (all, usually) mid-training
    final = subprocess.run(command, capture_output=True, text=True, env=ENV, timeout=300)
    assert final.returncode == 0, final.stderr[-2000:]

    assert_same_training_state(tmp_path / "reference" / "checkpoint_last.pt", save / "checkpoint_last.pt")
    assert not list(save.glob(".*.tmp")), "temporary files of killed writes are cleaned up"
    assert records(save, "summary")[-1]["num_updates"] == kw["max_update"]  # every log line is whole JSON
    for p in [*save.glob("checkpoint*.pt"), save / "config.yaml"]:  # written as any tool would
        assert stat.S_IMODE(p.stat().st_mode) == 0o666 & ~umask(), p


# -- a full disk -------------------------------------------------------------------------------
@pytest.mark.slow
def test_disk_full_at_every_train_write_site(data_dir, tmp_path, enospc):
    save = tmp_path / "ck"
    args = cli_args(data_dir, save)
    train(opts(data_dir, save, max_update=2))
    good = files(save)
    for site, name in (("checkpoint", r"checkpoint_1_4\.pt"), ("config.yaml", r"config\.yaml"),
                       ("train_log.jsonl", r"train_log\.jsonl")):
        before = files(save)
        out = xf("train", *args, "--max-update", "4", env=disk_full(enospc, site))
        error = one_line_error(out)
        assert out.returncode == 1
        assert re.fullmatch(rf"xf: error: cannot write {re.escape(str(save))}/{name}: no space left on device", error), error
        now = files(save)
        for kept in ("checkpoint_last.pt", "checkpoint_1_2.pt", "checkpoint_best.pt"):
            assert now[kept] == good[kept], f"{kept} changed when {site} could not be written"
        if site == "config.yaml":
            assert now["config.yaml"] == before["config.yaml"]
        assert load_command_options(TrainOptions, save / "config.yaml", section="train").max_update in (2, 4)  # whole
        assert now["train_log.jsonl"].startswith(before["train_log.jsonl"])  # appended to, at most
        assert not list(save.glob(".*.tmp"))
    # resumable: with space again, the same command ends where an uninterrupted run does
    assert train(opts(data_dir, save, max_update=4))["num_updates"] == 4
    # the reference runs the same two commands without a full disk (the stop at update 2 validates)
    train(opts(data_dir, tmp_path / "reference", max_update=2))
    train(opts(data_dir, tmp_path / "reference", max_update=4))
    assert_same_training_state(tmp_path / "reference" / "checkpoint_last.pt", save / "checkpoint_last.pt")
    assert [r["update"] for r in records(save, "start")][-1] == 2  # every log line is whole JSON


@pytest.mark.slow
def test_disk_full_in_preprocess_and_translate_keeps_the_old_outputs(data_dir, raw_slice, tmp_path, enospc):
    dest = shutil.copytree(data_dir, tmp_path / "bin")
    good = files(dest)
    args = ["preprocess", "--destdir", dest, "--trainpref", raw_slice / "train", "--validpref", raw_slice / "val",
            "--bpe-vocab-size", "300", "--overwrite"]
    for site, after in (("bpe-sample.txt", 1000), ("train.de.bin", 1000), ("valid.en.idx", 0), ("meta.json", 100)):
        out = xf(*args, env=disk_full(enospc, site, after))
        assert one_line_error(out) == f"xf: error: cannot write {dest}: no space left on device", site
        assert files(dest) == good
        assert sorted(p.name for p in tmp_path.iterdir()) == ["bin"]  # no temporary directory left
    assert xf(*args).returncode == 0  # and with space again, it runs

    torch.manual_seed(0)
    model = build_model("tiny", vocab_size=300, d_model=32, d_ff=64, heads=2, encoder_layers=1, decoder_layers=1)
    save_checkpoint(tmp_path / "model.pt", make_checkpoint(model, (dest / "spm.model").read_bytes()))
    (tmp_path / "in.txt").write_text("a man .\ntwo dogs run .\n" * 20)
    (tmp_path / "out.txt").write_text("an older translation\n")
    args = ["translate", "--path", tmp_path / "model.pt", "--input", tmp_path / "in.txt", "--output", tmp_path / "out.txt",
            "--beam", "1", "--max-len-b", "4", "--buffer-size", "8"]
    out = xf(*args, env=disk_full(enospc, "out.txt", after=50))
    assert one_line_error(out) == f"xf: error: cannot write {tmp_path / 'out.txt'}: no space left on device"
    assert (tmp_path / "out.txt").read_text() == "an older translation\n"
    assert not list(tmp_path.glob(".*.tmp"))
    assert xf(*args).returncode == 0
    assert len((tmp_path / "out.txt").read_text().splitlines()) == 40
    assert stat.S_IMODE((tmp_path / "out.txt").stat().st_mode) == 0o644  # the mode of the file replaced


# -- signals -----------------------------------------------------------------------------------
def tagged_processes(tag: str) -> list[int]:
    """Processes whose environment holds XF_TEST_TAG=tag (children included, orphaned or not)."""
    pids = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if f"XF_TEST_TAG={tag}".encode() in (p / "environ").read_bytes():
                    pids.append(int(p.name))
            except OSError:
                pass
    return pids


def wait_for(condition, proc, seconds=120.0, what="") -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert proc.poll() is None, f"exited before {what}: {proc.stderr.read()}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def stable_file(pattern: str, where: Path, seconds: float = 0.5):
    """A condition: a file matching ``pattern`` exists and has not grown for ``seconds``."""
    seen = {}

    def check() -> bool:
        for p in where.glob(pattern):
            size, now = p.stat().st_size, time.monotonic()
            if seen.get(p, (None,))[0] != size:
                seen[p] = (size, now)
            elif now - seen[p][1] >= seconds:
                return True
        return False

    return check


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs Linux /proc")
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_during_preprocess_removes_its_temporary_files(multi30k_dir, tmp_path, signum):
    tag = f"pre-{signum}-{os.getpid()}"
    proc = subprocess.Popen(
        [*XF, "preprocess", "--destdir", tmp_path / "bin", "--trainpref", multi30k_dir / "train",
         "--validpref", multi30k_dir / "val", "--bpe-vocab-size", "2000"],
        stderr=subprocess.PIPE, text=True, env={**ENV, "XF_TEST_TAG": tag}, cwd=tmp_path,
        preexec_fn=sigint_by_default)
    wait_for(lambda: list(tmp_path.glob(".bin.*.tmp/*")), proc, what="preprocess to write")
    time.sleep(0.5)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signum, err
    assert err.strip().splitlines()[-1] in ("xf: error: interrupted", "xf: error: stopped by SIGTERM")
    assert "Traceback" not in err
    assert os.listdir(tmp_path) == []  # neither the temporary directory nor a half-made destdir
    assert tagged_processes(tag) == []  # nor a worker or the BPE learner left running


def sigint_by_default() -> None:
    """preexec_fn of a child that the test interrupts with SIGINT: a shell without job control
    starts background commands (``make test &``) with SIGINT ignored, the child inherits that,
    and Python then installs no KeyboardInterrupt handler, so Ctrl-C never reaches it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def synthetic_corpus(path: Path, lines: int, seed: int = 0) -> Path:
    """Random words, many distinct pieces: sentencepiece's BPE takes long to learn 60000 of them."""
    rng = np.random.default_rng(seed)
    letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz", np.uint8)
    words = [bytes(letters[rng.integers(0, 26, n)]) for n in rng.integers(4, 13, 40000)]
    path.mkdir()
    for lang in ("en", "de"):
        idx = rng.integers(0, len(words), (lines, 12))
        (path / f"train.{lang}").write_bytes(b"".join(b" ".join(words[i] for i in row) + b"\n" for row in idx))
    return path / "train"


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs Linux /proc")
def test_ctrl_c_while_learning_bpe_stops_at_once(tmp_path):
    """Uninterrupted, learning this BPE takes over 20 s on one core; Ctrl-C one second into it
    must end the command within 10 s (it used to wait for sentencepiece to finish)."""
    prefix = synthetic_corpus(tmp_path / "raw", 60000)
    tag = f"bpe-{os.getpid()}"
    proc = subprocess.Popen([*XF, "preprocess", "--destdir", tmp_path / "bin", "--trainpref", prefix,
                             "--bpe-vocab-size", "60000"],
                            stderr=subprocess.PIPE, text=True, env={**ENV, "XF_TEST_TAG": tag}, cwd=tmp_path,
                            preexec_fn=sigint_by_default)
    wait_for(stable_file(".bin.*.tmp/bpe-sample.txt", tmp_path), proc, what="the BPE sample")
    time.sleep(1.0)  # sentencepiece is learning now
    assert proc.poll() is None
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=10)
    assert proc.returncode == 130 and err.strip().splitlines()[-1] == "xf: error: interrupted", err
    assert sorted(os.listdir(tmp_path)) == ["raw"]
    assert tagged_processes(tag) == []


@pytest.mark.slow
def test_sigterm_during_translate_removes_the_temporary_output(data_dir, tmp_path):
    torch.manual_seed(0)
    model = build_model("tiny", vocab_size=300, d_model=32, d_ff=64, heads=2, encoder_layers=1, decoder_layers=1)
    save_checkpoint(tmp_path / "model.pt", make_checkpoint(model, (data_dir / "spm.model").read_bytes()))
    (tmp_path / "in.txt").write_text("a man in a blue shirt is standing on a ladder .\n" * 4000)
    proc = subprocess.Popen([*XF, "translate", "--path", tmp_path / "model.pt", "--input", tmp_path / "in.txt",
                             "--output", tmp_path / "out.txt", "--buffer-size", "16", "--batch-size", "16"],
                            stderr=subprocess.PIPE, text=True, env=ENV)
    wait_for(lambda: any(p.stat().st_size > 0 for p in tmp_path.glob(".out.txt.*.tmp")), proc,
             what="the first translations")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143 and err.strip().splitlines()[-1] == "xf: error: stopped by SIGTERM", err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "model.pt"]


# -- two torchrun nodes on loopback ------------------------------------------------------------
def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening(port: int) -> bool:
    import socket

    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def start_nodes(data_dir, save: Path, logs: Path, tag: str, **kw) -> list[subprocess.Popen]:
    """Two torchrun "nodes" of one process each, c10d rendezvous on 127.0.0.1. Node a starts
    first and hosts the rendezvous store. Output goes to logs/{a,b}.log."""
    port = free_port()
    logs.mkdir(exist_ok=True)
    nodes = []
    for name in ("a", "b"):
        with open(logs / f"{name}.log", "w") as out:
            nodes.append(subprocess.Popen(
                [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
                 "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", tag,
                 "--max-restarts", "0", "-m", "xformer_cli", "train", *cli_args(data_dir, save, **kw)],
                stdout=out, stderr=subprocess.STDOUT, env={**ENV, "XF_TEST_TAG": f"{tag}-{name}"}, cwd=logs))
        if name == "a":
            deadline = time.monotonic() + 60
            while not listening(port):
                assert nodes[0].poll() is None and time.monotonic() < deadline, (logs / "a.log").read_text()
                time.sleep(0.05)
    return nodes


def stop_all(tag: str) -> None:
    for name in ("a", "b"):
        for pid in tagged_processes(f"{tag}-{name}"):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs Linux /proc")
def test_two_nodes_on_loopback_equal_one_process_accumulating(data_dir, tmp_path):
    kw = dict(max_update=2, dropout=0.0, lr_scheduler="inverse_sqrt", lr=1e-3, warmup_updates=1)
    train(opts(data_dir, tmp_path / "single", update_freq=2, **kw))
    tag = f"mn-eq-{os.getpid()}"
    try:
        nodes = start_nodes(data_dir, tmp_path / "nodes", tmp_path / "logs", tag, **kw)
        for node, name in zip(nodes, "ab"):
            assert node.wait(timeout=240) == 0, (tmp_path / "logs" / f"{name}.log").read_text()[-3000:]
    finally:
        stop_all(tag)
    assert records(tmp_path / "nodes", "start")[0]["world_size"] == 2
    a = load_checkpoint(tmp_path / "single" / "checkpoint_last.pt")
    b = load_checkpoint(tmp_path / "nodes" / "checkpoint_last.pt")
    for name in a["model"]:  # the all-reduce sums in another order than one process does
        torch.testing.assert_close(a["model"][name], b["model"][name], rtol=0, atol=1e-5)
    assert a["train_state"]["position"] == b["train_state"]["position"]


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs Linux /proc")
def test_a_dead_node_stops_the_other_with_a_message_and_the_job_resumes(data_dir, tmp_path):
    """kill -9 node b (its torchrun agent and its worker) mid-run: node a must not hang. gloo sees
    the closed connection at once; a hung peer would take --ddp-timeout-minutes (1 here). The bound
    asserted is that timeout plus a minute for torchrun's own shutdown."""
    save, logs, tag = tmp_path / "ck", tmp_path / "logs", f"mn-kill-{os.getpid()}"
    kw = dict(max_update=100000, save_interval_updates=3, log_interval=10, ddp_timeout_minutes=1.0)
    try:
        node_a, node_b = start_nodes(data_dir, save, logs, tag, **kw)
        last = save / "checkpoint_last.pt"
        wait_for(lambda: last.exists() and load_checkpoint(last)["meta"]["num_updates"] >= 6, node_a,
                 what="a few checkpoints")
        for pid in tagged_processes(f"{tag}-b"):
            os.kill(pid, signal.SIGKILL)
        began = time.monotonic()
        node_a.wait(timeout=120)
        waited = time.monotonic() - began
    finally:
        stop_all(tag)
    log_a = (logs / "a.log").read_text()
    assert node_a.returncode != 0
    assert re.search(r"xf: error: rank \d of 2: lost another training process \(.+\); stopping\. "
                     r"Start every node again to resume from .*checkpoint_last\.pt", log_a), log_a[-3000:]
    assert tagged_processes(f"{tag}-a") == []  # its worker exited too: nothing left training or waiting
    print(f"node a exited {waited:.1f} s after node b was killed:",
          *[line for line in log_a.splitlines() if line.startswith("xf: error")])

    stopped = load_checkpoint(save / "checkpoint_last.pt")["meta"]["num_updates"]
    try:
        nodes = start_nodes(data_dir, save, logs, tag, **{**kw, "max_update": stopped + 2})
        for node, name in zip(nodes, "ab"):
            assert node.wait(timeout=240) == 0, (logs / f"{name}.log").read_text()[-3000:]
    finally:
        stop_all(tag)
    assert records(save, "start")[-1]["update"] == stopped
    assert load_checkpoint(save / "checkpoint_last.pt")["meta"]["num_updates"] == stopped + 2
