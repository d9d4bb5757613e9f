"""Given sentence pairs scored by forced decoding (teacher forcing): the log-probability that a
model, or an ensemble, gives a target for its source, and the dual conditional cross-entropy of a
pair under a forward and a reverse model (Junczys-Dowmunt, 2018), for filtering parallel data.

Pure functions of models and token ids; no text, no files (``xf score-pairs`` reads those).
A pair's score is the search's own: the sum over the target's subwords and its eos of
log p(y_t | y_<t, x), each from ``log_softmax`` of the decoder's float32 logits and, for an
ensemble, averaged in probability space by ``search.ensemble_log_probs`` (the beam search's
hypothesis score with lenpen 0 is this sum, to float rounding: tests/test_score_pairs.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch
import torch.nn.functional as F

from ..data.batching import batch_by_size, collate
from ..model.transformer import Transformer
from ..text.vocab import PAD_ID
from .search import ensemble_log_probs


@dataclass(frozen=True)
class PairScore:
    score: float  # sum of log p(y_t | y_<t, x) over the target's subwords and its eos
    tokens: int  # the target's subwords + 1 (its eos)

    @property
    def mean(self) -> float:
        """Per target subword, eos included."""
        return self.score / self.tokens


def dual_conditional_cross_entropy(h_forward: float, h_reverse: float) -> float:
    """|H_fwd - H_rev| + (H_fwd + H_rev) / 2, lower is better (Junczys-Dowmunt, 2018, Sec. 3.1):
    the two models must agree (first term) and both find the pair likely (second term). H is the
    per-token cross-entropy, -mean log-probability in nats; the paper normalizes per word, xf per
    subword with eos."""
    return abs(h_forward - h_reverse) + (h_forward + h_reverse) / 2


def max_length(models: Sequence[Transformer]) -> int:
    """The longest side (subwords, without eos or bos) the models take: the source with its eos
    and the decoder's input with its bos must fit in every model's max_positions."""
    return min(model.cfg.max_positions for model in models) - 1


def forced_log_probs(models: Sequence[Transformer], src: torch.Tensor, prev_output: torch.Tensor,
                     target: torch.Tensor) -> torch.Tensor:
    """log p(target_t | prev_output_<=t, src) (B, T), 0 at padding, for a batch of ``collate``:
    src (B, S), prev_output (B, T) = [bos] + y and target (B, T) = y + [eos], right-padded.
    An ensemble averages each model's probability of the target token, which is the search's
    average of whole distributions read at that token (the average is elementwise)."""
    per_model = []
    for model in models:
        memory, src_pad = model.encode(src)
        logits = model.decode(prev_output, memory, src_pad)  # (B, T, V)
        per_model.append(F.log_softmax(logits.float(), dim=-1).gather(-1, target[..., None]).squeeze(-1))
    return ensemble_log_probs(per_model).masked_fill(target.eq(PAD_ID), 0.0)


@torch.inference_mode()
def score_pairs(models: Sequence[Transformer], sources: Sequence[Sequence[int]], targets: Sequence[Sequence[int]],
                max_tokens: Optional[int] = None, max_sentences: Optional[int] = 64) -> list[PairScore]:
    """The score of each pair (subword ids without eos), in input order, scored in batches of
    similar lengths (``batch_by_size`` over both sides: ``max_tokens`` padded subwords a side, or
    ``max_sentences`` pairs). Every side must fit the models (``max_length``): nothing is cut."""
    if len(sources) != len(targets):
        raise ValueError(f"{len(sources)} sources but {len(targets)} targets")
    limit = max_length(models)
    longest = max((len(s) for s in (*sources, *targets)), default=0)
    if longest > limit:
        raise ValueError(f"a side of {longest} subwords is longer than the models' {limit}")
    device = next(models[0].parameters()).device
    out: list[Optional[PairScore]] = [None] * len(sources)
    for batch in batch_by_size([len(s) for s in sources], [len(t) for t in targets], max_tokens=max_tokens,
                               max_sentences=max_sentences, longest_first=True):
        idx = batch.tolist()
        tensors = collate([(sources[i], targets[i]) for i in idx])
        src, prev, target = (tensors[k].to(device) for k in ("src", "prev_output", "target"))
        sums = forced_log_probs(models, src, prev, target).sum(dim=1).tolist()
        for i, total in zip(idx, sums):
            out[i] = PairScore(total, len(targets[i]) + 1)
    return out  # type: ignore[return-value]
