"""Compiling: torch.compile of training's forward pass (``compile_forward``, xf train --compile:
the backend, dynamic shapes for every input dimension, the count of compiled graphs), and the
ahead-of-time packages of the decoder step (``AotPackages``, decoder_step.AotStep) kept in xf's
per-user cache (``cache_dir``).

Private torch APIs used here, checked with torch 2.4-2.13, each with its fallback:
``torch._dynamo.maybe_mark_dynamic`` (from 2.3; before it: ``mark_dynamic``), dynamo's
``counters["stats"]["unique_graphs"]`` (the compiled-graph count; 0 where absent).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import tempfile
from pathlib import Path
from typing import Optional

import torch

from .console import warn

COMPILE_BACKEND = "inductor"  # tests use "aot_eager": the same graphs, without minutes of code generation


def mark_dynamic(*tensors: torch.Tensor) -> None:
    """Give every dimension of every tensor a symbolic size of its own. ``dynamic=True`` alone
    "duck sizes" the first call: equal sizes share one symbol, so a first batch with as many source
    as target positions (S == T) makes a graph that assumes S == T, and the first batch with
    S != T recompiles forward and backward (seen with TORCH_LOGS=recompiles: two graphs).
    ``torch._dynamo.maybe_mark_dynamic`` (torch >= 2.3; unlike ``mark_dynamic`` it does not raise
    when a size gets specialized, as a batch of one sentence does) falls back to ``mark_dynamic``."""
    mark = getattr(torch._dynamo, "maybe_mark_dynamic", None) or torch._dynamo.mark_dynamic
    for t in tensors:
        for dim in range(t.dim()):
            mark(t, dim)


class DynamicInputs:
    """A compiled module whose tensor arguments are marked dynamic before each call. Attribute
    reads go to the compiled module (and through it to the module itself: DDP's ``no_sync``)."""

    def __init__(self, compiled: torch.nn.Module):
        self.compiled = compiled

    def __call__(self, *args, **kwargs):
        mark_dynamic(*(a for a in args if torch.is_tensor(a)))
        return self.compiled(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.compiled, name)


def compile_forward(forward: torch.nn.Module, backend: Optional[str] = None) -> DynamicInputs:
    """torch.compile of the training forward pass (the model, or DDP around it, whose buckets
    dynamo splits the graph at; bench/bench_train.py compiles its torch.nn.Transformer reference
    with it too). Dynamic shapes, inputs marked dynamic: batches of every (B, S, T) share one
    compiled graph instead of one per shape. Validation and search run the uncompiled model, and
    the output projection with the loss (loss.fused_output_loss, a custom autograd function)
    stays eager."""
    return DynamicInputs(torch.compile(forward, backend=backend or COMPILE_BACKEND, dynamic=True))


def compiled_graphs() -> int:
    """How many graphs torch.compile has made in this process (recompilations included)."""
    try:
        from torch._dynamo.utils import counters
    except ImportError:  # pragma: no cover - a torch without dynamo
        return 0
    return int(counters["stats"].get("unique_graphs", 0))


# -- xf's cache: compiled steps and timings kept between runs -------------------------------------
def cache_dir() -> Path:
    """xf's per-user cache: $XDG_CACHE_HOME/xf, else ~/.cache/xf (the XDG base directory rule)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "xf"


def machine_key() -> str:
    """What a compiled package depends on besides the model and the code: the torch build, this
    CPU's instruction sets (its /proc/cpuinfo flags, as a digest) and the set torch's kernels and
    inductor's generated code use (``ATEN_CPU_CAPABILITY`` caps it below the CPU's: a run capped
    at AVX2 must not load a package of AVX-512 kernels)."""
    from .precision import cpu_flags

    flags = hashlib.sha256(" ".join(sorted(cpu_flags())).encode()).hexdigest()[:16]
    return f"torch {torch.__version__}, cpu flags {flags}, capability {torch.backends.cpu.get_cpu_capability()}"


def untrusted(path: Path) -> Optional[str]:
    """Why ``path`` (a file or directory of the cache) must not be loaded, or None: loading a
    compiled cache runs the code in it, so xf trusts only what this user owns and nobody else can
    write (no group or other write bit), as ssh trusts ~/.ssh."""
    if not hasattr(os, "getuid"):  # pragma: no cover - not POSIX: no owner to check
        return None
    st = path.stat()
    if st.st_uid != os.getuid():
        return f"owned by uid {st.st_uid}, not by this user"
    if st.st_mode & 0o022:
        return f"writable by others (mode {st.st_mode & 0o777:o})"
    return None


def write_private(path: Path, data: bytes) -> None:
    """Write ``path`` whole or not at all (a temporary file renamed over it), readable and
    writable by this user only, its directories made private (0700) where created."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")  # mode 0600
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def weights_digest(module: torch.nn.Module) -> str:
    """A digest of a module's weights (names, dtypes, shapes and values): what an ahead-of-time
    package, which holds them as constants, must match besides the config."""
    h = hashlib.sha256()

    def add(name: str, t) -> None:
        if isinstance(t, (tuple, list)):  # torch.ao's packed int8 layers: (weight, bias)
            for i, item in enumerate(t):
                add(f"{name}.{i}", item)
        elif not torch.is_tensor(t):
            h.update(f"{name} {t!r};".encode())
        else:
            if t.is_quantized:
                h.update(f"{name} scales {t.q_per_channel_scales().tolist() if t.qscheme() in (torch.per_channel_affine, torch.per_channel_symmetric) else t.q_scale()};".encode())
                t = t.int_repr()
            h.update(f"{name} {t.dtype} {tuple(t.shape)};".encode())
            h.update(t.detach().reshape(-1).contiguous().cpu().view(torch.uint8).numpy().tobytes() if t.numel() else b"")

    for name, t in module.state_dict().items():
        add(name, t)
    return h.hexdigest()[:24]


