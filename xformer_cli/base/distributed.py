"""Data-parallel training on PyTorch's own machinery: nothing home-made.

``torchrun --nproc-per-node G [--nnodes N ...] -m xformer_cli train ...`` starts one process per
device and sets RANK, LOCAL_RANK and WORLD_SIZE; ``init_process_group`` reads them (NCCL between
GPUs, gloo between CPU processes) and ``DistributedDataParallel`` all-reduces the gradients.
Without torchrun this is a world of one and every collective below is a no-op. Under torchrun
even one process joins a process group and trains through DDP, so that one GPU exercises the
same path (NCCL, gradient buckets, ``no_sync``) as many.

No process waits forever for another: a collective that a dead or hung process never joins fails
after ``--ddp-timeout-minutes`` (10 by default; a dead process's closed connection usually fails
it at once), and ``peer_failures`` turns that into a one-line error on every surviving process,
so the whole job stops and can be started again from ``checkpoint_last.pt``.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Optional, Sequence

import torch
import torch.distributed as dist

from .errors import XfError


@dataclass(frozen=True)
class Env:
    """Where this process stands: its rank among ``world_size`` processes and its device."""

    rank: int
    world_size: int
    device: torch.device  # cuda:LOCAL_RANK under torchrun
    process_group: bool = False  # joined a torch.distributed group (torchrun), even a world of one
    host_group: object = None  # a gloo group for ``sum``: numbers the host holds stay on the host

    @property
    def is_main(self) -> bool:
        """Rank 0 alone writes checkpoints and logs and shows progress."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        """Gradients go through DDP and the sums below through collectives."""
        return self.process_group

    def sum(self, values: Sequence[float]) -> list[float]:
        """Element-wise sum of ``values`` over all ranks (one collective), as Python floats.

        The values are the host's (token counts, signals), so they travel between CPU memories on
        a gloo group: over NCCL they would queue behind the GPU's work and make the host wait
        for it every update."""
        if not self.distributed:
            return [float(v) for v in values]
        t = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(t, group=self.host_group)
        return t.tolist()

    def sum_tensor(self, t: torch.Tensor) -> torch.Tensor:
        """In-place sum of a tensor over all ranks; returns it."""
        if self.distributed:
            dist.all_reduce(t)
        return t

    def gather(self, obj) -> list:
        """Every rank's ``obj`` (picklable), in rank order, on every rank."""
        if not self.distributed:
            return [obj]
        out: list = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out


def resolve_device(option: str, local_rank: int = 0) -> torch.device:
    """cpu, cuda (this process's GPU under torchrun), or auto: cuda when there is one."""
    if option == "auto":
        option = "cuda" if torch.cuda.is_available() else "cpu"
    if option == "cuda":
        if not torch.cuda.is_available():
            raise XfError("--device cuda: no CUDA device is available (use --device cpu)")
        configure_cuda()
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def configure_cuda() -> None:
    """What every xf process on CUDA runs with (training and decoding both resolve their device
    here). cuDNN's attention, one of SDPA's backends and the one torch prefers on Hopper, builds a
    plan for every new shape (up to about a second each); a length-bucketed training run meets a
    new (batch, length) shape almost every update, and decoding one every step. Flash and
    memory-efficient attention take any shape, so SDPA chooses between them: not measured faster
    anywhere, cuDNN attention stays off (tests/test_cuda.py shows which backend runs)."""
    torch.backends.cuda.enable_cudnn_sdp(False)


def setup(device_option: str, timeout_minutes: float = 10.0) -> Env:
    """Join the process group that torchrun describes in the environment (if any); its
    collectives fail after ``timeout_minutes`` of waiting for another process."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = resolve_device(device_option, local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    launched = world_size > 1 or "TORCHELASTIC_RUN_ID" in os.environ  # torchrun sets it, even for one process
    if launched and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo",
                                timeout=timedelta(minutes=timeout_minutes))
    host_group = None
    if dist.is_initialized():  # on CPU a second gloo group, redundant but the same code path
        host_group = dist.new_group(backend="gloo", timeout=timedelta(minutes=timeout_minutes))
    return Env(rank, world_size, device, process_group=dist.is_initialized(), host_group=host_group)


# What the backends say when another process died or hung (gloo, NCCL, the TCP store).
PEER_FAILURE_WORDS = ("connection closed", "connection reset", "timed out", "timeout", "broken pipe",
                      "connection refused", "nccl", "gloo", "socket")


@contextlib.contextmanager
def peer_failures(env: Env, resume_hint: str = ""):
    """One line instead of a backend traceback when a collective fails because another process
    died or hung: every survivor exits with it instead of hanging."""
    try:
        yield
    except RuntimeError as e:  # DistBackendError, DistNetworkError and gloo's errors are RuntimeErrors
        text = str(e).strip()
        if not env.distributed or not (isinstance(e, getattr(dist, "DistError", ())) or
                                       any(w in text.lower() for w in PEER_FAILURE_WORDS)):
            raise
        first = text.splitlines()[0] if text else type(e).__name__
        raise XfError(f"rank {env.rank} of {env.world_size}: lost another training process ({first[:200]}); "
                      f"stopping. {resume_hint}".strip()) from None


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def cpu_cores() -> int:
    """The CPU cores this process may run on (its affinity mask: a cluster job's share)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def threads_warning(threads: int) -> Optional[str]:
    """A warning when --threads asks for more threads than there are cores, else None."""
    cores = cpu_cores()
    if threads <= cores:
        return None
    return (f"--threads {threads} is more than the {cores} CPU cores this process may use: threads that share a "
            f"core wait for each other (often many times slower than --threads {cores}); use --threads {cores} or 0")
