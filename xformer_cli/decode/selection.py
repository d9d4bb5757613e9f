"""Choosing a beam search step's extensions: the strategy of the one beam loop (``search._beam_search``).

As fairseq's ``Search.step`` is: ``PlainSelection`` takes the 2k best extensions of each
sentence's k hypotheses; ``constraints.BatchConstraints`` (dynamic beam allocation, fairseq's
LexicallyConstrainedBeamSearch) takes a wider pool in its own order, from the same top-k, so a
sentence without constraints in a constrained batch gets exactly its plain output. Both answer
the loop's calls: ``start``, ``choose``, ``follow``, ``met``, ``keep``.
"""

from __future__ import annotations

from typing import Optional

import torch


def top_candidates(x: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``x.topk(n, dim=1)`` (values, indices) of a contiguous x (R, W), faster for wide rows: the
    columns in G strided groups (column c in group c % (W / G)), and since each group's maximum
    is at least every element of it, the n largest lie in the n groups of largest maximum, so
    one top-k runs over the W / G maxima and one over those groups' n G elements. aten's CPU
    top-k costs about 3 ns an element, and it partially sorts (its fast path) only a row of at
    least 64 n elements, so G is the largest divisor of W with W / G >= 64 n (at most 64):
    faster than one top-k over the row at beam search's shapes (docs/benchmarks.md).
    The same values, sorted; the same indices where values are distinct (among equal values
    both pick any, aten's own order not being defined)."""
    rows, width = x.shape
    most = min(width // (64 * n), 64) if x.device.type == "cpu" else 1  # an accelerator's top-k: its own
    groups = next((g for g in range(most, 1, -1) if width % g == 0), 1)
    if groups == 1:
        return x.topk(n, dim=1)
    size = width // groups
    maxima = x.view(rows, groups, size).amax(dim=1)  # (R, size): column c's group {c, c + size, ...}
    columns = maxima.topk(n, dim=1).indices  # (R, n)
    idx = (columns[:, :, None] + torch.arange(0, width, size, device=x.device)).view(rows, n * groups)
    values, at = x.gather(1, idx).topk(n, dim=1)
    return values, idx.gather(1, at)


def best_extensions(scores: torch.Tensor, lprobs: torch.Tensor, k: int, candidates: Optional[torch.Tensor]):
    """The 2k best extensions of each sentence's k hypotheses, scores (sents k,) and lprobs
    (sents k, V): their cumulative scores, beam (0..k-1), token id and token log-probability,
    each (sents, 2k), best first. One top-k over beam * vocab for every sentence at once
    (``top_candidates``; measured: faster on a CPU than a top-k of each row first, although that
    skips adding the scores to every row). candidates: the ids of lprobs' columns (a shortlist),
    None: all."""
    vocab = lprobs.size(1)
    cand = (scores[:, None] + lprobs).view(-1, k * vocab)  # (sents, k V)
    top_scores, top_idx = top_candidates(cand, 2 * k)  # (sents, 2k)
    top_beam, top_token = top_idx // vocab, top_idx % vocab
    top_lprobs = lprobs.view(-1, k * vocab).gather(1, top_idx)
    if candidates is not None:  # columns to token ids
        top_token = candidates[top_token]
    return top_scores, top_beam, top_token, top_lprobs


class PlainSelection:
    """The 2k best extensions, no bookkeeping of its own."""

    def start(self, max_len: torch.Tensor, beams: int) -> None:
        self.beams = beams

    def choose(self, scores: torch.Tensor, lprobs: torch.Tensor, step: int, candidates: Optional[torch.Tensor]):
        """(scores, beam, token, token log-prob), each (sents, W >= 2k), best first (``best_extensions``)."""
        return best_extensions(scores, lprobs, self.beams, candidates)

    def follow(self, rows: torch.Tensor, tokens: torch.Tensor) -> None:
        """The new beam: row r continues row ``rows[r]`` with ``tokens[r]``."""

    def met(self, row: int) -> bool:
        """Whether the hypothesis row ``row`` held before the last ``follow`` may end (always)."""
        return True

    def keep(self, keep: torch.Tensor, keep_rows: torch.Tensor) -> None:
        """Only sentences ``keep`` and rows ``keep_rows`` stay."""
