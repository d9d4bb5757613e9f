"""Dynamic batching for xf serve: requests' lines queued, decoded together on one worker thread.

A request becomes a ``Job`` (its lines as subword ids, one direction). The worker takes the
oldest job's lines not yet taken, waits up to ``max_wait_ms`` from its arrival for more jobs of
the same engine while their source subwords stay within ``max_batch_tokens`` (a job too long
for one batch goes on in the next), and decodes them together with ``decode.translate.search_lines``:
the directions of one multilingual model share its engine, and so its batches (each line's
target tag is its first source id; decoding and the options are the model's, the same for all),
sorted by length, longest first, as ``xf translate`` sorts a buffer. A job dropped (its client
gone, its request given up) loses the lines not yet taken; ``stop`` ends the worker between two
batches, never inside a search.
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

from ..base.errors import memory_detail, out_of_memory
from ..decode.confidence import Scorer, mean_log_probability
from ..decode.constraints import word_boundaries
from ..decode.engines import Engine
from ..decode.translate import Stats, hypothesis_texts, search_lines
from ..model.attention_maps import alignment_pairs, word_ids
from ..settings.options import TranslateOptions
from ..text.glossary import Glossary
from ..text.languages import TaggedVocabulary
from .fields import HttpError


@dataclass
class Direction:
    """One served direction: its engine, vocabulary and decoding options. The directions of one
    checkpoint share its engine (one copy of the model) and options; ``sp`` is the direction's
    own vocabulary (``languages.vocabulary_for``: a multilingual model's puts the target's tag
    first on every source)."""

    source: str
    target: str
    engine: Engine
    sp: object
    options: TranslateOptions
    glossary: Optional[Glossary] = None  # --glossary DIRECTION=FILE (xf serve applies it to each sentence)
    scorer: Scorer = field(default_factory=Scorer)  # the answers' confidence (--confidence DIRECTION=FILE, or the default)
    # formal, informal -> this direction with that formality tag on every source (a model trained
    # on xf preprocess --formality-tags, into the language of its tags); empty for other models
    variants: dict = field(default_factory=dict)

    @property
    def code(self) -> str:
        return f"{self.source}-{self.target}"

    @property
    def tagged(self) -> bool:
        """Whether each source starts with a target tag (a direction of a multilingual model)."""
        return isinstance(self.sp, TaggedVocabulary)

    @property
    def target_sp(self):
        """The vocabulary of target-side text (prefixes, constraints, glossary forms): never tagged
        (neither a target-language tag nor a formality tag)."""
        sp = self.sp
        while hasattr(sp, "tag_id"):  # TaggedVocabulary, FormalityVocabulary: each wraps the next
            sp = sp.sp
        return sp


@dataclass(eq=False)
class Job:
    """One request's lines. pieces: subword ids per line ([] for an empty line, no search). A job
    is itself: equal to no other."""

    direction: Direction
    pieces: list[list[int]]
    enqueued: float = field(default_factory=time.perf_counter)
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)
    taken: int = 0  # lines handed to the worker so far, in order
    found: list[list[str]] = field(default_factory=list)  # per line decoded so far: its hypotheses' texts
    means: list[float] = field(default_factory=list)  # per line decoded so far: its best's log-probability per subword
    align: bool = False  # also the best hypothesis's word alignment per line (format html), where the engine has them
    alignments: list = field(default_factory=list)  # per line: [(source word, target word)], or None
    dropped: bool = False  # its request is gone: the lines not taken are not decoded, the rest not kept
    queue_wait: float = 0.0  # seconds from submit to the start of its first batch's search
    decode_time: float = 0.0  # seconds its batches' searches took
    prefixes: Optional[list[list[int]]] = None  # per line: its target prefix (ids; None: no line has one)
    constraints: Optional[list] = None  # per line: its lexical constraints (encode_constraints; None: none)

    def line_tokens(self, i: int) -> int:
        """Source subwords of line i with eos, as a batch counts them (an empty line: none)."""
        return len(self.pieces[i]) + 1 if self.pieces[i] else 0

    @property
    def left(self) -> int:
        """Lines not yet handed to the worker."""
        return len(self.pieces) - self.taken


class QueueFull(Exception):
    """The queue holds max_queue_lines lines already; retry_after: seconds to wait, a guess."""

    def __init__(self, retry_after: int):
        super().__init__(f"the queue is full; retry after {retry_after} s")
        self.retry_after = retry_after


Segment = tuple[Job, int, int]  # lines [start, end) of one job in a batch


class BatchQueue:
    """Jobs in arrival order and the one worker thread that decodes them in batches.

    ``submit(job)`` returns at once (or raises QueueFull); the job's future gets, per line, the
    texts of its hypotheses, best first (an empty line: [""]). ``drop(job)`` forgets a job whose
    request is gone; ``drain()`` (shutdown begins) stops waiting for batches to fill; ``stop()``
    drops what is queued and ends the worker once its batch is decoded. on_batch(sentences,
    seconds) and on_depth(lines) report each batch and the queue's depth (for /metrics).
    """

    def __init__(self, max_batch_tokens: int, max_wait_ms: float, max_queue_lines: int,
                 on_batch: Optional[Callable[[int, float], None]] = None,
                 on_depth: Optional[Callable[[int], None]] = None):
        self.max_batch_tokens, self.max_wait = max_batch_tokens, max_wait_ms / 1000
        self.max_queue_lines = max_queue_lines
        self.on_batch, self.on_depth = on_batch, on_depth
        self.jobs: collections.deque[Job] = collections.deque()
        self.lines = 0  # lines of the queued jobs not yet taken
        self.rate = 0.0  # lines per second of recent batches (for Retry-After)
        self.stats = Stats()
        self.batches = self.sentences = self.lines_done = self.lines_dropped = 0  # for the summary at exit
        self.cond = threading.Condition()
        self.draining = self.stopping = False
        self.thread = threading.Thread(target=self._run, name="xf-serve-worker", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def drain(self) -> None:
        """Decode what is queued without waiting max_wait for batches to fill (shutdown has begun)."""
        with self.cond:
            self.draining = True
            self.cond.notify_all()

    def stop(self) -> None:
        """Drop what is queued and end the worker, waiting for the batch it decodes: a search is
        never cut short (a torch thread still running at interpreter exit aborts the process)."""
        with self.cond:
            self.stopping = True
            for job in list(self.jobs):
                self._drop(job)
            self.cond.notify_all()
        if self.thread.is_alive():
            self.thread.join()

    def submit(self, job: Job) -> None:
        with self.cond:
            if self.stopping:
                raise QueueFull(1)
            if self.lines + len(job.pieces) > self.max_queue_lines:
                raise QueueFull(max(1, round(self.lines / self.rate)) if self.rate else 1)
            self.jobs.append(job)
            self._count(len(job.pieces))
            self.cond.notify()

    def drop(self, job: Job) -> int:
        """Forget a job whose request is gone (answered otherwise, its client disconnected): its
        lines not yet taken leave the queue undecoded. Returns how many."""
        with self.cond:
            return self._drop(job)

    def _drop(self, job: Job) -> int:
        job.dropped = True
        job.future.cancel()  # no effect once its first batch has started
        if job not in self.jobs:
            return 0
        self.jobs.remove(job)
        left = job.left
        self._count(-left)
        self.lines_dropped += left
        return left

    def _count(self, lines: int) -> None:
        self.lines += lines
        if self.on_depth is not None:
            self.on_depth(self.lines)

    def _next_batch(self) -> Optional[list[Segment]]:
        """Lines of the oldest job and then of the next ones of its engine, in order, within
        max_batch_tokens (a line over it alone), once the batch is full, the oldest has waited
        max_wait or the queue drains; None once stopping."""
        with self.cond:
            while True:
                while not self.jobs and not self.stopping:
                    self.cond.wait()
                if self.stopping:
                    return None
                for job in [job for job in self.jobs if job.future.cancelled()]:
                    self._drop(job)  # its request gave up (504) before its first batch
                if not self.jobs:
                    continue
                first = self.jobs[0]
                batch, tokens, full = [], 0, False
                for job in self.jobs:
                    if job.direction.engine is not first.direction.engine:  # directions of one model: one batch
                        continue
                    end = job.taken
                    while end < len(job.pieces) and not (tokens and tokens + job.line_tokens(end) > self.max_batch_tokens):
                        tokens += job.line_tokens(end)
                        end += 1
                    if end > job.taken:
                        batch.append((job, job.taken, end))
                    if end < len(job.pieces):
                        full = True
                        break
                left = first.enqueued + self.max_wait - time.perf_counter()
                if full or left <= 0 or self.draining:
                    return self._take(batch)
                self.cond.wait(left)

    def _take(self, batch: list[Segment]) -> list[Segment]:
        """Hand a batch's lines to the worker (under the lock); a job wholly taken leaves the queue."""
        kept = []
        for job, start, end in batch:
            if start == 0 and not job.future.set_running_or_notify_cancel():
                self._drop(job)  # cancelled (504) since the batch was gathered
                continue
            job.taken = end
            self._count(-(end - start))
            if job.left == 0:
                self.jobs.remove(job)
            kept.append((job, start, end))
        return kept

    def _run(self) -> None:
        while (batch := self._next_batch()) is not None:
            if batch:
                self._decode(batch)

    def _decode(self, batch: list[Segment]) -> None:
        direction = batch[0][0].direction
        pieces = [ids for job, start, end in batch for ids in job.pieces[start:end]]
        started = time.perf_counter()
        for job, start, _ in batch:
            if start == 0:
                job.queue_wait = started - job.enqueued
        steer = {}
        for key in ("prefixes", "constraints"):  # per line, where a job of the batch has them
            if any(getattr(job, key) for job, _, _ in batch):
                steer[key] = [x for job, start, end in batch
                              for x in (getattr(job, key) or [[]] * len(job.pieces))[start:end]]
        try:
            found, _ = search_lines(direction.engine, pieces, direction.options, self.stats,
                                    max_tokens=self.max_batch_tokens, max_sentences=None,
                                    on_batch=lambda n: self._batch_done(n, started), **steer,
                                    # a constraint ends a word, as in xf translate (not Hund in Hunde)
                                    word_starts=word_boundaries(direction.target_sp) if "constraints" in steer else None)
        except Exception as e:  # noqa: BLE001 - the request gets the error, the worker goes on
            if out_of_memory(e):  # a 500 that says which limit to lower; the server stays up
                e = HttpError(500, f"out of memory decoding this request's batch ({memory_detail(e)}); lower "
                              "--max-batch-tokens or what one sentence may ask (--max-constraints, "
                              "--max-constraint-forms, --max-constraint-subwords)")
            for job, _, _ in batch:
                self.drop(job)  # its lines not yet taken are not decoded
                if not job.future.done():
                    job.future.set_exception(e)
            return
        elapsed = time.perf_counter() - started
        lines = len(pieces)
        self.lines_done += lines
        self.rate = lines / max(elapsed, 1e-6) if not self.rate else 0.8 * self.rate + 0.2 * lines / max(elapsed, 1e-6)
        at = 0
        for job, start, end in batch:
            job.decode_time += elapsed
            texts = [hypothesis_texts(direction.sp, hyps) if hyps is not None else [""] for hyps in found[at:at + end - start]]
            if job.align and not job.dropped:
                job.alignments.extend(word_alignments(job.direction, job.pieces[start:end],
                                                      found[at:at + end - start]))
            at += end - start
            if job.dropped:
                continue
            job.found.extend(texts)
            job.means.extend(mean_log_probability(hyps[0].positional_scores) if hyps else 0.0
                             for hyps in found[at - (end - start):at])
            if len(job.found) == len(job.pieces):
                job.future.set_result(job.found)

    def _batch_done(self, sentences: int, start: float) -> None:
        self.batches += 1
        self.sentences += sentences
        if self.on_batch is not None:
            self.on_batch(sentences, time.perf_counter() - start)


def word_alignments(direction: Direction, sources: list[list[int]], found: list) -> list:
    """(source word, target word) pairs of each line's best hypothesis (``xf translate
    --print-alignment --alignment-level word``, words by the pieces' word starts), None where the
    engine gives none (ctranslate2) or the line is empty. A tagged direction's tag is no word: a
    position counts from the sentence's first subword and nothing aligns to the tag (the engine's
    rule, ``Engine.alignments``, as xf translate's)."""
    engine, sp = direction.engine, direction.sp
    if not getattr(engine, "supports_alignments", False):
        return [None] * len(sources)
    kept = [i for i, hyps in enumerate(found) if hyps and sources[i]]
    out: list = [None] * len(sources)
    if not kept:
        return out
    best = [[found[i][0]] for i in kept]
    aligned = engine.alignments([sources[i] for i in kept], best, direction.options.alignment_layer)
    lead = 1 if direction.tagged else 0  # the tag is no word
    for i, hyps, rows in zip(kept, best, aligned):
        src = word_ids([sp.id_to_piece(t) for t in sources[i][lead:]])
        tgt = word_ids([sp.id_to_piece(t) for t in hyps[0].tokens[:-1]])
        out[i] = alignment_pairs(rows[0], src, tgt)
    return out
