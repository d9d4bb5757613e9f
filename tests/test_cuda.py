"""xf on a CUDA device: bf16 and fp16 (loss-scaled) training steps, DDP over NCCL, and GPU decoding
equal to CPU fp32 decoding. Tests marked ``cuda`` are skipped, with the reason, without a GPU;
``bench/gpu.sh`` runs them (``pytest -m cuda``, with a per-test timeout). The DDP and decoding
tests also run on the CPU (gloo; float64 decoding against float32), so their calls into xf are
checked by ``make test`` on every machine: a rename breaks CI, not the one GPU run.

No shared data is needed (a GPU machine may have only the repository): the corpus is a toy task
of seeded pseudo-words, its target the source's words in reverse order, through xf preprocess.
"""

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from xformer_cli.model.checkpoint import load_checkpoint
from xformer_cli.model.transformer import build_model
from xformer_cli.text.vocab import PAD_ID, EOS_ID
from xformer_cli.settings.options import DecodingOptions, PreprocessOptions, TrainOptions
from xformer_cli.commands.preprocess import preprocess
from xformer_cli.decode.search import beam_search, greedy_search
from xformer_cli.commands.train import train

REPO = Path(__file__).resolve().parents[1]
SHAPE = dict(arch="tiny", d_model=64, d_ff=128, heads=4, encoder_layers=2, decoder_layers=2)
TRAIN = dict(max_tokens=400, warmup_updates=4, log_interval=1, seed=3, threads=1, dropout=0.0,
             lr_scheduler="inverse_sqrt", lr=2e-3, save_interval_minutes=0)
CUDA = pytest.mark.cuda


def toy_corpus(prefix: Path, lines: int, seed: int) -> None:
    rng = random.Random(seed)
    words = ["".join(rng.choice("abcdefghijklmnop") for _ in range(rng.randint(2, 7))) for _ in range(150)]
    src, tgt = [], []
    for _ in range(lines):
        sentence = [rng.choice(words) for _ in range(rng.randint(3, 15))]
        src.append(" ".join(sentence))
        tgt.append(" ".join(reversed(sentence)))
    Path(f"{prefix}.en").write_text("\n".join(src) + "\n", encoding="utf-8")
    Path(f"{prefix}.de").write_text("\n".join(tgt) + "\n", encoding="utf-8")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    raw = tmp_path_factory.mktemp("toy-raw")
    toy_corpus(raw / "train", 300, seed=1)
    toy_corpus(raw / "valid", 40, seed=2)
    dest = tmp_path_factory.mktemp("toy") / "bin"
    preprocess(PreprocessOptions(destdir=str(dest), trainpref=str(raw / "train"), validpref=str(raw / "valid"),
                                 bpe_vocab_size=200, workers=1))
    return dest


def opts(data_dir, save_dir, **kw) -> TrainOptions:
    return TrainOptions(data=str(data_dir), save_dir=str(save_dir), **{**SHAPE, **TRAIN, **kw})


def valid_losses(save_dir) -> list[float]:
    lines = (Path(save_dir) / "train_log.jsonl").read_text().splitlines()
    return [r["loss"] for r in map(json.loads, lines) if r["type"] == "valid"]


# -- training steps in half precision ----------------------------------------------------------
@CUDA
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_half_precision_steps_on_cuda_track_fp32(data_dir, tmp_path, precision):
    """A few updates in bf16 autocast (or fp16 with dynamic loss scaling) move the weights as fp32
    does: validation loss within 2% of the fp32 run's, no skipped step, finite weights."""
    kw = dict(device="cuda", max_update=6, validate_interval_updates=6)
    fp32 = train(opts(data_dir, tmp_path / "fp32", precision="fp32", **kw))
    half = train(opts(data_dir, tmp_path / precision, precision=precision, **kw))
    assert fp32["num_updates"] == half["num_updates"] == 6
    assert half["skipped_updates"] == 0
    start = valid_losses(tmp_path / "fp32")  # the first validation is at update 6; compare the runs
    assert valid_losses(tmp_path / precision)[-1] == pytest.approx(start[-1], rel=0.02)
    ckpt = load_checkpoint(tmp_path / precision / "checkpoint_last.pt")
    assert all(torch.isfinite(t).all() for t in ckpt["model"].values() if t.is_floating_point())
    scaler = ckpt["train_state"]["scaler"]
    if precision == "fp16":  # the loss scale is part of the state a resume restores
        assert scaler is not None and scaler["scale"] > 1
    else:
        assert scaler is None
    assert half["peak_memory_mib"] > 0  # CUDA allocated memory was measured


