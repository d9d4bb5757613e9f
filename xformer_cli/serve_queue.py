"""Dynamic batching for xf serve: requests' lines queued, decoded together on one worker thread.

A request becomes a ``Job`` (its lines as subword ids, one direction). The worker takes the
oldest job, waits up to ``max_wait_ms`` from its arrival for more jobs of the same direction
while their source subwords stay within ``max_batch_tokens``, and decodes them together with
``translation.search_lines``: sorted by length, longest first, as ``xf translate`` sorts a buffer.
Each line is searched with the server's options whatever shares its batch, so its translation is
the one ``xf translate`` gives for it (up to float rounding in batched matrix products; see
docs/serve.md). The event loop only waits on each job's future: it never runs a search.
"""

from __future__ import annotations

import collections
import concurrent.futures
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from .engines import Engine
from .options import TranslateOptions
from .translation import Stats, hypothesis_texts, search_lines


@dataclass
class Direction:
    """One served direction: its engine, sentencepiece model and decoding options."""

    source: str
    target: str
    engine: Engine
    sp: object
    options: TranslateOptions

    @property
    def code(self) -> str:
        return f"{self.source}-{self.target}"


@dataclass
class Job:
    """One request's lines. pieces: subword ids per line ([] for an empty line, no search)."""

    direction: Direction
    pieces: list[list[int]]
    enqueued: float = field(default_factory=time.perf_counter)
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)
    queue_wait: float = 0.0  # seconds from submit to the start of its batch's search
    decode_time: float = 0.0  # seconds its batch's search took

    @property
    def tokens(self) -> int:
        """Source subwords with eos, as a batch counts them."""
        return sum(len(ids) + 1 for ids in self.pieces if ids)


class QueueFull(Exception):
    """The queue holds max_queue_lines lines already; retry_after: seconds to wait, a guess."""

    def __init__(self, retry_after: int):
        super().__init__(f"the queue is full; retry after {retry_after} s")
        self.retry_after = retry_after


class BatchQueue:
    """Jobs in arrival order and the one worker thread that decodes them in batches.

    ``submit(job)`` returns at once (or raises QueueFull); the job's future gets, per line, the
    texts of its hypotheses, best first (an empty line: [""]). on_batch(sentences, seconds) and
    on_depth(lines) report each batch and the queue's depth (for /metrics).
    """

    def __init__(self, max_batch_tokens: int, max_wait_ms: float, max_queue_lines: int,
                 on_batch: Optional[Callable[[int, float], None]] = None,
                 on_depth: Optional[Callable[[int], None]] = None):
        self.max_batch_tokens, self.max_wait = max_batch_tokens, max_wait_ms / 1000
        self.max_queue_lines = max_queue_lines
        self.on_batch, self.on_depth = on_batch, on_depth
        self.jobs: collections.deque[Job] = collections.deque()
        self.lines = 0  # lines of the queued jobs
        self.rate = 0.0  # lines per second of recent batches (for Retry-After)
        self.stats = Stats()
        self.batches = self.sentences = self.lines_done = 0  # for the summary at exit
        self.cond = threading.Condition()
        self.stopping = False
        self.thread = threading.Thread(target=self._run, name="xf-serve-worker", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self, timeout: float) -> None:
        """Decode what is queued, then end the worker (waiting at most ``timeout`` seconds)."""
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
        self.thread.join(timeout)

    def submit(self, job: Job) -> None:
        with self.cond:
            if self.stopping:
                raise QueueFull(1)
            if self.lines + len(job.pieces) > self.max_queue_lines:
                raise QueueFull(max(1, round(self.lines / self.rate)) if self.rate else 1)
            self.jobs.append(job)
            self._count(len(job.pieces))
            self.cond.notify()

    def _count(self, lines: int) -> None:
        self.lines += lines
        if self.on_depth is not None:
            self.on_depth(self.lines)

    def _next_batch(self) -> Optional[list[Job]]:
        """The oldest job and those of its direction that fit with it, once the batch is full or
        the oldest has waited max_wait; None when stopping with nothing queued."""
        with self.cond:
            while True:
                while not self.jobs and not self.stopping:
                    self.cond.wait()
                if not self.jobs:
                    return None
                first = self.jobs[0]
                batch, tokens = [], 0
                for job in self.jobs:
                    if job.direction is first.direction and (not batch or tokens + job.tokens <= self.max_batch_tokens):
                        batch.append(job)
                        tokens += job.tokens
                full = tokens >= self.max_batch_tokens or len(batch) < sum(j.direction is first.direction for j in self.jobs)
                left = first.enqueued + self.max_wait - time.perf_counter()
                if full or left <= 0 or self.stopping:
                    for job in batch:
                        self.jobs.remove(job)
                    self._count(-sum(len(job.pieces) for job in batch))
                    return batch
                self.cond.wait(left)

    def _run(self) -> None:
        while (batch := self._next_batch()) is not None:
            # a job whose request gave up (504) before its batch started is not decoded
            batch = [job for job in batch if job.future.set_running_or_notify_cancel()]
            if batch:
                self._decode(batch)

    def _decode(self, batch: list[Job]) -> None:
        direction = batch[0].direction
        pieces = [ids for job in batch for ids in job.pieces]
        start = time.perf_counter()
        for job in batch:
            job.queue_wait = start - job.enqueued
        try:
            found, _ = search_lines(direction.engine, pieces, direction.options, self.stats,
                                    max_tokens=self.max_batch_tokens, max_sentences=None,
                                    on_batch=lambda n: self._batch_done(n, start))
        except Exception as e:  # noqa: BLE001 - the request gets the error, the worker goes on
            for job in batch:
                job.future.set_exception(e)
            return
        elapsed = time.perf_counter() - start
        lines = len(pieces)
        self.lines_done += lines
        self.rate = lines / max(elapsed, 1e-6) if not self.rate else 0.8 * self.rate + 0.2 * lines / max(elapsed, 1e-6)
        at = 0
        for job in batch:
            job.decode_time = elapsed
            texts = [hypothesis_texts(direction.sp, hyps) if hyps is not None else [""] for hyps in found[at:at + len(job.pieces)]]
            at += len(job.pieces)
            job.future.set_result(texts)

    def _batch_done(self, sentences: int, start: float) -> None:
        self.batches += 1
        self.sentences += sentences
        if self.on_batch is not None:
            self.on_batch(sentences, time.perf_counter() - start)

