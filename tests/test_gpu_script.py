"""bench/gpu.sh cannot rot: ``make test`` runs every stage of its dry run (tiny sizes, the CPU,
compiled stages on dynamo's eager backend) and fails when a stage fails, so a rename that would
break the one GPU run breaks CI instead. Also: rows are written the moment they are measured,
and a run cut short still leaves one."""

import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from helpers import bench_module
from helpers import multi30k

REPO = Path(__file__).resolve().parents[1]
STAGES = ["info", "cuda-tests", "train-base", "train-big", "decode-base", "train-base-compiled", "quality",
          "train-base-compiled-reference"]


def gpu_sh(out: Path, timeout: float, **env) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": sys.executable, **env}
    return subprocess.run(["bash", str(REPO / "bench" / "gpu.sh"), "--dry-run", str(out)], capture_output=True,
                          text=True, env=env, timeout=timeout, cwd=REPO)


@pytest.mark.slow
def test_every_stage_of_the_dry_run_runs(tmp_path):
    data = tmp_path / "gpu-data"
    filled = subprocess.run([sys.executable, str(REPO / "bench" / "gpu_data.py"), "--multi30k",
                             str(multi30k()[0]), "--dest", str(data), "--lines", "300",
                             "--test-lines", "12", "--bpe", "500"], capture_output=True, text=True, timeout=300)
    assert filled.returncode == 0, filled.stderr[-2000:]
    out, back = tmp_path / "out", tmp_path / "device-out"  # back: the run tool's $OUT
    done = gpu_sh(out, 1500, XF_GPU_DATA=str(data), XF_GPU_TARBALL=str(back / "gpu-results.tgz"))
    stages = [json.loads(line) for line in (out / "stages.jsonl").read_text().splitlines()]
    assert [(s["name"], s["status"]) for s in stages] == [(name, "ok") for name in STAGES], done.stderr[-3000:]
    assert done.returncode == 0
    assert all(0 < s["seconds"] <= s["allowed"] + 15 for s in stages)  # each stage's allotment, recorded
    assert sorted(p.name for p in back.iterdir()) == ["gpu-results.tgz", "results.json", "results.md"]
    with tarfile.open(back / "gpu-results.tgz") as tar:
        packed = {Path(n).name for n in tar.getnames()}
    assert {"results.md", "stages.jsonl", "cuda-tests.xml", "quality.json", *(f"{n}.log" for n in STAGES)} <= packed
    assert (back / "results.md").read_text() == (out / "results.md").read_text()
    results = json.loads((out / "results.json").read_text())
    assert done.stdout.strip() == (out / "results.md").read_text().strip()  # results.md printed at the end
    assert results["info"]["dry run"] is True and results["info"]["commit"] != "unknown"
    rows = results["rows"]
    train = [r for r in rows if r["bench"] == "train" and r["metric"].endswith("target tokens/s")]
    # xf eager base and big, the reference, compiled xf, the compiled reference: each says how it ended
    # all 4 updates, or (a loaded machine: seen with other jobs on the 2 cores) the time window closed
    # first, after at least one timed update
    assert len(train) == 5 and all((r["ended"], r["updates_timed"]) == ("all 4 updates", 3)
                                   or r["ended"].startswith("stopped by time") and r["updates_timed"] >= 1
                                   for r in train), [(r["ended"], r["updates_timed"]) for r in train]
    assert all(isinstance(r["value"], float) and r["value"] > 0 for r in train)
    graphs = [r for r in rows if r["metric"].endswith("compiled graphs")]
    assert [(r["value"], r["recompiles"]) for r in graphs] == [(1, 0), (1, 0)]  # xf and the reference
    mfu = [r for r in rows if r["metric"].endswith("MFU")]
    assert len(mfu) == 5 and all(0 < r["value"] < 100 for r in mfu)
    assert all("no datasheet fp32 peak known for this CPU" in r["note"] for r in mfu)  # the CPU: the measured peak
    assert len([r for r in rows if r["metric"] == "matmul peak" and r["value"] > 0]) == 4  # one per training stage
    assert any(r["bench"] == "decode" and r["value"] > 0 for r in rows)
    bleu = [r for r in rows if r["metric"] == "sacreBLEU"]
    assert len(bleu) == 1 and isinstance(bleu[0]["value"], float) and "test2016 (12 lines)" in bleu[0]["case"]
    assert not list(out.rglob("*.pt"))  # no checkpoint in the results; the BLEU stage removed its one
    assert len([p for p in out.iterdir() if p.is_file()]) <= 40 and not (out / "bench-data").exists()


@pytest.mark.slow
def test_a_failing_stage_fails_the_script(tmp_path):
    done = gpu_sh(tmp_path, 300, XF_GPU_STAGES="decode-base", XF_BENCH_DECODE_BATCH="not a number")
    assert done.returncode == 1
    stage = json.loads((tmp_path / "stages.jsonl").read_text())
    assert (stage["name"], stage["status"]) == ("decode-base", "failed")
    assert "| decode-base | failed |" in (tmp_path / "results.md").read_text()


