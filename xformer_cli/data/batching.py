"""Token batching: batches of similar lengths up to a token budget, their order in each epoch,
each rank's share of an update, collation into padded tensors, and the prefetching that collates
the next update while the device trains on this one.

``batch_by_size`` is a pure function over sentence lengths (fairseq's idea); everything a
training run needs of its batches, epoch by epoch and update by update, is ``EpochBatches``.
"""

from __future__ import annotations

import threading
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

import numpy as np

from ..text.vocab import BOS_ID, EOS_ID, PAD_ID
from .dataset import read_rows

if TYPE_CHECKING:
    import torch

    from .dataset import ParallelDataset


def batch_by_size(
    src_sizes: Sequence[int],
    tgt_sizes: Sequence[int] | None = None,
    max_tokens: int | None = None,
    max_sentences: int | None = None,
    seed: int | None = None,
    longest_first: bool = False,
) -> list[np.ndarray]:
    """Group sentence indices into batches of similar length under a token or sentence budget.

    Indices are sorted by the longer side's length, then source length, then target length
    (stable; with ``seed``, pairs of equal lengths are shuffled first, so ties come in a random but
    reproducible order); shortest first, or longest first. Batches are cut greedily along that order so that, on each side, ``batch
    size * longest padded length <= max_tokens`` (None: no token budget), where the padded length
    counts the eos (source, target) or bos (decoder input): ``size + 1``, and so that a batch
    holds at most ``max_sentences``. A pair longer than ``max_tokens`` on its own gets a batch of
    its own (and a warning). Returns a list of index arrays (int32: views of one array of
    4 bytes a pair); the caller shuffles the order of batches.

    Source-only mode (``tgt_sizes`` None: translation, validation BLEU) batches by source length
    alone, and an oversize sentence is batched alone without a warning (every line is translated).

    Memory: the returned order (4 bytes a pair) and the list's views (under 1 byte a pair at
    4096 tokens a batch), besides them a chunk of pairs and a table of lengths (``length_order``);
    sizes in a TokenArray's memory map are read from its file, so they do not stay resident.
    """
    if tgt_sizes is not None and len(tgt_sizes) != len(src_sizes):
        raise ValueError(f"{len(src_sizes)} source sizes but {len(tgt_sizes)} target sizes")
    if max_tokens is not None and max_tokens < 1:
        raise ValueError("max_tokens must be positive")
    if max_tokens is None and not max_sentences:
        raise ValueError("batch_by_size needs max_tokens or max_sentences")
    n = len(src_sizes)
    perm = None if seed is None else np.random.default_rng(seed).permutation(n)
    order, run_starts, run_lengths = length_order(src_sizes, tgt_sizes, descending=longest_first, perm=perm)
    del perm

    def longest(start: int, stop: int) -> np.ndarray:
        """The padded length of the longer side of pairs order[start:stop] (int64)."""
        first = int(np.searchsorted(run_starts, start, side="right")) - 1
        last = int(np.searchsorted(run_starts, stop, side="left"))
        return np.repeat(run_lengths[first:last], np.diff(np.clip(run_starts[first : last + 1], start, stop)))

    cap = min(max_sentences or n, max_tokens or n, n) if n else 0
    batches, oversize, start = [], 0, 0
    while start < n:
        if max_tokens is None:
            k = min(cap, n - start)
        else:
            run = int(np.searchsorted(run_starts, start, side="right")) - 1
            length = int(run_lengths[run])
            per = min(cap, max(1, max_tokens // length))  # no batch starting here holds more pairs
            if not longest_first and length <= max_tokens:
                # Shortest first, the length never decreases: inside a run of pairs of this length
                # every batch the greedy cut makes is ``per`` pairs. Cut them all at once (one step
                # per distinct length, not per batch: 36M pairs make some 10^5 batches).
                full = (int(run_starts[run + 1]) - start) // per
                if full > 1:
                    batches.extend(order[i : i + per] for i in range(start, start + full * per, per))
                    start += full * per
                    continue
            # Sizes of the candidate batches order[start:start+k] for k = 1..per; the cost k * max
            # length only grows with k, so the batch ends before the first k over budget.
            window = longest(start, min(start + per, n))
            cost = np.maximum.accumulate(window) * np.arange(1, len(window) + 1)
            k = int(np.searchsorted(cost, max_tokens, side="right"))
            if k == 0:
                k, oversize = 1, oversize + 1
        batches.append(order[start : start + k])
        start += k
    if oversize and tgt_sizes is not None:
        warnings.warn(f"{oversize} pair(s) longer than max_tokens={max_tokens} got a batch of their own", stacklevel=2)
    return batches


def length_order(
    src_sizes: Sequence[int],
    tgt_sizes: Sequence[int] | None = None,
    descending: bool = False,
    perm: np.ndarray | None = None,
    chunk: int = 1 << 20,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pair indices sorted by padded length (``size + 1``) of the longer side, then of the
    source, then of the target (source only: ``tgt_sizes`` None), stable: ties keep index order,
    or with ``perm``, a permutation, the order they have in it.

    Returns ``(order, run_starts, run_lengths)``: the indices (int32 below 2^31 pairs: 4 bytes a
    pair), and the runs of equal longer-side length along ``order``: run r covers
    ``order[run_starts[r]:run_starts[r + 1]]`` (R + 1 starts, the last n) and has padded length
    ``run_lengths[r]`` (R, int64).

    A counting sort, a chunk of pairs at a time. The keys are a function of the two padded
    lengths, so a table of (source, target) lengths holds each key's rank: the first pass counts
    the pairs of each length pair, the second writes each chunk's indices to their places. Besides
    ``order`` it holds one chunk and the table: (longest source + 1) x (longest target + 1)
    entries, 63,504 after ``xf preprocess``'s default --max-len 250. (Sorting all pairs at once --
    one radix pass per key, each gathering and argsorting the whole corpus -- peaked at some 27
    bytes a pair, 1 GB for 36M pairs.) Tables over 2^22 entries (sentences of thousands of
    subwords) sort all pairs at once instead.
    """
    src_sizes, tgt_sizes = (s if s is None or isinstance(s, np.ndarray) else np.asarray(s, np.int64)
                            for s in (src_sizes, tgt_sizes))
    n = len(src_sizes)
    spans = [slice(start, min(start + chunk, n)) for start in range(0, n, chunk)]
    width = [max((int(read_rows(s, span).max()) + 2 for span in spans), default=1) if s is not None else 1
             for s in (src_sizes, tgt_sizes)]  # padded lengths 0 .. longest + 1 on each side
    if width[0] * width[1] > 1 << 22:
        return _length_order_at_once(src_sizes, tgt_sizes, descending, perm)

    def chunks():  # (the pairs' indices, their length pair src * width[1] + tgt), in the order ties keep
        for span in spans:
            rows = span if perm is None else np.asarray(perm[span])
            code = read_rows(src_sizes, rows).astype(np.int64) + 1
            if tgt_sizes is not None:
                code *= width[1]
                code += read_rows(tgt_sizes, rows)
                code += 1
            yield rows, code

    counts = np.zeros(width[0] * width[1], np.int64)
    for _, code in chunks():
        counts += np.bincount(code, minlength=len(counts))
    present = np.flatnonzero(counts)  # the length pairs that occur, sorted by key:
    src, tgt = (present, present) if tgt_sizes is None else (present // width[1], present % width[1])
    longer = np.maximum(src, tgt)
    present = present[np.lexsort((tgt, src, longer))[:: -1 if descending else 1]]
    rank = np.zeros(len(counts), np.uint16 if len(present) <= 1 << 16 else np.int64)  # uint16: a radix sort
    rank[present] = np.arange(len(present))
    counts = counts[present]
    free = np.cumsum(counts) - counts  # where the next pair of each key goes
    order = np.empty(n, np.int32 if n < 2**31 else np.int64)
    for rows, code in chunks():
        ranks = rank[code]
        by_rank = np.argsort(ranks, kind="stable")
        here = np.bincount(ranks, minlength=len(present))
        # a pair's place: its key's next free slot + the pairs of its key before it in this chunk
        place = (free - (np.cumsum(here) - here))[ranks[by_rank]]
        place += np.arange(len(place))
        order[place] = by_rank + rows.start if perm is None else rows[by_rank]
        free += here
    longer = (present if tgt_sizes is None else np.maximum(present // width[1], present % width[1])).astype(np.int64)
    return (order, *_runs(longer, counts))


def _runs(longer: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(run_starts, run_lengths)`` of groups of ``counts[i]`` pairs of longer-side length
    ``longer[i]``, in order: consecutive groups of one length make one run."""
    first = np.flatnonzero(np.concatenate([[True], longer[1:] != longer[:-1]])) if len(longer) else np.zeros(0, np.int64)
    starts = np.concatenate([[0], np.cumsum(counts)])[np.concatenate([first, [len(longer)]])]
    return starts.astype(np.int64), longer[first]


def _length_order_at_once(src_sizes, tgt_sizes, descending, perm):
    """``length_order`` for lengths too long for its table: np.lexsort of the whole corpus at once."""
    src = np.asarray(src_sizes, np.int64) + 1
    tgt = src if tgt_sizes is None else np.asarray(tgt_sizes, np.int64) + 1
    longer = np.maximum(src, tgt)
    order = np.arange(len(src)) if perm is None else np.asarray(perm)
    sign = -1 if descending else 1
    order = order[np.lexsort([sign * k[order] for k in (tgt, src, longer)])]
    return (order.astype(np.int32 if len(src) < 2**31 else np.int64), *_runs(longer[order], np.ones(len(src), np.int64)))


def epoch_order(num_batches: int, seed: int, epoch: int) -> np.ndarray:
    """The order of the length-grouped batches in ``epoch``: shuffled, reproducibly from the seed."""
    return np.random.default_rng([seed, epoch]).permutation(num_batches)


def rank_share(chunk: np.ndarray, order: np.ndarray, rank: int, world_size: int) -> np.ndarray:
    """This rank's micro-batches of one update: every world_size-th batch of ``chunk``.

    The last update of an epoch may have fewer batches than ranks; it borrows batches from the
    start of the epoch so that every rank takes part in the gradient all-reduce.
    """
    if len(chunk) < world_size:
        chunk = np.concatenate([chunk, order[: world_size - len(chunk)]])
    return chunk[rank::world_size]


def update_batches(order: np.ndarray, offset: int, update_freq: int, rank: int, world_size: int) -> np.ndarray:
    """The batches (indices into the batch list) of this rank's micro-batches for the update that
    starts at ``offset`` of the epoch's ``order``: update_freq of them (the last update of an
    epoch may have fewer)."""
    chunk = order[offset : offset + update_freq * world_size]
    return rank_share(chunk, order, rank, world_size)


def collate(samples: Sequence[tuple[np.ndarray, np.ndarray]]) -> dict[str, Any]:
    """Pad a list of ``(src_ids, tgt_ids)`` into a training batch.

    Returns seven keys: LongTensors ``src`` (B, S) = ids + [eos], ``prev_output`` (B, T) = [bos] +
    tgt ids and ``target`` (B, T) = tgt ids + [eos], right-padded with pad; ``target_rows``, the
    flat indices of the non-pad positions of ``target`` (found here, on the host, so that the loss
    never asks the device for them); and the ints ``ntokens`` (non-pad target tokens),
    ``nsentences`` (B) and ``src_tokens`` (non-pad source tokens).
    """
    import torch  # here, so that xf preprocess never pays for importing torch

    b = len(samples)
    src_lens = [len(s) + 1 for s, _ in samples]
    tgt_lens = [len(t) + 1 for _, t in samples]
    prev = np.full((b, max(tgt_lens, default=0)), PAD_ID, dtype=np.int64)
    target = np.full_like(prev, PAD_ID)
    for i, (_, t) in enumerate(samples):
        prev[i, 0] = BOS_ID
        prev[i, 1 : len(t) + 1] = t
        target[i, : len(t)] = t
        target[i, len(t)] = EOS_ID
    return {
        "src": collate_source([s for s, _ in samples]),
        "prev_output": torch.from_numpy(prev),
        "target": torch.from_numpy(target),
        "target_rows": torch.from_numpy(np.flatnonzero(target.reshape(-1) != PAD_ID)),
        "ntokens": sum(tgt_lens),
        "nsentences": b,
        "src_tokens": sum(src_lens),
    }


def collate_source(sentences: Sequence[Sequence[int]]) -> torch.Tensor:
    """The encoder's input: a LongTensor (B, S) of ids + [eos], right-padded with pad."""
    import torch  # here, so that xf preprocess never pays for importing torch

    src = np.full((len(sentences), max((len(s) + 1 for s in sentences), default=0)), PAD_ID, dtype=np.int64)
    for i, s in enumerate(sentences):
        src[i, : len(s)] = s
        src[i, len(s)] = EOS_ID
    return torch.from_numpy(src)


class EpochBatches:
    """The training batches as the updates of every epoch: epoch ``e`` takes its batches in
    ``epoch_order(len, seed, e)``, ``update_freq x world_size`` per update, and this rank collates
    its share (on CUDA in pinned memory, so that the copies to the device are asynchronous).

    The batches (``batch_by_size`` under ``max_tokens``) are made once; with ``draw`` (epoch ->
    the rows it holds, ``sampling.epoch_sampler``: temperature sampling across the directions of a
    multilingual corpus) every epoch draws its own rows and batches them, so that its number of
    batches varies a little from epoch to epoch (``num_batches(epoch)``). Thread-safe: the
    prefetching thread may make the next epoch's batches while the loop asks about this one."""

    def __init__(self, dataset: ParallelDataset, max_tokens: int, *, seed: int, update_freq: int, rank: int = 0,
                 world_size: int = 1, pin_memory: bool = False,
                 draw: Optional[Callable[[int], np.ndarray]] = None):
        self.dataset, self.max_tokens, self.seed, self.draw = dataset, max_tokens, seed, draw
        self.update_freq, self.rank, self.world_size, self.pin_memory = update_freq, rank, world_size, pin_memory
        self.fixed = batch_by_size(dataset.src_sizes, dataset.tgt_sizes, max_tokens) if draw is None else None
        self._epochs: dict[int, tuple[list[np.ndarray], np.ndarray]] = {}  # epoch -> (batches, order)
        self._lock = threading.Lock()

    def epoch(self, epoch: int) -> tuple[list[np.ndarray], np.ndarray]:
        """(the batches of ``epoch``: arrays of rows of the dataset, the order it takes them in)."""
        with self._lock:
            made = self._epochs.get(epoch)
        if made is not None:
            return made
        # made outside the lock (the loop's questions about this epoch do not wait for the next's
        # batching); two threads making one epoch make the same batches
        if self.draw is None:
            batches = self.fixed
        else:
            rows = self.draw(epoch)
            batches = [rows[b] for b in batch_by_size(read_rows(self.dataset.src_sizes, rows),
                                                      read_rows(self.dataset.tgt_sizes, rows), self.max_tokens)]
        made = (batches, epoch_order(len(batches), self.seed, epoch))
        with self._lock:  # two epochs kept: the prefetching thread makes the next while the loop ends this one
            self._epochs = {e: v for e, v in self._epochs.items() if e == epoch - 1 or e == epoch + 1}
            self._epochs[epoch] = made
        return made

    def num_batches(self, epoch: int) -> int:
        return len(self.epoch(epoch)[0])

    @property
    def per_update(self) -> int:
        """Batches consumed by one update, all ranks together."""
        return self.update_freq * self.world_size

    def updates_per_epoch(self, epoch: int = 1) -> int:
        return -(-self.num_batches(epoch) // self.per_update)

    def order(self, epoch: int) -> np.ndarray:
        return self.epoch(epoch)[1]

    def micro_batches(self, epoch: int, offset: int) -> list[dict]:
        """This rank's collated micro-batches of the update at batch ``offset`` of ``epoch``."""
        batches, order = self.epoch(epoch)
        share = update_batches(order, offset, self.update_freq, self.rank, self.world_size)
        micro = [collate([self.dataset[i] for i in batches[b]]) for b in share]
        if self.pin_memory:
            micro = [{k: v.pin_memory() if hasattr(v, "pin_memory") else v for k, v in b.items()} for b in micro]
        return micro

    def next_update(self, epoch: int, offset: int) -> tuple[int, int]:
        """(epoch, offset) of the update after the one at ``offset`` of ``epoch``."""
        offset += self.per_update
        return (epoch + 1, 0) if offset >= self.num_batches(epoch) else (epoch, offset)


class Prefetch:
    """Collates the next update's micro-batches in a background thread while the device trains
    on this one (numpy's gathers and copies release the GIL for most of that work): the way on
    CUDA. On a CPU the cores that would collate are the ones computing, so it collates when asked.
    The batches are the same whichever thread made them, so resuming stays exact."""

    def __init__(self, source: EpochBatches, background: bool):
        self.source = source
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="xf-collate") if background else None
        self.ahead: Optional[tuple[tuple[int, int], Any]] = None  # ((epoch, offset), future of its batches)

    def take(self, epoch: int, offset: int) -> list[dict]:
        """The micro-batches of the update at ``offset`` of ``epoch``; starts collating the next."""
        if self.ahead is not None and self.ahead[0] == (epoch, offset):
            micro = self.ahead[1].result()
        else:
            micro = self.source.micro_batches(epoch, offset)
        if self.pool is not None:
            nxt = self.source.next_update(epoch, offset)
            self.ahead = (nxt, self.pool.submit(self.source.micro_batches, *nxt))
        return micro

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