class _AotRunner:
    """A loaded AOTInductor package called as the exported module: its tensor and list-of-tensor
    arguments flattened in order (torch.export's order for them), its outputs unflattened by the
    package's own output spec, read once (torch's AOTICompiledModel reads and parses both specs
    at every call)."""

    def __init__(self, loader):
        from torch.utils import _pytree

        self.loader = loader
        self.out_spec = _pytree.treespec_loads(loader.get_call_spec()[1])
        self.unflatten = _pytree.tree_unflatten

    def __call__(self, *args):
        flat = [t for a in args for t in (a if isinstance(a, (list, tuple)) else (a,))]
        return self.unflatten(self.loader.boxed_run(flat), self.out_spec)


def _load_package(path: Path):
    """The loaded AOTInductor package at ``path``, a callable. ``aoti_load_package`` imports
    torch.export's archive reader (1.4 s) and compares the machine with the package's
    (``get_device_information``, whose CPU ISA probe compiles and loads test programs in
    subprocesses: 1.4 s of a 1.6 s load here, more with a cold inductor cache), which the
    package's key (``machine_key``: torch and the CPU flags) has already done; so the package's
    loader is made directly, and torch's public function is the fallback where its internals
    differ."""
    try:
        loader = torch._C._aoti.AOTIModelPackageLoader(str(path), "model", False, 1, -1)
    except (AttributeError, TypeError):  # another torch: its own way
        import torch._inductor as inductor

        return inductor.aoti_load_package(str(path))
    return _AotRunner(loader)


class AotPackages:
    """AOTInductor packages (``torch._inductor.aoti_compile_and_package``: an exported graph
    compiled to a shared library with its weights) kept between runs under ``root`` (cache_dir()
    / "aot"), one file a key and machine: a run that finds its package loads it in about a
    second, where torch.compile traces again every run. A package is native code: one that is
    not this user's, is writable by others or does not load is not used (a warning) and built
    again; a build is written whole or not at all. A ``root`` that is not this user's own or that
    others can write is not written into either (what others can replace there would be refused
    at the next load): one warning, and this run builds into a private temporary directory,
    removed with these packages."""

    def __init__(self, root: Optional[Path] = None):
        self.root = cache_dir() / "aot" if root is None else Path(root)
        why = untrusted(self.root) if self.root.is_dir() else None
        self.private: Optional[tempfile.TemporaryDirectory] = None
        if why:
            warn(f"{self.root}: not using this cache of compiled steps ({why}); compiling into a private "
                 "temporary directory for this run only (make it this user's own, not writable by others, to "
                 "keep the packages between runs)")
            self.private = tempfile.TemporaryDirectory(prefix="xf-aot-")  # mode 0700
            self.root = Path(self.private.name)

    def path(self, key: str) -> Path:
        digest = hashlib.sha256(f"{machine_key()}; {key}".encode()).hexdigest()[:24]
        return self.root / f"step-{digest}.pt2"

    def load(self, key: str):
        """The loaded package of ``key`` (a callable over the exported inputs), or None."""
        path = self.path(key)
        if not path.exists():
            return None
        why = untrusted(path) or untrusted(path.parent)
        if why:
            warn(f"{path}: not loading this compiled package: {why}")
            return None
        try:
            return _load_package(path)
        except Exception as e:  # a truncated or foreign file raises whatever its reader meets
            warn(f"{path}: ignoring an unreadable compiled package ({type(e).__name__}: {e}); compiling anew")
            return None

    @contextlib.contextmanager
    def building(self, key: str):
        """Held while ``key``'s package is built: another process (a --workers decoder) that needs
        it waits, then loads what this one built, instead of building it too."""
        path = self.path(key)
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with open(path.parent / f".{path.stem}.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def build(self, key: str, exported) -> Path:
        """Compile ``exported`` (a torch.export.ExportedProgram) into the package of ``key``."""
        path = self.path(key)
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = path.parent / f".{path.stem}.{os.getpid()}.pt2"  # the packager wants a .pt2 name
        try:
            torch._inductor.aoti_compile_and_package(exported, package_path=str(tmp))
            os.chmod(tmp, 0o600)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        return path
