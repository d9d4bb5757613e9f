"""xf train on a tiny slice of Multi30k: learning, checkpoints, exact resume, signals, DDP,
non-finite updates, and bad input. Models are a few thousand parameters; runs take seconds."""

import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from xformer_cli.base import distributed
from xformer_cli.train import update as training
from xformer_cli.data.batching import Prefetch
from xformer_cli.commands import train as train_module
from xformer_cli.model.checkpoint import load_checkpoint
from xformer_cli.frame import load_command_options
from xformer_cli.data.dataset import DataDir
from xformer_cli.base.errors import XfError
from xformer_cli.model.transformer import Transformer
from xformer_cli.settings.options import TrainOptions
from xformer_cli.base.safety import SaveDirLock
from xformer_cli.train.setup import build_config, set_up
from xformer_cli.model.checkpoint import remove_old_checkpoints
from xformer_cli.commands.train import train
from helpers import MICRO, cli_args, make_data, opts, records

REPO = Path(__file__).resolve().parents[1]
def params(path) -> dict:
    return load_checkpoint(path)["model"]


# -- pure pieces ---------------------------------------------------------------------------------
def test_remove_old_checkpoints_keeps_the_newest_by_update(tmp_path):
    for name in ("checkpoint_1_5.pt", "checkpoint_1_10.pt", "checkpoint_2_20.pt", "checkpoint_last.pt"):
        (tmp_path / name).write_bytes(b"x")
    remove_old_checkpoints(tmp_path, 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint_1_10.pt", "checkpoint_2_20.pt", "checkpoint_last.pt"]


def test_optimizer_names_say_what_they_build(tmp_path):
    model = torch.nn.Linear(2, 2)
    adam = training.make_optimizer(model, TrainOptions(data="d"))
    adamw = training.make_optimizer(model, TrainOptions(data="d", optimizer="adamw", weight_decay=0.01))
    assert type(adam) is torch.optim.Adam and adam.param_groups[0]["weight_decay"] == 0.0
    assert type(adamw) is torch.optim.AdamW and adamw.param_groups[0]["weight_decay"] == 0.01


# -- training ------------------------------------------------------------------------------------
@pytest.mark.slow
def test_trains_to_falling_validation_loss_with_all_outputs(data_dir, tmp_path):
    save = tmp_path / "ck"
    summary = train(opts(data_dir, save, max_epoch=3, keep_last_checkpoints=2, warmup_updates=20, dropout=0.0))
    assert summary["stop_reason"] == "reached --max-epoch 3"
    valid = [r["loss"] for r in records(save, "valid")]
    assert len(valid) == 3 and valid[2] < valid[1] < valid[0], valid
    names = sorted(p.name for p in save.iterdir())
    numbered = [n for n in names if n.startswith("checkpoint_") and n.count("_") == 2]
    assert [n.split("_")[1] for n in numbered] == ["2", "3"]  # epoch-end checkpoints, the last 2 kept
    assert all(load_checkpoint(save / n)["meta"]["end_of_epoch"] for n in numbered)  # for --num-epoch-checkpoints
    assert {"checkpoint_last.pt", "checkpoint_best.pt", "config.yaml", "train_log.jsonl"} <= set(names)
    assert not [n for n in names if n.endswith(".tmp")]

    ckpt = torch.load(save / "checkpoint_last.pt", weights_only=True)  # plain data only
    state = ckpt["train_state"]
    assert state["position"]["epoch"] == 4 and state["position"]["batch_offset"] == 0
    assert state["position"]["num_updates"] == summary["num_updates"]  # the schedule's step too
    # one schema: TrainState.state_dict writes exactly the keys its load_state_dict reads (+ options)
    assert set(state) == {"optimizer", "scaler", "rng", "position", "num_batches", "elapsed_seconds", "options"}
    assert isinstance(state["rng"]["python"], list) and isinstance(state["rng"]["numpy"][1], list)
    assert state["options"]["arch"] == "tiny" and state["options"]["dropout"] == 0.0
    assert ckpt["meta"]["valid_loss"] == pytest.approx(valid[-1])
    best = load_checkpoint(save / "checkpoint_best.pt")
    assert best["meta"]["valid_loss"] == pytest.approx(min(valid))

    # config.yaml is the effective configuration, and reusable as --config
    again = load_command_options(TrainOptions, save / "config.yaml", section="train")
    assert again.d_model == 32 and again.dropout == 0.0 and again.max_epoch == 3
    assert Path(again.data).is_absolute() and Path(again.save_dir).is_absolute()  # reusable from any directory
    train_log = records(save, "train")
    assert len(train_log) == summary["num_updates"]
    assert {"loss", "nll", "ppl", "lr", "gnorm", "src_tok_s", "tgt_tok_s", "ups"} <= set(train_log[-1])
    assert records(save, "summary")[0]["num_updates"] == summary["num_updates"]

    # the same command again: nothing left to do, nothing rewritten
    before = (save / "checkpoint_last.pt").stat().st_mtime_ns
    assert train(opts(data_dir, save, max_epoch=3, keep_last_checkpoints=2, warmup_updates=20, dropout=0.0))["stop_reason"] == "already done"
    assert (save / "checkpoint_last.pt").stat().st_mtime_ns == before


@pytest.mark.slow
def test_resume_is_bit_exact(data_dir, tmp_path):
    """N+M updates in one run == N updates, stop, resume for M (CPU, fp32, with dropout, and
    across an epoch boundary, with gradient accumulation)."""
    kw = dict(update_freq=2, dropout=0.2, max_tokens=200, max_epoch=2)
    full = train(opts(data_dir, tmp_path / "full", **kw))
    n = full["num_updates"]
    part = train(opts(data_dir, tmp_path / "part", max_update=n // 2 - 1, **kw))  # stops inside epoch 1
    assert part["num_updates"] == n // 2 - 1 and part["epoch"] == 1
    resumed = train(opts(data_dir, tmp_path / "part", **kw))
    assert resumed["num_updates"] == n and resumed["epoch"] == 3
    a, b = load_checkpoint(tmp_path / "full" / "checkpoint_last.pt"), load_checkpoint(tmp_path / "part" / "checkpoint_last.pt")
    for name in a["model"]:
        assert torch.equal(a["model"][name], b["model"][name]), name
    sa, sb = a["train_state"]["optimizer"]["state"], b["train_state"]["optimizer"]["state"]
    for k in sa:
        for key in sa[k]:
            assert torch.equal(sa[k][key], sb[k][key])
    assert a["train_state"]["position"] == b["train_state"]["position"]


@pytest.mark.slow
def test_late_regularization_switches_at_its_update_and_resumes_exactly(data_dir, tmp_path):
    """--late-after N: updates 1..N are those of a plain run, updates N+1.. are those of a run
    resumed at N with the late dropout and label smoothing; a run stopped by N is unchanged, and
    one resumed past N keeps the late values."""
    kw = dict(dropout=0.1, label_smoothing=0.1, max_tokens=200, max_update=12)
    late = dict(late_after=6, late_dropout=0.4, late_label_smoothing=0.25)
    run = train(opts(data_dir, tmp_path / "late", **kw, **late))
    assert run["num_updates"] == 12
    [switch] = records(tmp_path / "late", "regularization")
    assert (switch["update"], switch["dropout"], switch["label_smoothing"]) == (7, 0.4, 0.25)
    # the same by hand: 6 plain updates, then resume with the late values as the run's own
    train(opts(data_dir, tmp_path / "hand", **{**kw, "max_update": 6}))
    ckpt = load_checkpoint(tmp_path / "hand" / "checkpoint_last.pt")
    ckpt["model_config"]["dropout"] = 0.4  # what the run is trained with, as a resume checks it
    ckpt["train_state"]["options"]["label_smoothing"] = 0.25
    torch.save(ckpt, tmp_path / "hand" / "checkpoint_last.pt")
    train(opts(data_dir, tmp_path / "hand", **{**kw, "dropout": 0.4, "label_smoothing": 0.25}))
    # and stopped after the switch (update 9), then resumed: the late values are set again
    train(opts(data_dir, tmp_path / "stopped", **{**kw, "max_update": 9}, **late))
    train(opts(data_dir, tmp_path / "stopped", **kw, **late))
    plain = train(opts(data_dir, tmp_path / "plain", **kw))
    early = train(opts(data_dir, tmp_path / "early", **kw, **{**late, "late_after": 12}))  # never reached
    assert not records(tmp_path / "early", "regularization")
    final = {name: params(tmp_path / name / "checkpoint_last.pt") for name in ("late", "hand", "stopped", "plain", "early")}
    for name in final["late"]:
        assert torch.equal(final["late"][name], final["hand"][name]), name
        assert torch.equal(final["late"][name], final["stopped"][name]), name
        assert torch.equal(final["plain"][name], final["early"][name]), name
    assert any(not torch.equal(final["late"][n], final["plain"][n]) for n in final["late"])
    assert early["valid"] == plain["valid"] and run["valid"] != plain["valid"]


@pytest.mark.slow
def test_bf16_autocast_and_eval_bleu(data_dir, tmp_path):
    save = tmp_path / "ck"
    summary = train(opts(data_dir, save, max_update=2, precision="bf16", eval_bleu=True))
    assert summary["num_updates"] == 2 and summary["skipped_updates"] == 0
    valid = records(save, "valid")[-1]
    assert np.isfinite(valid["loss"]) and summary["best_metric"] == "bleu"
    # the logged BLEU is validation_bleu of the final weights, under the same bf16 autocast
    from xformer_cli.base import distributed
    from xformer_cli.data.dataset import DataDir
    from xformer_cli.base.precision import autocast_context
    from xformer_cli.train.validate import validation_bleu
    from xformer_cli.text.vocab import load_sentencepiece

    ckpt = load_checkpoint(save / "checkpoint_last.pt")
    model = Transformer(build_config(opts(data_dir, save), DataDir.open(str(data_dir)))[0])
    model.load_state_dict(ckpt["model"])
    data = DataDir.open(str(data_dir))
    sp = load_sentencepiece(data.spm_model_bytes, "spm.model")
    cpu = torch.device("cpu")
    again = validation_bleu(model, data.split("valid"), sp, distributed.setup("cpu"), autocast_context("bf16", cpu),
                            MICRO["max_tokens"])
    assert valid["bleu"] == again


@pytest.mark.slow
def test_non_finite_updates_are_skipped_then_stop_naming_the_last_good_checkpoint(data_dir, tmp_path, monkeypatch):
    real = training.fused_output_loss
    calls = {"n": 0}

    def poisoned(features, weight, target, eps, **kwargs):
        calls["n"] += 1
        loss, nll = real(features, weight, target, eps, **kwargs)
        if calls["n"] == 3 or calls["n"] >= 6:  # update 3 is bad once; from update 6 on, always
            loss = loss * float("nan")
        return loss, nll

    monkeypatch.setattr(training, "fused_output_loss", poisoned)
    save = tmp_path / "ck"
    with pytest.raises(XfError, match=r"3 consecutive updates .* Last good checkpoint: .*checkpoint_\d+_5\.pt \(update 5\)"):
        train(opts(data_dir, save, max_update=50, save_interval_updates=1, max_nan_updates=3))
    assert [r["update"] for r in records(save, "skip")] == [3, 6, 7, 8]

    def at(update):
        (path,) = save.glob(f"checkpoint_*_{update}.pt")
        return params(path)

    # a skipped update leaves the weights as they were; the next good one moves them
    assert all(torch.equal(at(2)[k], at(3)[k]) for k in at(2))
    assert not all(torch.equal(at(3)[k], at(4)[k]) for k in at(3))


def test_updates_never_read_back_from_the_device_between_log_intervals(data_dir, tmp_path, monkeypatch):
    """No host-device synchronisation per update: the loss, gradient norm and skip decision stay on
    the device until a log interval, a validation or a save reads them. On a CPU nothing waits,
    so the test counts the reads that would make the host wait for a GPU."""
    reads: list[int] = []
    at = {"update": 0}
    for name in ("item", "tolist", "__bool__", "__float__", "__int__"):
        def spy(self, *args, _real=getattr(torch.Tensor, name), **kwargs):
            reads.append(at["update"])
            return _real(self, *args, **kwargs)
        monkeypatch.setattr(torch.Tensor, name, spy)
    real_step, real_plan = train_module.train_step, train_module.plan_update
    acting = set()  # updates after which the plan logs, validates, saves or stops

    def step(*args, **kwargs):
        at["update"] += 1  # reads from here to the next update's start belong to this update
        return real_step(*args, **kwargs)

    def plan(o, after):
        p = real_plan(o, after)
        if p.log or p.validate or p.save or p.stop:
            acting.add(after.num_updates)
        return p

    monkeypatch.setattr(train_module, "train_step", step)
    monkeypatch.setattr(train_module, "plan_update", plan)
    train(opts(data_dir, tmp_path / "ck", max_update=14, log_interval=5, save_interval_minutes=0))
    quiet = [n for n in range(1, 15) if n not in acting]
    assert len(quiet) >= 8 and {5, 10, 14} <= acting
    assert [n for n in reads if n in quiet] == []
    assert reads.count(5) > 0  # the spy sees the reads of a log interval


def test_fp16_overflows_skip_lower_the_scale_then_stop(data_dir, tmp_path, monkeypatch):
    """The dynamic loss scaling path (CUDA in real use), run on CPU's fp16 autocast."""
    monkeypatch.setattr(train_module, "resolve_precision", lambda device, precision: precision)
    real = training.fused_output_loss
    calls = {"n": 0}

    def overflowing(features, weight, target, eps, **kwargs):
        calls["n"] += 1
        loss, nll = real(features, weight, target, eps, **kwargs)
        return (loss * float("inf") if calls["n"] >= 2 else loss), nll

    monkeypatch.setattr(training, "fused_output_loss", overflowing)
    save = tmp_path / "ck"
    with pytest.raises(XfError, match=r"3 consecutive updates with fp16 gradient overflows \(the loss scale fell to 8192\)"):
        train(opts(data_dir, save, max_update=50, precision="fp16", max_nan_updates=3))
    assert [r["scale"] for r in records(save, "overflow")] == [32768.0, 16384.0, 8192.0]


def test_patience_stops_after_validations_without_improvement(data_dir, tmp_path, monkeypatch):
    losses = iter([3.0, 2.0, 2.5, 2.6, 1.0])
    monkeypatch.setattr(train_module, "validation_loss",
                        lambda *args: {"loss": next(losses), "nll": 1.0, "ppl": 2.7})
    save = tmp_path / "ck"
    summary = train(opts(data_dir, save, max_update=50, validate_interval_updates=1, patience=2))
    assert summary["stop_reason"] == "no improvement in 2 validations (--patience)"
    assert summary["num_updates"] == 4 and summary["best"] == 2.0
    assert load_checkpoint(save / "checkpoint_best.pt")["meta"]["num_updates"] == 2
    # a patience stop writes a numbered checkpoint like every other stop but a signal's
    assert load_checkpoint(save / "checkpoint_1_4.pt")["meta"]["num_updates"] == 4


def test_patience_epsilon_stops_a_run_whose_gains_are_all_small(data_dir, tmp_path, monkeypatch):
    losses = iter([3.0, 2.0, 1.995, 1.99, 1.0])  # still improving, by less than 0.01 each time
    monkeypatch.setattr(train_module, "validation_loss",
                        lambda *args: {"loss": next(losses), "nll": 1.0, "ppl": 2.7})
    save = tmp_path / "ck"
    summary = train(opts(data_dir, save, max_update=50, validate_interval_updates=1, patience=2,
                         patience_epsilon=0.01))
    assert summary["stop_reason"] == "no improvement above 0.01 in 2 validations (--patience, --patience-epsilon)"
    assert summary["num_updates"] == 4 and summary["best"] == 1.99  # the small gains are still the best
    assert load_checkpoint(save / "checkpoint_best.pt")["meta"]["num_updates"] == 4


# -- checkpoints that cannot run code, and bad input -------------------------------------------
class Evil:
    def __reduce__(self):
        return (os.system, (f"touch {Evil.marker}",))


def test_malicious_checkpoint_is_refused_and_not_run(data_dir, tmp_path):
    save = tmp_path / "ck"
    save.mkdir()
    Evil.marker = tmp_path / "pwned"
    torch.save({"format": "xf-checkpoint", "payload": Evil()}, save / "checkpoint_last.pt")
    before = (save / "checkpoint_last.pt").read_bytes()
    with pytest.raises(XfError, match="not an xf checkpoint .it holds Python objects") as e:
        train(opts(data_dir, save, max_update=1))
    assert "weights_only" not in str(e.value)
    assert not Evil.marker.exists()
    assert (save / "checkpoint_last.pt").read_bytes() == before
    assert sorted(p.name for p in save.iterdir()) == ["checkpoint_last.pt", "train.lock"]


def test_vocabulary_mismatch_on_resume_changes_nothing(data_dir, raw_slice, tmp_path):
    save = tmp_path / "ck"
    train(opts(data_dir, save, max_update=1))
    other = make_data(raw_slice, tmp_path / "other", 200)
    files = {p.name: p.read_bytes() for p in save.iterdir()}
    with pytest.raises(XfError, match="another vocabulary"):
        train(opts(other, save, max_update=2))
    assert {p.name: p.read_bytes() for p in save.iterdir()} == files


@pytest.mark.parametrize("change,message", [
    (dict(data="missing-dir"), "does not exist"),
    (dict(arch="huge"), "unknown arch 'huge'"),
    (dict(lr_scheduler="inverse_sqrt"), "needs a peak learning rate"),
    (dict(precision="fp16"), "fp16 is for CUDA"),
    (dict(max_tokens=0), "--max-tokens must be at least 1"),
    (dict(stop_time_hours=-0.5), "--stop-time-hours must not be negative"),
    (dict(d_model=0), "d.model must be at least 1, got 0"),  # not a ZeroDivisionError
    (dict(heads=0), "heads must be at least 1, got 0"),
    (dict(late_after=5), "--late-after needs --late-dropout or --late-label-smoothing"),
    (dict(late_dropout=0.3), "--late-dropout and --late-label-smoothing need --late-after"),
    (dict(late_after=5, late_label_smoothing=1.0), r"--late-label-smoothing must be in \[0, 1\)"),
    # known from the index at start-up, not at the update whose batch holds the pair
    (dict(max_positions=12), r"train pair \d+ has \d+ (en|de) subwords, \d+ positions with eos/bos, more than "
                             r"--max-positions 12; raise --max-positions to at least \d+"),
])
def test_bad_options_are_one_line_errors(data_dir, tmp_path, change, message):
    with pytest.raises(XfError, match=message) as e:  # impossible values: already when the options are made
        train(dataclasses.replace(opts(data_dir, tmp_path / "ck", max_update=1), **change))
    assert "\n" not in str(e.value)
    assert not (tmp_path / "ck").exists()


def test_incomplete_data_dir_and_unwritable_save_dir(data_dir, tmp_path):
    incomplete = tmp_path / "incomplete"
    incomplete.mkdir()
    with pytest.raises(XfError, match="no meta.json"):
        train(opts(incomplete, tmp_path / "ck", max_update=1))
    (tmp_path / "file").write_text("")
    with pytest.raises(XfError, match="not writable"):
        train(opts(data_dir, tmp_path / "file" / "ck", max_update=1))


# -- processes: signals and DDP ------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_finishes_the_update_saves_and_resumes(data_dir, tmp_path, signum):
    save = tmp_path / "ck"
    args = [sys.executable, "-m", "xformer_cli", "train", *cli_args(data_dir, save, max_update=100000)]
    proc = subprocess.Popen(args, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    log = save / "train_log.jsonl"
    deadline = time.monotonic() + 60
    while not (log.exists() and '"type": "train"' in log.read_text()):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() is not None else "timeout"
        time.sleep(0.1)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signum, err
    assert "Resume by running the same command again" in err and "Traceback" not in err
    stopped = load_checkpoint(save / "checkpoint_last.pt")["train_state"]["position"]["num_updates"]
    assert stopped >= 1
    summary = train(opts(data_dir, save, max_update=stopped + 2))
    assert summary["num_updates"] == stopped + 2
    assert records(save, "start")[-1]["update"] == stopped


@pytest.mark.slow
def test_ddp_two_gloo_processes_equal_one_process_accumulating(data_dir, tmp_path):
    """One update with world size 2 (one micro-batch each) == one process with update_freq 2."""
    kw = dict(max_update=1, dropout=0.0, lr_scheduler="inverse_sqrt", lr=1e-3, warmup_updates=1)
    single = train(opts(data_dir, tmp_path / "single", update_freq=2, **kw))
    assert single["num_updates"] == 1
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         "-m", "xformer_cli", "train", *cli_args(data_dir, tmp_path / "ddp", **kw)],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=180,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    a, b = params(tmp_path / "single" / "checkpoint_last.pt"), params(tmp_path / "ddp" / "checkpoint_last.pt")
    init = Transformer(build_config(opts(data_dir, "x", **kw), DataDir.open(str(data_dir)))[0])
    moved = 0.0
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=1e-5)
        moved = max(moved, (a[name] - init.state_dict()[name]).abs().max().item()) if name in init.state_dict() else moved
    assert moved > 1e-4  # the update did move the weights: the comparison means something
    ddp_log = records(tmp_path / "ddp", "start")[0]
    assert ddp_log["world_size"] == 2


def test_tensorboard_scalars_match_the_jsonl_log(data_dir, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    save, logdir = tmp_path / "ck", tmp_path / "tb"
    train(opts(data_dir, save, max_update=3, validate_interval_updates=3, tensorboard_logdir=str(logdir)))
    events = EventAccumulator(str(logdir))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"train/loss", "train/lr", "train/tgt_tok_s", "valid/loss", "valid/ppl"} <= tags, tags
    logged = records(save, "train")
    scalars = events.Scalars("train/loss")
    assert [e.step for e in scalars] == [r["update"] for r in logged] == [1, 2, 3]
    assert [e.value for e in scalars] == pytest.approx([r["loss"] for r in logged], rel=1e-6)
    assert [e.step for e in events.Scalars("valid/loss")] == [3]


def test_stop_time_hours_counts_resumed_time_and_leaves_a_numbered_checkpoint(data_dir, tmp_path):
    save = tmp_path / "ck"
    # 0.36 ms: over after the first update at the latest, so the second update is the last
    summary = train(opts(data_dir, save, max_epoch=5, stop_time_hours=1e-7))
    assert summary["stop_reason"] == "reached --stop-time-hours 1e-07"
    n = summary["num_updates"]
    assert n in (1, 2)
    stopped = load_checkpoint(save / f"checkpoint_1_{n}.pt")  # not an interval: written because training stopped
    assert stopped["meta"]["end_of_epoch"] is False
    state = load_checkpoint(save / "checkpoint_last.pt")["train_state"]
    assert state["elapsed_seconds"] > 0
    # the time already spent counts after a resume: nothing left to do
    assert train(opts(data_dir, save, max_epoch=5, stop_time_hours=1e-7))["stop_reason"] == "already done"
    # a larger budget trains on from where it stopped
    more = train(opts(data_dir, save, max_epoch=5, stop_time_hours=1.0, max_update=4))
    assert more["num_updates"] == 4


def test_a_corrupt_checkpoint_last_names_the_checkpoint_to_resume_from(data_dir, tmp_path):
    save = tmp_path / "ck"
    train(opts(data_dir, save, max_update=3, save_interval_updates=1))
    last = save / "checkpoint_last.pt"
    last.write_bytes(last.read_bytes()[:1000])  # a disk that filled up under another tool
    with pytest.raises(XfError, match=rf"checkpoint_last\.pt: not an xf checkpoint \(a truncated zip archive.*\); "
                                      rf"the newest intact checkpoint is {save}/checkpoint_\d+_3\.pt: copy it to"):
        train(opts(data_dir, save, max_update=4))


def test_prefetched_batches_are_the_batches_of_each_update(data_dir, tmp_path):
    """Collated ahead in a thread (CUDA's way, forced here on CPU), across an epoch boundary and
    after a jump (a resume), the micro-batches are those made when asked."""
    o = opts(data_dir, tmp_path, update_freq=2)
    with SaveDirLock(o.save_dir) as lock:
        run = set_up(o, distributed.setup("cpu"), lock)
    ahead = Prefetch(run.batches, background=True)
    n = run.batches.num_batches(1)
    positions = [(1, off) for off in range(0, n, 2)] + [(2, 0), (2, 2), (2, 6), (2, 8)]
    for epoch, offset in positions:
        got = ahead.take(epoch, offset)
        want = run.batches.micro_batches(epoch, offset)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert all(torch.equal(g[k], w[k]) for k in ("src", "prev_output", "target"))
    assert ahead.ahead[0] == (2, 10)  # the update after the last one asked for is on its way
    ahead.close()


def test_init_from_the_model_is_built_once_from_the_checkpoint(data_dir, tmp_path):
    """With --init-from, every start-up check runs against the checkpoint's model (its
    max_positions, not the --arch preset's 1024), and an --arch that is not its shape is refused."""
    from xformer_cli.model.checkpoint import make_checkpoint, save_checkpoint
    from xformer_cli.data.dataset import DataDir
    from xformer_cli.model.transformer import build_model

    data = DataDir.open(str(data_dir))
    short = build_model("tiny", vocab_size=data.vocab_size, d_model=32, d_ff=64, heads=2, max_positions=12)
    save_checkpoint(tmp_path / "short.pt", make_checkpoint(short, data.spm_model_bytes))
    fine_tune = dict(arch=None, d_model=None, d_ff=None, heads=None, encoder_layers=None, decoder_layers=None)
    with pytest.raises(XfError, match=r"pair \d+ has \d+ (en|de) subwords, \d+ positions with eos/bos, more than "
                                      r"--max-positions 12"):
        train(opts(data_dir, tmp_path / "a", max_update=1, init_from=str(tmp_path / "short.pt"), **fine_tune))
    with pytest.raises(XfError, match=r"--arch small conflicts with --init-from .*short.pt, whose model has "
                                      r"encoder-layers 2 \(small: 3\)"):
        train(opts(data_dir, tmp_path / "b", max_update=1, init_from=str(tmp_path / "short.pt"),
                   **{**fine_tune, "arch": "small"}))
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    roomy = build_model("tiny", vocab_size=data.vocab_size, d_model=32, d_ff=64, heads=2, max_positions=256)
    save_checkpoint(tmp_path / "roomy.pt", make_checkpoint(roomy, data.spm_model_bytes))
    summary = train(opts(data_dir, tmp_path / "c", max_update=1, init_from=str(tmp_path / "roomy.pt"),
                         **{**fine_tune, "arch": "tiny", "d_model": 32, "d_ff": 64, "heads": 2}))  # tiny's layers, the given sizes: agree
    assert summary["num_updates"] == 1
    start = records(tmp_path / "c", "start")[0]["options"]
    assert start["max_positions"] == 256 and start["d_model"] == 32 and start["arch"] == "tiny"


def test_init_from_convert_carries_a_model_over_to_marians_conventions_and_nothing_else(data_dir, tmp_path):
    """--sinusoids and --decoder-start change no weight: with --init-from-convert a fine-tune
    starts from the checkpoint's weights under the conventions given (and the result exports to
    Marian and Bergamot, no longer to MarianMT); without it they conflict as any model option
    does, and the flag neither changes another option nor passes when it changes nothing."""
    from xformer_cli.model.checkpoint import make_checkpoint, save_checkpoint
    from xformer_cli.model.transformer import build_model
    from xformer_cli.model.facts import read_facts

    data = DataDir.open(str(data_dir))
    paper = build_model("tiny", vocab_size=data.vocab_size, d_model=32, d_ff=64, heads=2, encoder_layers=1,
                        decoder_layers=1)
    save_checkpoint(tmp_path / "paper.pt", make_checkpoint(paper, data.spm_model_bytes))
    assert "--init-from-convert" in read_facts(tmp_path / "paper.pt").export_refusal("bergamot")
    fine_tune = dict(arch=None, d_model=None, d_ff=None, heads=None, encoder_layers=None, decoder_layers=None,
                     init_from=str(tmp_path / "paper.pt"), sinusoids="tensor2tensor", decoder_start="zero")
    with pytest.raises(XfError, match=r"--sinusoids tensor2tensor conflicts with --init-from .*paper.pt, whose model "
                                      r"has paper .*--init-from-convert lets --sinusoids and --decoder-start change"):
        train(opts(data_dir, tmp_path / "a", max_update=1, **fine_tune))
    with pytest.raises(XfError, match=r"--d-model 64 conflicts with --init-from"):
        train(opts(data_dir, tmp_path / "b", max_update=1, init_from_convert=True, **{**fine_tune, "d_model": 64}))
    with pytest.raises(XfError, match=r"--init-from-convert changes nothing: .* --sinusoids paper --decoder-start bos"):
        train(opts(data_dir, tmp_path / "c", max_update=1, init_from_convert=True,
                   **{**fine_tune, "sinusoids": None, "decoder_start": "bos"}))
    with pytest.raises(XfError, match=r"--init-from-convert .* needs --init-from"):
        opts(data_dir, tmp_path / "d", init_from_convert=True)
    assert not any((tmp_path / name).exists() for name in "abcd")

    o = opts(data_dir, tmp_path / "e", max_update=1, init_from_convert=True, **fine_tune)
    cfg, weights = build_config(o, data)
    assert (cfg.sinusoids, cfg.decoder_start, cfg.d_model) == ("tensor2tensor", "zero", 32)
    assert all(torch.equal(weights[k], v) for k, v in paper.state_dict().items())  # the trained weights, all of them
    assert train(o)["num_updates"] == 1
    facts = read_facts(tmp_path / "e" / "checkpoint_last.pt")
    assert facts.export_refusal("marian") is None and facts.export_refusal("bergamot") is None
    assert "--init-from-convert --sinusoids paper --decoder-start bos" in facts.export_refusal("huggingface")


@pytest.mark.parametrize("change", [dict(late_dropout=0.3), dict(label_smoothing=0.2), dict(late_after=5),
                                    dict(dropout=0.2)])
def test_a_resume_keeps_the_regularization_it_was_trained_with(data_dir, tmp_path, change):
    """Regularization is refused on resume like the model's --dropout (it was accepted silently)."""
    save = tmp_path / "ck"
    late = dict(late_after=1, late_dropout=0.2)
    train(opts(data_dir, save, max_update=2, **late))
    before = (save / "checkpoint_last.pt").read_bytes()
    key = next(iter(change))
    with pytest.raises(XfError, match=rf"regularization differs from the options .*{key} "):
        train(opts(data_dir, save, max_update=4, **{**late, **change}))
    assert (save / "checkpoint_last.pt").read_bytes() == before
    assert train(opts(data_dir, save, max_update=3, **late))["num_updates"] == 3