@CUDA
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_updates_never_wait_for_the_gpu(data_dir, tmp_path, monkeypatch, precision):
    """Every update after the first (which creates the optimizer's state) runs with CUDA's sync
    debug mode set to "error": a read of a device value in the step (a loss, a norm, a boolean
    index's size, the skip decision) would raise. The loop reads them at log intervals only."""
    import xformer_cli.commands.train as train_module

    real, calls = train_module.train_step, {"n": 0}

    def strict_step(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 1:
            return real(*args, **kwargs)
        torch.cuda.set_sync_debug_mode("error")
        try:
            return real(*args, **kwargs)
        finally:
            torch.cuda.set_sync_debug_mode("default")

    monkeypatch.setattr(train_module, "train_step", strict_step)
    summary = train(opts(data_dir, tmp_path / precision, device="cuda", precision=precision,
                         max_update=12, log_interval=6))
    assert summary["num_updates"] == 12 and calls["n"] == 12


# -- which attention runs ----------------------------------------------------------------------
def test_a_cuda_device_turns_cudnn_attention_off(monkeypatch):
    """distributed.configure_cuda, called where xf resolves a CUDA device (training and decoding
    alike), turns SDPA's cuDNN backend off: it plans every new shape, and bucketed batches are
    new shapes. Checked on the CPU with CUDA's presence faked; a CPU device leaves it alone."""
    from xformer_cli.base import distributed

    before = torch.backends.cuda.cudnn_sdp_enabled()
    try:
        torch.backends.cuda.enable_cudnn_sdp(True)
        assert distributed.resolve_device("cpu") == torch.device("cpu")
        assert torch.backends.cuda.cudnn_sdp_enabled()
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        assert distributed.resolve_device("cuda", 0) == torch.device("cuda", 0)
        assert not torch.backends.cuda.cudnn_sdp_enabled()
    finally:
        torch.backends.cuda.enable_cudnn_sdp(before)


@CUDA
def test_attention_on_cuda_runs_flash_or_memory_efficient_kernels_not_cudnn():
    """After xf's device set-up, a bf16 forward of batches of two shapes runs SDPA's flash or
    memory-efficient kernels (read from the profiler's kernel names), never cuDNN's."""
    from torch.profiler import ProfilerActivity, profile

    from xformer_cli.base import distributed

    env = distributed.setup("cuda")
    assert not torch.backends.cuda.cudnn_sdp_enabled()
    torch.manual_seed(0)
    model = build_model("tiny", vocab_size=300, **{k: v for k, v in SHAPE.items() if k != "arch"}).to(env.device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof, torch.autocast("cuda", dtype=torch.bfloat16):
        for b, s, t in ((8, 17, 13), (5, 23, 29)):
            src = torch.randint(4, 300, (b, s), device=env.device)
            prev = torch.randint(4, 300, (b, t), device=env.device)
            model(src, prev).float().sum().backward()
        torch.cuda.synchronize()
    kernels = [e.key.lower() for e in prof.key_averages()]
    assert not [k for k in kernels if "cudnn" in k], kernels
    assert [k for k in kernels if "flash" in k or "fmha" in k or "efficient" in k], kernels


# -- DDP under torchrun with one process -----------------------------------------------------------
def run_group(args: list[str], timeout: float, **kw) -> subprocess.CompletedProcess:
    """subprocess.run in a process group of its own, the whole group killed on timeout: torchrun's
    workers are its children, and a hung worker (NCCL) would outlive a killed torchrun."""
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, **kw)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{' '.join(args[:6])}... timed out after {timeout:.0f}s (process group killed):\n{err[-3000:]}")
    except BaseException:
        # pytest-timeout (bench/gpu.sh runs it with --timeout-method signal) raises its failure
        # here, mid-wait, as does Ctrl-C: the group is in a session of its own, so neither that
        # stage's `timeout` nor the terminal would reach torchrun's workers: stop them here.
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


@pytest.mark.slow
def test_a_timed_out_launcher_takes_its_workers_with_it(tmp_path):
    """run_group's timeout kills the launcher's children too (as torchrun's workers would be)."""
    pid_file = tmp_path / "worker.pid"
    with pytest.raises(pytest.fail.Exception, match="timed out"):
        run_group(["bash", "-c", f"sleep 120 & echo $! > {pid_file}; wait"], 2)
    worker = int(pid_file.read_text())
    assert wait_until_gone(worker), f"worker {worker} still runs after its launcher timed out"


def wait_until_gone(pid: int, seconds: float = 10) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:  # gone, or a zombie waiting for init to reap it: either way no longer running
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.1)
    return False


