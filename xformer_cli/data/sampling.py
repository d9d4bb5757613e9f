"""Temperature sampling across the directions of a multilingual corpus: how many pairs of each
direction one training epoch holds, and which.

Direction i, with n_i of the N training pairs, is drawn with probability

    p_i = q_i^(1/T) / sum_j q_j^(1/T),   q_i = n_i / N

(XLM's and fairseq's temperature-based sampling): T = 1 takes the data as it is, T -> infinity
draws every direction alike, so a small direction is seen more often than its share. An epoch
holds N pairs, round(N * p_i) of direction i: whole shuffled passes over its pairs, then a random
part of one more, drawn from (seed, epoch) so that a resumed run draws the same epoch. Numpy
only; ``batching.EpochBatches`` batches what is drawn.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import numpy as np


def direction_probabilities(sizes: Sequence[int], temperature: float) -> np.ndarray:
    """p_i proportional to (n_i / N)^(1/T); a direction without pairs gets 0."""
    q = np.asarray(sizes, np.float64) / max(sum(sizes), 1)
    # log space: (1e-9)^(1/1e9) and q^(1/0.01) stay finite; q = 0 stays 0 (exp(-inf))
    with np.errstate(divide="ignore"):
        logits = np.log(q) / temperature
    weights = np.exp(logits - logits.max())
    return weights / weights.sum()


def epoch_counts(sizes: Sequence[int], temperature: float) -> list[int]:
    """The pairs of each direction in one epoch of N = sum(sizes) pairs: round(N * p_i)."""
    return [int(round(sum(sizes) * p)) for p in direction_probabilities(sizes, temperature)]


def undrawn(sizes: Sequence[int], temperature: float) -> list[int]:
    """The directions that have pairs but none in an epoch (a temperature near 0 gives the
    largest direction every pair: ``--sampling-temperature 1e-300`` trains one direction alone)."""
    return [i for i, (n, c) in enumerate(zip(sizes, epoch_counts(sizes, temperature))) if n and not c]


def draw_epoch(sizes: Sequence[int], counts: Sequence[int], seed: int, epoch: int) -> np.ndarray:
    """The rows of one epoch (int64, ascending within each direction's block): counts[i] of
    direction i, whose rows follow those of the directions before it; each row of a direction
    at most once more than any other of it (whole passes, then a sample without replacement)."""
    rng = np.random.default_rng([seed, epoch, 1])  # 1: another stream than the epoch's batch order
    parts, start = [], 0
    for n, count in zip(sizes, counts):
        if n and count:
            passes, rest = divmod(int(count), int(n))
            rows = [np.arange(n, dtype=np.int64)] * passes + [np.sort(rng.choice(n, rest, replace=False))]
            parts.append(np.sort(np.concatenate(rows)) + start)
        start += n
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def epoch_sampler(sizes: Sequence[int], temperature: float, seed: int) -> Optional[Callable[[int], np.ndarray]]:
    """``epoch -> rows`` for a corpus of directions of ``sizes`` (in row order), or None when an
    epoch is the data as it is (T = 1, one direction, or directions of one size): then the
    batches are made once, as for a bilingual corpus."""
    counts = epoch_counts(sizes, temperature)
    if list(counts) == [int(n) for n in sizes]:
        return None
    return lambda epoch: draw_epoch(sizes, counts, seed, epoch)