@pytest.mark.slow
def test_a_stopped_run_still_packs_what_finished(tmp_path):
    """TERM in the middle of a stage (the device's time running out): the EXIT trap packs the
    stages that finished, and the one stopped, into XF_GPU_TARBALL."""
    out, back = tmp_path / "out", tmp_path / "back"
    env = {**os.environ, "PYTHON": sys.executable, "XF_GPU_STAGES": "info,train-base",
           "XF_GPU_TARBALL": str(back / "gpu-results.tgz")}
    proc = subprocess.Popen(["bash", str(REPO / "bench" / "gpu.sh"), "--dry-run", str(out)], env=env, cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not (out / "train-base.log").exists() and time.monotonic() < deadline:  # info done, train-base started
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 143
    with tarfile.open(back / "gpu-results.tgz") as tar:
        packed = {Path(n).name: n for n in tar.getnames()}
        stages = tar.extractfile(packed["stages.jsonl"]).read().decode()
    assert {"info.json", "info.log", "train-base.log", "results.md"} <= set(packed)
    assert [json.loads(line)["status"] for line in stages.splitlines()] == ["ok"]
    assert "| info | ok |" in (back / "results.md").read_text()


def test_cuda_test_outcomes_come_from_the_log_when_pytest_was_cut_short(tmp_path):
    """No JUnit XML (pytest killed mid-test): the outcomes pytest -v wrote as each test ended."""
    report = bench_module("gpu_report")
    (tmp_path / "cuda-tests.log").write_text(
        "tests/test_cuda.py::test_half_precision_steps_on_cuda_track_fp32[bf16] PASSED        [ 12%]\n"
        "tests/test_cuda.py::test_half_precision_steps_on_cuda_track_fp32[fp16] FAILED        [ 25%]\n"
        "tests/test_cuda.py::test_updates_never_wait_for_the_gpu[bf16] ")  # killed here
    counts = report.test_counts(tmp_path / "cuda-tests.xml")
    assert (counts["tests"], counts["passed"], counts["failures"]) == (2, 1, 1)
    assert "the tests that finished" in counts["note"]


def test_mfu_is_against_the_datasheet_peak_where_one_is_known(monkeypatch):
    peaks = bench_module("gpu_peaks")
    import torch

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    peak, note = peaks.mfu_peak(700e12, torch.device("cuda", 0), "bf16")
    assert peak == 989.4e12 and "datasheet's dense bf16 peak of the NVIDIA H200" in note and "(71% of it)" in note
    peak, note = peaks.mfu_peak(60e12, torch.device("cuda", 0), "fp32")  # no fp32 datasheet figure: measured
    assert peak == 60e12 and "no datasheet fp32 peak" in note
    assert peaks.mfu_peak(1e11, torch.device("cpu"), "fp32")[0] == 1e11


def test_the_bleu_stage_checks_room_and_imports_before_training(tmp_path, monkeypatch):
    quality = bench_module("gpu_quality")
    small, big = tmp_path / "shm", tmp_path / "tmp"
    small.mkdir(), big.mkdir()
    free = {str(small): 100 * 2**20, str(big): 10 * 2**30}
    import shutil
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(0, 0, free[str(p)]))
    assert quality.checkpoint_dir(190 * 2**20, (str(small), str(big))).parent == big  # /dev/shm too small: falls back
    assert quality.checkpoint_dir(50 * 2**20, (str(small), str(big))).parent == small
    with pytest.raises(SystemExit, match="no room for the 19456 MiB checkpoint"):
        quality.checkpoint_dir(19 * 2**30, (str(small), str(big)))
    quality.preflight_imports()  # this environment has them all
    monkeypatch.setattr(quality, "AFTER_TRAINING_IMPORTS", ("sacrebleu", "no_such_module_xf"))
    with pytest.raises(SystemExit, match="No module named 'no_such_module_xf'.*nothing trained"):
        quality.preflight_imports()


def test_rows_are_written_the_moment_a_run_ends(monkeypatch, tmp_path):
    """xf's rows are out before the reference starts; a run killed in its first update (a long
    compile) still leaves a row with the time it had spent."""
    bench = bench_module("bench_train")
    emitted, started = [], []
    results = {
        "xf": dict(engine="xf", device="cpu", compiled=True, first_update_seconds=41.5, graphs_after_first=1,
                   ended="killed after update 1 (exit -9, after 50 s)"),
        "reference": dict(engine="reference", device="cpu", compiled=True, ended="all 4 updates", updates_timed=3,
                          seconds=1.5, tgt_tokens=3000, flops=6e9, tgt_tok_s=2000.0, peak_memory_mib=10.0,
                          first_update_seconds=2.0, graphs_after_first=1, graphs=1, finite=True),
    }

    def run_child(engine, *args):
        started.append((engine, len(emitted)))
        return results[engine]

    monkeypatch.setattr(bench, "run_child", run_child)
    monkeypatch.setattr(bench, "wmt_like_data", lambda root: root)
    monkeypatch.setattr(bench, "matmul_peak", lambda dtype, dev: 1e12)
    monkeypatch.setattr(bench, "COMPILE", [True])
    monkeypatch.setattr(bench, "DATA", "wmt-like")
    monkeypatch.setenv("XF_BENCH_TRAIN_DEVICES", "cpu")
    monkeypatch.setenv("XF_BENCH_TRAIN_PRECISIONS", "fp32")
    bench.measure(emitted.append)
    assert emitted[0]["metric"] == "matmul peak"  # measured before the runs, a row of its own
    assert started[0] == ("xf", 1) and started[1][0] == "reference"
    xf_rows = emitted[1: started[1][1]]
    assert xf_rows and all(r["ended"].startswith("killed after update 1") for r in xf_rows)
    speed = next(r for r in xf_rows if r["metric"] == "target tokens/s")
    assert speed["value"] == "no update timed" and "update 1 took 41.5 s" in speed["note"]
    ref_mfu = next(r for r in emitted if r["metric"] == "reference MFU")
    assert ref_mfu["value"] == pytest.approx(100 * 6e9 / 1.5 / 1e12)
    assert not any(r["metric"] == "xf / reference" for r in emitted)  # no ratio without both speeds