@pytest.mark.slow
def test_a_per_test_timeout_firing_mid_wait_takes_the_workers_with_it(tmp_path):
    """pytest-timeout's signal method raises its failure from a SIGALRM handler while run_group
    waits (as here, by hand): the launcher and its workers are stopped before the test fails."""
    pid_file = tmp_path / "worker.pid"

    def fire(signum, frame):
        pytest.fail("Timeout >1.0s")

    previous = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, 1.5)
    try:
        with pytest.raises(pytest.fail.Exception, match="Timeout"):
            run_group(["bash", "-c", f"sleep 120 & echo $! > {pid_file}; wait"], 60)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert wait_until_gone(int(pid_file.read_text())), "the worker still runs after the per-test timeout"


@pytest.mark.slow
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=CUDA)])
def test_torchrun_one_process_trains_through_ddp_like_a_plain_run(data_dir, tmp_path, device):
    """torchrun --nproc-per-node 1 joins a process group (NCCL on a GPU, gloo on CPU) and trains
    through DDP (gradient accumulation with no_sync); the weights equal a plain run's."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1"]
    probe = ("from xformer_cli.base import distributed as d; import torch.distributed as dist; "
             f"e = d.setup({device!r}); print(e.distributed, dist.get_backend(), e.world_size); d.shutdown()")
    out = run_group([*torchrun, "--no-python", sys.executable, "-c", probe], 120, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["True", "nccl" if device == "cuda" else "gloo", "1"]

    kw = dict(device=device, max_update=2, update_freq=2)
    plain = train(opts(data_dir, tmp_path / "plain", **kw))
    args = [str(data_dir), "--save-dir", str(tmp_path / "ddp")]
    for key, value in {**SHAPE, **TRAIN, **kw}.items():
        args += [f"--{key.replace('_', '-')}", str(value)]
    out = run_group([*torchrun, "-m", "xformer_cli", "train", *args], 300, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    a = load_checkpoint(tmp_path / "plain" / "checkpoint_last.pt")["model"]
    b = load_checkpoint(tmp_path / "ddp" / "checkpoint_last.pt")["model"]
    assert plain["num_updates"] == 2
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=1e-5)


# -- decoding on the GPU equals decoding on the CPU ------------------------------------------------
def random_sources(n: int, vocab: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 30, (n,), generator=g)
    src = torch.full((n, int(lengths.max()) + 1), PAD_ID)
    for i, length in enumerate(lengths.tolist()):
        src[i, :length] = torch.randint(4, vocab, (length,), generator=g)
        src[i, length] = EOS_ID
    return src


@pytest.mark.slow
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=CUDA)])
def test_gpu_greedy_and_beam_equal_cpu_fp32(device):
    """fp32 search on the GPU (SDPA kernels, cached decoding, batch shrinking as sentences finish)
    chooses the same tokens as on the CPU, with scores equal to 1e-3. Without a GPU: float64 on
    the CPU against float32 (the same calls, so a changed search signature fails everywhere)."""
    torch.manual_seed(0)
    model = build_model("small", vocab_size=500, encoder_layers=2, decoder_layers=2).eval()
    src = random_sources(24, 500, seed=1)
    other = build_model("small", vocab_size=500, encoder_layers=2, decoder_layers=2)
    other.load_state_dict(model.state_dict())
    other = (other.cuda() if device == "cuda" else other.double()).eval()
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32
    try:
        for search, options in ((greedy_search, DecodingOptions(beam_size=1, max_len_a=1.0, max_len_b=5)),
                                (beam_search, DecodingOptions(beam_size=4, nbest=2, max_len_a=1.0, max_len_b=5))):
            cpu = search([model], src, options)
            gpu = search([other], src.to(device), options)
            assert len(cpu) == len(gpu) == len(src)
            assert all(len(h) == options.nbest for h in cpu)
            for hyps_cpu, hyps_gpu in zip(cpu, gpu):
                assert [h.tokens for h in hyps_cpu] == [h.tokens for h in hyps_gpu], search.__name__
                for h_cpu, h_gpu in zip(hyps_cpu, hyps_gpu):
                    assert h_gpu.score == pytest.approx(h_cpu.score, abs=1e-3)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
