"""``xf translate --workers N`` on the CPU: N worker processes decode batches at once, each with its
own copy of the models and its share of the torch threads (CTranslate2's inter_threads, Marian's
--cpu-threads).

Threads of one process would share Python's global interpreter lock, which a decoder step holds
for most of its hundreds of small operator calls at translation's batch sizes: processes scale
where threads do not (docs/performance.md, docs/benchmarks.md). A worker starts by
spawn (no fork of a process whose OpenMP threads already run), loads the checkpoints itself with
the engine, precision and int8 kernels the parent resolved, and then searches the batches it is
sent: the same code and the same batches as one process, so the outputs are the same.
"""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Sequence

from ..base.errors import XfError

_engine = None  # the worker's XfEngine (worker processes only)


def _open(opener, paths: tuple[str, ...], plan, ready) -> None:
    global _engine
    import signal

    # Ctrl-C reaches the whole process group: the parent stops the run and closes the pool (its
    # running batches finish), rather than each worker dying mid-batch under it
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    _engine, _ = opener(paths, plan)
    ready.wait()  # every worker has loaded: the parent's first batches find them all ready


def _ready() -> int:
    return os.getpid()


def _search(sentences, options, prefixes):
    """The batch's hypotheses, with this worker's pid and compile counters (search.AotStep's) so far."""
    found = _engine.search(sentences, options, None, prefixes)
    return found, os.getpid(), _engine.compiled.counters() if _engine.compiled is not None else None


class DecodeWorkers:
    """A pool of ``workers`` decoding processes, each opening ``paths`` with ``opener`` (the
    engine's own ``XfEngine.open``, passed down: this module sits below the engine) as ``plan``
    (one worker's ``decode.plan.DecodingPlan``, resolved by the parent: every worker runs the
    same kernels) says;
    ``search`` sends one batch to a free one and waits for its hypotheses (call it from as many
    threads as there are workers)."""

    def __init__(self, opener, paths: tuple[str, ...], plan, workers: int):
        ctx = multiprocessing.get_context("spawn")
        ready = ctx.Barrier(workers)
        self.workers = workers
        self.compiles: dict[int, tuple[float, int, int]] = {}  # pid -> its compile counters, with --compile
        self.pool = ProcessPoolExecutor(workers, ctx, initializer=_open, initargs=(opener, paths, plan, ready))
        try:  # start them all now, so that loading is not decoding time
            for future in [self.pool.submit(_ready) for _ in range(workers)]:
                future.result()
        except BrokenProcessPool:
            self.pool.shutdown(cancel_futures=True)
            raise XfError(f"--workers {workers}: a decoding process failed to start (out of memory?); try fewer "
                          "--workers") from None

    def search(self, sentences: Sequence[Sequence[int]], options, prefixes=None):
        try:
            found, pid, compiled = self.pool.submit(_search, [list(s) for s in sentences], options, prefixes).result()
        except BrokenProcessPool:
            raise XfError("a decoding process died unexpectedly (killed, or out of memory?); try fewer "
                          "--workers") from None
        if compiled is not None:
            self.compiles[pid] = compiled
        return found

    def compile_counters(self) -> tuple[float, int, int]:
        """The workers' longest compile time (they compile side by side), packages built, loaded."""
        found = self.compiles.values()
        return (max((c[0] for c in found), default=0.0), sum(c[1] for c in found), sum(c[2] for c in found))

    def close(self) -> None:
        self.pool.shutdown(cancel_futures=True)
