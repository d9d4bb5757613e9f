"""Choosing on a validation set which checkpoints to average and which length penalty to translate
with: the pure rules (the candidates, the winner, the report) of ``xf average-checkpoints
--choose-on-valid``.

A fixed rule (average the last 5, lenpen 2.0) is right for the run it was tuned on; a faster
machine writes more checkpoints past the plateau, and the best average and length penalty move.
So the recipe chooses again at the end of every run, on val only:

1. every update checkpoint is scored alone by its validation loss (teacher-forced, one forward
   pass of val: a second or two on a CPU, where a greedy translation of val takes ten or more);
2. the candidate sets are the averages of the last N for each N of ``last`` that exists and of all
   of them, and the averages of the N of lowest loss for each N of ``best``; the fixed rule's N is
   one of them;
3. each set's average translates val once with beam search (lenpen 0, every finished hypothesis
   kept); its sacreBLEU at every lenpen of the grid comes from reranking those hypotheses, which
   gives what a search with that lenpen gives (``search.rescore``). The winner is the best pair
   (set, lenpen) of the whole grid.

The winner scores at least what the fixed rule scores on val: the fixed rule (its set, its lenpen)
is one of the pairs. Ties go to the pair listed first (the set of fewer checkpoints; the fixed
lenpen before the grid's), so the choice is deterministic. Cost: one beam search of val per set.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from ..base.distributed import Env
from ..base.errors import XfError
from ..base.fileio import read_lines
from ..data.batching import batch_by_size, collate_source
from ..decode.engines import XfEngine
from ..decode.search import beam_search, rescore
from ..decode.translate import Stats, encode_lines, hypothesis_texts, search_lines
from ..model.transformer import Transformer
from ..settings.options import TranslateOptions
from ..text.vocab import encode_target
from .validate import validation_loss

# The JSON report's schema version (the report is the recipe's record of the choice).
REPORT_VERSION = 1


@dataclass(frozen=True)
class Candidate:
    """A set of checkpoints to average: ``name`` ("last 5", "best 3") and its files, newest first."""

    name: str
    paths: tuple[Path, ...]


def candidate_sets(numbered: Sequence[Path], last: Sequence[int], best: Sequence[int],
                   losses: dict[Path, float], fixed: int = 0) -> list[Candidate]:
    """The candidate sets over ``numbered`` (oldest first): the last N for N in ``last`` (and
    ``fixed``) that exist, then all of them, then the N of lowest loss for N in ``best`` (ties:
    the newer). A set already listed under another name is not listed again."""
    newest_first = list(numbered)[::-1]
    count = len(newest_first)
    sizes = sorted({n for n in (*last, fixed) if 0 < n <= count} | {count})
    by_loss = sorted(newest_first, key=lambda p: losses[p])  # stable: the newer first among equals
    found = [Candidate(f"last {n}" if n < count else f"all {n}", tuple(newest_first[:n])) for n in sizes]
    for n in sorted({n for n in best if 0 < n <= count}):
        chosen = set(by_loss[:n])
        found.append(Candidate(f"best {n}", tuple(p for p in newest_first if p in chosen)))
    unique: list[Candidate] = []
    for c in found:
        if all(set(c.paths) != set(u.paths) for u in unique):
            unique.append(c)
    return unique


def fixed_candidate(candidates: Sequence[Candidate], fixed: int) -> Candidate | None:
    """The candidate of the fixed rule (the last ``fixed``), None when there is no fixed rule."""
    count = max(len(c.paths) for c in candidates)
    if not 0 < fixed <= count:
        return None  # no fixed rule, or one that this run cannot follow
    wanted = f"last {fixed}" if fixed < count else f"all {count}"
    return next(c for c in candidates if c.name == wanted)


def best_index(scores: Sequence[float]) -> int:
    """The index of the highest score; the first among equals."""
    if not scores:
        raise ValueError("no scores to choose from")
    return max(range(len(scores)), key=lambda i: (scores[i], -i))


def winner(candidates: Sequence[Candidate], scores: Sequence[Sequence[dict]]) -> tuple[Candidate, dict]:
    """The (set, score at one lenpen) of highest BLEU over every set and every lenpen; ties go to
    the set listed first, then to the lenpen listed first."""
    grid = [(c, s) for c, per_lenpen in zip(candidates, scores) for s in per_lenpen]
    return grid[best_index([s["bleu"] for _, s in grid])]


def lenpen_grid(first: float, grid: Sequence[float]) -> list[float]:
    """The length penalties of step 3: ``first`` (already scored in step 2) then the rest of the
    grid in its order, each once."""
    return list(dict.fromkeys([first, *grid]))


# -- scoring on the validation set ------------------------------------------------------------------
def read_valid(source: str, reference: str) -> tuple[list[str], list[str]]:
    """The validation source and reference lines; a one-line error unless they align."""
    src, ref = read_lines(source), read_lines(reference)
    if len(src) != len(ref):
        raise XfError(f"--valid-reference {reference} has {len(ref)} lines but --valid-source {source} has "
                      f"{len(src)}: a validation set's two sides must align line by line")
    if not src:
        raise XfError(f"--valid-source {source} is empty")
    return src, ref


def valid_pairs(sp, source: Sequence[str], reference: Sequence[str], max_source: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """The (source ids, target ids) of each validation pair whose two sides both hold a subword,
    each side cut to ``max_source`` (a model's longest), for the teacher-forced loss."""
    src_ids = sp.encode(list(source), out_type=int)
    tgt_ids = encode_target(sp, list(reference), out_type=int)
    return [(np.array(s[:max_source], dtype=np.int64), np.array(t[:max_source], dtype=np.int64))
            for s, t in zip(src_ids, tgt_ids) if s and t]


def valid_loss(model: Transformer, pairs: list[tuple[np.ndarray, np.ndarray]], max_tokens: int = 4096) -> float:
    """Negative log-likelihood per target token (nats, no label smoothing) of ``pairs``."""
    env = Env(rank=0, world_size=1, device=next(model.parameters()).device)
    batches = batch_by_size([len(s) for s, _ in pairs], [len(t) for _, t in pairs], max_tokens=max_tokens)
    return validation_loss(model, pairs, batches, env, contextlib.nullcontext(), 0.0)["nll"]


class _AllFinished(XfEngine):
    """xf's beam search keeping every finished hypothesis (``beam_search(all_finished=True)``)."""

    def search(self, sentences, options, generator=None):
        return beam_search(self.models, collate_source(sentences).to(self.device), options, all_finished=True)


def valid_bleu(models: Sequence[Transformer], device: torch.device, sp, source: Sequence[str],
               reference: Sequence[str], options: TranslateOptions, lenpens: Sequence[float]) -> list[dict[str, float]]:
    """For each lenpen of ``lenpens``: sacreBLEU of the translations of ``source`` against
    ``reference`` (as ``xf score`` scores what ``xf translate`` writes with that lenpen), its
    brevity penalty and the hypothesis / reference length ratio. One beam search (lenpen 0, every
    finished hypothesis kept), reranked for each lenpen (``search.rescore``)."""
    import sacrebleu

    engine = _AllFinished(models, device)
    stats = Stats()
    pieces = encode_lines(sp, list(source), engine.max_source, stats)
    found, _ = search_lines(engine, pieces, dataclasses.replace(options, lenpen=0.0, nbest=1), stats,
                            max_tokens=None, max_sentences=options.batch_size)
    scores = []
    for alpha in lenpens:
        texts = [hypothesis_texts(sp, rescore(hyps, alpha, options.lenpen_style)[:1])[0].rstrip() if hyps else ""
                 for hyps in found]
        bleu = sacrebleu.corpus_bleu(texts, [list(reference)])
        scores.append({"lenpen": alpha, "bleu": round(bleu.score, 2), "bp": round(bleu.bp, 3),
                       "ratio": round(bleu.sys_len / max(bleu.ref_len, 1), 3)})
    return scores
