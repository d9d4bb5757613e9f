"""Search: beam search, greedy decoding and sampling over one model or an ensemble.

Pure functions of models and token ids; no text, no files. Every search takes a right-padded
source batch ``src`` (B, S) of ids + [eos] and returns, per sentence, a list of ``Hypothesis``
sorted best first.

How the batch is decoded (all sentences of a batch and all their beams at once):
- the encoder runs once per batch, and cross-attention keys/values are computed once per
  sentence at the first step and shared by its beams (never copied);
- every step decodes only the newest token of each row against the key/value cache, which is
  preallocated and gathered in place when beams change (``model.DecoderCache``);
- candidates are chosen with one top-k over beam * vocabulary for all sentences together;
- a sentence that is done leaves the batch (its rows are dropped from every tensor and cache).

Every search takes its settings as one frozen ``DecodingOptions`` (``settings/options.py``): the same
fields are ``xf translate``'s flags and YAML keys.

Scores: ``positional_scores`` are the log-probabilities of each output token (eos included);
``score`` is their sum divided by the length penalty of the output length |Y| (eos included).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch
import torch.nn.functional as F

from ..base.errors import XfError
from ..model.transformer import Transformer
from ..settings.options import DecodingOptions
from ..text.vocab import PAD_ID, BOS_ID, EOS_ID
from .constraints import BatchConstraints
from .decoder_step import LOG_ZERO, EagerStep, forbid_specials
from .selection import PlainSelection
from .shortlist import RestrictedProjection

DecoderStep = Callable[..., torch.Tensor]  # decoder_step.EagerStep or AotStep


@dataclass
class Hypothesis:
    tokens: list[int]  # output ids, ending with eos
    score: float  # sum(positional_scores) / length_penalty(|Y|), |Y| = len(tokens) (less 1 if cut)
    positional_scores: list[float]  # log p(token | prefix, source) of each token, eos included
    cut: bool = False  # ended at the length bound as it was (--beam-rule marian): its eos scores 0, |Y| omits it


# -- the math ------------------------------------------------------------------------------------
def gnmt_length_penalty(length, alpha: float):
    """lp(Y) = ((5 + |Y|) / 6)^alpha (Wu et al., 2016, GNMT), the penalty the paper used (Sec. 6.1).

    Works on floats and tensors. Scores are divided by it, so alpha > 0 favours longer outputs.
    """
    return ((5.0 + length) / 6.0) ** alpha


def fairseq_length_penalty(length, alpha: float):
    """lp(Y) = |Y|^alpha, fairseq's --lenpen (not the paper's)."""
    return length**alpha


def length_penalty(length, alpha: float, style: str = "gnmt"):
    if style == "gnmt":
        return gnmt_length_penalty(length, alpha)
    if style == "length":
        return fairseq_length_penalty(length, alpha)
    raise ValueError(f"unknown length penalty style {style!r} (gnmt or length)")


def max_output_lengths(src_lengths: torch.Tensor, a: float, b: float, max_positions: int) -> torch.Tensor:
    """Most output tokens before eos for each sentence: floor(a * |X| + b), |X| in source subwords.

    The paper allows input length + 50 (a=1, b=50). |X| excludes the source's eos (fairseq counts
    it, so its a*|X|+b is one larger for a=1). Capped so that bos + output fits in max_positions.
    """
    limit = torch.floor(a * src_lengths.double() + b).long()
    return limit.clamp(min=0, max=max_positions - 1)


def ensemble_log_probs(log_probs: Sequence[torch.Tensor]) -> torch.Tensor:
    """log((1/M) sum_m p_m): the models' next-token distributions averaged in probability space."""
    if len(log_probs) == 1:
        return log_probs[0]
    return torch.logsumexp(torch.stack(list(log_probs)), dim=0) - math.log(len(log_probs))


def top_k_top_p_filter(logits: torch.Tensor, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """logits (N, V) with everything outside the top k tokens and outside the smallest set of
    most likely tokens whose probability reaches top_p (nucleus, Holtzman et al.) set to -inf.
    top_k 0 and top_p 1.0 disable the filters; the most likely token always survives."""
    if top_k > 0 and top_k < logits.size(-1):
        kth = logits.topk(top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, LOG_ZERO)
    if top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        # Drop a token when the tokens ranked above it already reach top_p.
        drop_sorted = probs.cumsum(dim=-1) - probs >= top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, LOG_ZERO)
    return logits


# -- models and their decoder state --------------------------------------------------------------
class DecoderState:
    """Encoder outputs and key/value caches of one or more models for the rows being decoded.

    Rows start as the sentences of ``src``; ``select`` copies, reorders or drops rows.
    use_cache False decodes the whole prefix at every step instead (the slow reference).
    vocab (a sorted LongTensor of ids holding 0-3, ``decode/shortlist.py``): the log-probabilities are
    over those ids only, column c for id vocab[c]; None: the whole vocabulary.
    """

    def __init__(self, models: Sequence[Transformer], src: torch.Tensor, use_cache: bool = True, capacity: int = 0,
                 vocab: Optional[torch.Tensor] = None, decoder_step: Optional[DecoderStep] = None):
        for model in models:
            if model.training:
                raise ValueError("search needs models in eval mode (call model.eval())")
        self.models = list(models)
        self.encoded = [model.encode(src) for model in self.models]  # (memory (N, S, D), src_pad (N, S))
        # capacity: the positions each self-attention cache preallocates (bos + the longest output)
        self.caches = [model.new_cache(capacity) if use_cache else None for model in self.models]
        self.projections = None if vocab is None else [RestrictedProjection(model, vocab) for model in self.models]
        self.step = decoder_step or EagerStep()  # the incremental step (decode/decoder_step.py), eager or compiled

    def log_probs(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens (N, t): every row's prefix, bos first -> log p(next token) (N, V), float32
        (N, |vocab|) with a vocab: normalized over the candidates only."""
        out = []
        for i, (model, (memory, src_pad), cache) in enumerate(zip(self.models, self.encoded, self.caches)):
            step_input = tokens[:, -1:] if cache is not None else tokens
            if self.projections is None:
                logits = model.decode(step_input, memory, src_pad, cache)[:, -1]
            else:
                logits = self.projections[i](model.decode(step_input, memory, src_pad, cache, features_only=True)[:, -1])
            out.append(F.log_softmax(logits.float(), dim=-1))
        return ensemble_log_probs(out)

    def next_log_probs(self, tokens: torch.Tensor, at_max: Optional[torch.Tensor]) -> torch.Tensor:
        """``log_probs`` of the search: pad and bos forbidden, rows where ``at_max`` (bool (N,),
        None: no row) may only emit eos. Each model's step forbids them in its own
        log-probabilities: the ensemble's average of those is the same as forbidding them in the
        average."""
        if self.caches[0] is None:  # the slow reference: the whole prefix at every step
            return forbid_specials(self.log_probs(tokens), at_max)
        return ensemble_log_probs([
            self.step(model, tokens[:, -1:], memory, src_pad, cache, at_max,
                      self.projections[i] if self.projections is not None else None)
            for i, (model, (memory, src_pad), cache) in enumerate(zip(self.models, self.encoded, self.caches))])

    def select(self, rows: torch.Tensor) -> None:
        """Keep rows ``rows`` (LongTensor, may repeat) of everything: drop or copy whole sentences."""
        self.encoded = [(memory.index_select(0, rows), pad.index_select(0, rows)) for memory, pad in self.encoded]
        for cache in self.caches:
            if cache is not None:
                cache.select_rows(rows)

    def expand_beams(self, beams: int) -> None:
        """Give every sentence ``beams`` rows (sentence i: rows i * beams ... i * beams + beams - 1).
        Only the self-attention caches are copied: the encoder output and cross-attention keys and
        values stay one per sentence, and the decoder attends to them with all beams at once."""
        rows = torch.arange(self.encoded[0][0].size(0), device=self.encoded[0][0].device).repeat_interleave(beams)
        self.reorder_beams(rows)

    def select_sentences(self, keep: torch.Tensor, keep_rows: torch.Tensor) -> None:
        """Keep sentences ``keep`` and their beams' rows ``keep_rows`` (after expand_beams)."""
        self.encoded = [(memory.index_select(0, keep), pad.index_select(0, keep)) for memory, pad in self.encoded]
        for cache in self.caches:
            if cache is not None:
                cache.keep_sentences(keep, keep_rows)

    def reorder_beams(self, rows: torch.Tensor) -> None:
        """Follow beams within their sentences: only the self-attention caches change."""
        for cache in self.caches:
            if cache is not None:
                cache.follow_beams(rows)


def _source_lengths(src: torch.Tensor) -> torch.Tensor:
    return src.ne(PAD_ID).sum(dim=1) - 1  # without the source's eos


def _max_output_lengths(models: Sequence[Transformer], src: torch.Tensor, options: DecodingOptions) -> torch.Tensor:
    max_positions = min(model.cfg.max_positions for model in models)
    return max_output_lengths(_source_lengths(src), options.max_len_a, options.max_len_b, max_positions)


def _open_search(models: Sequence[Transformer], src: torch.Tensor, options: DecodingOptions, use_cache: bool,
                 candidates: Optional[torch.Tensor], decoder_step: Optional[DecoderStep],
                 prefix: Optional[torch.Tensor] = None) -> tuple[DecoderState, torch.Tensor]:
    """A search's decoder state over src and the most output tokens of each sentence (sents,):
    the caches preallocated for the longest output, the shortlist's candidates as the state's
    vocabulary, every step through ``decoder_step`` (None: eager). A sentence's
    target prefix (``prefix``) longer than its limit raises the limit to the prefix's length."""
    max_len = _max_output_lengths(models, src, options)
    if prefix is not None:
        max_len = torch.maximum(max_len, prefix.ne(PAD_ID).sum(dim=1))
    return DecoderState(models, src, use_cache, int(max_len.max()) + 1, candidates, decoder_step), max_len


def _force_prefix(lprobs: torch.Tensor, prefix: Optional[torch.Tensor], step: int, rows_per_sentence: int,
                  candidates: Optional[torch.Tensor]) -> torch.Tensor:
    """lprobs (rows, V) with every row whose sentence's target prefix (``prefix`` (sents, P) of
    ids, PAD_ID after each prefix's end; None: none) still runs at this step allowed only the
    prefix's token, at its own log-probability; other rows unchanged. candidates: the ids of
    lprobs' columns (a shortlist, which holds every prefix token: ``with_prefix_candidates``)."""
    if prefix is None or step >= prefix.size(1):
        return lprobs
    return force_tokens(lprobs, prefix[:, step].repeat_interleave(rows_per_sentence), candidates)


def force_tokens(lprobs: torch.Tensor, forced: torch.Tensor, candidates: Optional[torch.Tensor]) -> torch.Tensor:
    """lprobs (rows, V) with each row where ``forced`` (rows,) is not PAD_ID allowed only that
    token, at its own log-probability (``_force_prefix`` at one step)."""
    cols = (forced if candidates is None else torch.searchsorted(candidates, forced))[:, None]
    only = torch.full_like(lprobs, LOG_ZERO).scatter_(1, cols, lprobs.gather(1, cols))
    return torch.where(forced.ne(PAD_ID)[:, None], only, lprobs)


def with_prefix_candidates(candidates: Optional[torch.Tensor], prefix: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """A shortlist's candidates (sorted ids) with every token of the target prefixes added: a
    forced token is always one the search may emit."""
    if candidates is None or prefix is None:
        return candidates
    return torch.unique(torch.cat([candidates, prefix[prefix.ne(PAD_ID)]]))  # sorted


def _rows_at_max(max_len: torch.Tensor, step: int, shortest: int, rows_per_sentence: int) -> Optional[torch.Tensor]:
    """bool (rows,): the rows whose sentence is at its maximum length ``max_len`` (sents,) at this
    step, so only eos may follow; None while no sentence is (``shortest``: min(max_len), a host
    copy), so those steps mask nothing and wait for nothing."""
    if step < shortest:
        return None
    at_max = max_len.le(step)
    return at_max if rows_per_sentence == 1 else at_max.repeat_interleave(rows_per_sentence)


# -- beam search ---------------------------------------------------------------------------------
def _finished_and_next(top_scores: torch.Tensor, top_beam: torch.Tensor, top_token: torch.Tensor, k: int,
                       penalty, live: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, ...]:
    """A step's bookkeeping over its candidates (sents, W >= 2k, best first): (base_rows (sents, 1), the first row of each sentence;
    final (sents, k), eos among the first k candidates with a finite score; norm (sents, k),
    their scores over ``penalty`` (the length penalty of this step's length: a number, or
    (sents, 1)), LOG_ZERO where not final; order (sents, k), the first k candidates that do not
    end in eos (there are at least k, since each live hypothesis contributes at most one eos);
    rows (sents k,), the row each next hypothesis continues). live (sents,): Marian's rule, only
    the first ``live`` candidates of each sentence are taken (its live hypotheses' count; None: k)."""
    base_rows = torch.arange(top_scores.size(0), device=top_scores.device)[:, None] * k
    is_eos = top_token.eq(EOS_ID)
    final = is_eos[:, :k] & torch.isfinite(top_scores[:, :k])
    if live is not None:
        final &= torch.arange(k, device=top_scores.device) < live[:, None]
    norm = (top_scores[:, :k] / penalty).masked_fill(~final, LOG_ZERO)
    width = top_scores.size(1)
    order = (is_eos.long() * width + torch.arange(width, device=top_scores.device)).topk(k, dim=1, largest=False).indices
    rows = (base_rows + top_beam.gather(1, order)).view(-1)
    return base_rows, final, norm, order, rows


@torch.inference_mode()
def beam_search(
    models: Sequence[Transformer], src: torch.Tensor, options: DecodingOptions = DecodingOptions(), use_cache: bool = True,
    candidates: Optional[torch.Tensor] = None, all_finished: bool = False, decoder_step: Optional[DecoderStep] = None,
    prefix: Optional[torch.Tensor] = None, constraints: Optional[BatchConstraints] = None,
) -> list[list[Hypothesis]]:
    """Beam search over a batch src (B, S); returns the nbest hypotheses of each sentence (with
    ``all_finished``: every finished one, in the order found, by fairseq's stopping rule alone;
    searched with lenpen 0, ``rescore`` ranks them as a search with any other lenpen would).
    candidates: the ids the search may emit (a shortlist's ``vocab``; None: all).
    decoder_step: the decoder step (``decoder_step.AotStep`` for --compile; None: eager).
    prefix (B, P): each sentence's forced first output ids, PAD_ID-filled (None: none); while
    it runs, a sentence has one live hypothesis (the others score -inf, as at step 0).
    constraints: each sentence's hard lexical constraints (``decode/constraints.py``: dynamic beam
    allocation; None: none); a sentence without, or whose constraints no hypothesis met (listed
    in constraints.unmet), gets its unconstrained output.

    At each step the 2k best extensions (k = beam_size) of a sentence's k live hypotheses are
    ranked; those ending in eos among the first k are finished, and the first k others are the
    next beam. A sentence is done when it has k finished hypotheses (as fairseq), at its maximum
    length, or, earlier, when its nbest-th best finished score cannot be beaten by any live
    hypothesis: log-probabilities only fall, so score / max lp(any length still reachable)
    bounds every continuation. That last rule (not fairseq's) never changes the result.
    ``options.beam_rule`` "marian" is Marian's beam instead (its beam_search.cpp, and the Bergamot
    page's): a sentence with n finished hypotheses keeps k - n live ones, the first k - n
    extensions are taken, those ending in eos among them finish, and it is done when none is
    live (k finished); the finished are ranked alike. At its maximum length, a sentence's live
    hypotheses end as they are, as Marian's do at its bound: their eos is neither scored (its
    positional score is 0) nor counted in |Y|. Not with constraints.
    """
    if constraints and options.beam_rule != "fairseq":
        raise XfError(f"--beam-rule {options.beam_rule} is a plain beam search: lexical constraints and "
                      "glossaries take --beam-rule fairseq")
    found = _beam_search(models, src, options, use_cache, candidates, all_finished, decoder_step, prefix, constraints)
    missing = constraints.count_unmet(found) if constraints else []
    if missing:  # no hypothesis met them (they cannot all fit, or the beam lost them): none at all
        rows = torch.tensor(missing, device=src.device)
        again = _beam_search(models, src[rows], options, use_cache, candidates, all_finished, decoder_step,
                             prefix[rows] if prefix is not None else None)
        for i, hyps in zip(missing, again):
            found[i] = hyps
    return found


def _beam_search(models: Sequence[Transformer], src: torch.Tensor, options: DecodingOptions, use_cache: bool,
                 candidates: Optional[torch.Tensor], all_finished: bool, decoder_step: Optional[DecoderStep],
                 prefix: Optional[torch.Tensor], constraints: Optional[BatchConstraints] = None,
                 ) -> list[list[Hypothesis]]:
    """``beam_search`` itself, the one beam loop; the extensions each step keeps are chosen by
    ``selection`` (``selection.PlainSelection``, or the constraints' dynamic beam allocation);
    with constraints, a sentence none of whose hypotheses met them has none."""
    # One function on purpose: a step is one story over about ten tensors that change together.
    k, nbest, device, nsent = options.beam_size, options.nbest, src.device, src.size(0)
    lp = lambda length: length_penalty(length, options.lenpen, options.lenpen_style)  # noqa: E731
    state, max_len = _open_search(models, src, options, use_cache, candidates, decoder_step, prefix)
    finished: list[list[Hypothesis]] = [[] for _ in range(nsent)]
    selection = constraints if constraints else PlainSelection()  # one with no constraint at all: the plain one
    selection.start(max_len, k)

    sent_ids = torch.arange(nsent, device=device)  # original index of each active sentence
    tokens = torch.full((nsent, 1), BOS_ID, dtype=torch.long, device=device)  # (rows, t + 1)
    pos_scores = torch.zeros(nsent, 0, device=device)  # (rows, t)
    scores = torch.zeros(nsent, device=device)  # (rows,) cumulative log-probability
    fin_count = torch.zeros(nsent, dtype=torch.long, device=device)
    fin_best = torch.full((nsent, nbest), LOG_ZERO, device=device)  # best finished scores, sorted
    max_lp = lp(max_len.double() + 1).float()  # penalty of the longest output each sentence may have
    shortest = int(max_len.min())  # host copy: which step first forces eos, without a device sync
    beam_offsets = torch.arange(k, device=device)
    shrinking = options.beam_rule == "marian"

    for step in range(int(max_len.max()) + 1):
        per_sentence = k if step > 0 else 1
        lprobs = state.next_log_probs(tokens, _rows_at_max(max_len, step, shortest, per_sentence))  # (rows, V)
        lprobs = _force_prefix(lprobs, prefix, step, per_sentence, candidates)
        if step == 0:
            # All beams of a sentence start identical: decode one row per sentence, then copy it
            # k times with only the first copy live, so the top-k picks k different tokens.
            expand = torch.arange(nsent, device=device).repeat_interleave(k)  # (sents k,)
            state.expand_beams(k)
            lprobs, tokens, pos_scores = lprobs[expand], tokens[expand], pos_scores[expand]
            scores = torch.zeros(nsent, k, device=device).index_fill_(1, beam_offsets[1:], LOG_ZERO).view(-1)
        top_scores, top_beam, top_token, top_lprobs = selection.choose(scores, lprobs, step, candidates)  # (sents, W)
        base_rows, final, norm, order, rows = _finished_and_next(top_scores, top_beam, top_token, k, lp(step + 1.0),
                                                                 k - fin_count if shrinking else None)
        cut, norm = _marian_cut(final, norm, scores, top_beam, max_len, step, lp) if shrinking else (None, norm)
        fin_count += final.sum(dim=1)
        fin_best = torch.cat([fin_best, norm], dim=1).topk(nbest, dim=1).values
        prev_tokens, prev_pos_scores = tokens, pos_scores
        scores = top_scores.gather(1, order)  # (sents, k)
        if shrinking:  # Marian's beam: the first k - finished stay live, the rest are out
            scores = scores.masked_fill(beam_offsets >= (k - fin_count)[:, None], LOG_ZERO)
        scores = scores.view(-1)  # (rows,)
        tokens = torch.cat([tokens[rows], top_token.gather(1, order).view(-1, 1)], dim=1)
        pos_scores = torch.cat([pos_scores[rows], top_lprobs.gather(1, order).view(-1, 1)], dim=1)
        selection.follow(rows, tokens[:, -1])  # the caches follow below, with the done sentences' removal

        # A sentence is done with k finished, when no live hypothesis can beat its nbest-th finished one (Marian's
        # rule: one cut at its bound counts a subword fewer), or at its maximum length.
        best_live = scores.view(-1, k).max(dim=1).values  # (sents,)
        bound = best_live / torch.maximum(lp(torch.full_like(best_live, step + (1.0 if shrinking else 2.0))), max_lp)
        done = fin_count.ge(k) | max_len.le(step)
        if not all_finished:  # the bound holds for this lenpen only: a rescore needs them all
            done = done | fin_best[:, -1].ge(bound)
        any_final, all_done, any_done = torch.stack((final.any(), done.all(), done.any())).tolist()  # one sync
        if any_final:
            _add_finished(finished, selection, final, base_rows, top_beam, sent_ids, prev_tokens,
                          prev_pos_scores, norm, top_lprobs, cut)
        if all_done:
            break
        if not any_done:
            state.reorder_beams(rows)
        else:  # done sentences leave the batch
            keep = (~done).nonzero().view(-1)
            keep_rows = (keep[:, None] * k + beam_offsets).view(-1)  # (kept sents k,)
            state.select_sentences(keep, rows.index_select(0, keep_rows))  # beams followed, done rows dropped
            sent_ids, max_len, max_lp = sent_ids[keep], max_len[keep], max_lp[keep]
            prefix = prefix[keep] if prefix is not None else None
            fin_count, fin_best = fin_count[keep], fin_best[keep]
            tokens, pos_scores, scores = tokens[keep_rows], pos_scores[keep_rows], scores[keep_rows]
            shortest = int(max_len.min())
            selection.keep(keep, keep_rows)

    # all_finished: in the order found, so that rescore's stable sort breaks ties as this one does
    return finished if all_finished else [sorted(hyps, key=lambda h: -h.score)[:nbest] for hyps in finished]


def _marian_cut(final, norm, scores, top_beam, max_len, step: int, lp) -> tuple[torch.Tensor, torch.Tensor]:
    """Marian's bound (--beam-rule marian): a sentence at its maximum length ends its live
    hypotheses as they are, eos neither scored nor counted in |Y|. (cut (sents, k): the finished
    of this step that are such, since at the bound only eos could follow; norm with their scores.)"""
    k = final.size(1)
    cut = final & max_len.le(step)[:, None]
    as_they_are = scores.view(-1, k).gather(1, top_beam[:, :k]) / lp(max(step, 1.0))  # the live's own scores
    return cut, torch.where(cut, as_they_are, norm)


def _add_finished(finished: list[list[Hypothesis]], selection, final, base_rows, top_beam, sent_ids, prev_tokens,
                  prev_pos_scores, norm, top_lprobs, cut=None) -> None:
    """A step's finished hypotheses (``final`` (sents, k): eos among the first k candidates) added
    to their sentences' lists, except one that ``selection`` says may not end there (it ended at
    the length limit without its constraints). cut (sents, k): those that end at the bound as
    they are (Marian's rule; None: none)."""
    sent, rank = final.nonzero(as_tuple=True)
    done_rows = base_rows[:, 0][sent] + top_beam[sent, rank]
    cuts = cut[sent, rank].tolist() if cut is not None else [False] * len(done_rows)
    for i, row, row_tokens, row_pos, s, last, as_is in zip(
        sent_ids[sent].tolist(), done_rows.tolist(), prev_tokens[done_rows, 1:].tolist(),
        prev_pos_scores[done_rows].tolist(), norm[sent, rank].tolist(), top_lprobs[sent, rank].tolist(), cuts,
    ):
        if selection.met(row):
            finished[i].append(Hypothesis(row_tokens + [EOS_ID], s, row_pos + [0.0 if as_is else last], as_is))


def rescore(hyps: Sequence[Hypothesis], alpha: float, style: str = "gnmt") -> list[Hypothesis]:
    """``hyps`` of a beam search with lenpen 0 and ``all_finished`` (their scores: summed
    log-probabilities), scored and ranked as a beam search with lenpen ``alpha`` ranks them. The
    finished hypotheses do not depend on the lenpen (the live beam is ranked by log-probability
    alone), so one search serves every lenpen; the division is beam_search's own (float32 by a
    Python float), so ties break alike."""
    out = []
    for h in hyps:
        length = float(max(len(h.tokens) - h.cut, 1))  # a line cut at its bound: its eos is not counted
        score = (torch.tensor(h.score, dtype=torch.float32) / length_penalty(length, alpha, style)).item()
        out.append(Hypothesis(h.tokens, score, h.positional_scores, h.cut))
    return sorted(out, key=lambda h: -h.score)  # stable: ties keep the search's order


# -- greedy decoding and sampling ----------------------------------------------------------------
def _single_path_search(
    models: Sequence[Transformer],
    src: torch.Tensor,
    paths: int,
    choose: Callable[[torch.Tensor], torch.Tensor],
    options: DecodingOptions,
    use_cache: bool,
    candidates: Optional[torch.Tensor] = None,
    decoder_step: Optional[DecoderStep] = None,
    prefix: Optional[torch.Tensor] = None,
) -> list[list[Hypothesis]]:
    """``paths`` independent left-to-right paths per sentence; ``choose(lprobs (N, V)) -> (N,)``
    picks each row's next token. Rows leave the batch as soon as they emit eos. prefix: as
    beam_search's (the forced tokens leave ``choose`` one finite choice)."""
    device, nsent = src.device, src.size(0)
    state, max_len = _open_search(models, src, options, use_cache, candidates, decoder_step, prefix)
    row_ids = torch.arange(nsent, device=device).repeat_interleave(paths)  # sentence of each row
    if paths > 1:
        state.select(row_ids)
    max_len = max_len[row_ids]
    prefix = prefix[row_ids] if prefix is not None else None
    tokens = torch.full((row_ids.numel(), 1), BOS_ID, dtype=torch.long, device=device)
    pos_scores = torch.zeros(row_ids.numel(), 0, device=device)
    finished: list[list[Hypothesis]] = [[] for _ in range(nsent)]

    shortest = int(max_len.min())
    for step in range(int(max_len.max()) + 1):
        lprobs = state.next_log_probs(tokens, _rows_at_max(max_len, step, shortest, 1))
        lprobs = _force_prefix(lprobs, prefix, step, 1, candidates)
        next_token = choose(lprobs)  # (rows,)
        pos_scores = torch.cat([pos_scores, lprobs.gather(1, next_token[:, None])], dim=1)
        if candidates is not None:  # columns to token ids
            next_token = candidates[next_token]
        tokens = torch.cat([tokens, next_token[:, None]], dim=1)
        ended = next_token.eq(EOS_ID)
        any_ended, all_ended = torch.stack((ended.any(), ended.all())).tolist()  # one sync
        if any_ended:
            norm = pos_scores.sum(dim=1) / float(length_penalty(step + 1.0, options.lenpen, options.lenpen_style))
            idx = ended.nonzero().view(-1)
            for i, row_tokens, row_pos, s in zip(
                row_ids[idx].tolist(), tokens[idx, 1:].tolist(), pos_scores[idx].tolist(), norm[idx].tolist()
            ):
                finished[i].append(Hypothesis(row_tokens, s, row_pos))
            if all_ended:
                break
            keep = (~ended).nonzero().view(-1)
            state.select(keep)
            row_ids, max_len, tokens, pos_scores = row_ids[keep], max_len[keep], tokens[keep], pos_scores[keep]
            prefix = prefix[keep] if prefix is not None else None
            shortest = int(max_len.min())
    return [sorted(hyps, key=lambda h: -h.score) for hyps in finished]


@torch.inference_mode()
def greedy_search(
    models: Sequence[Transformer], src: torch.Tensor, options: DecodingOptions = DecodingOptions(), use_cache: bool = True,
    candidates: Optional[torch.Tensor] = None, decoder_step: Optional[DecoderStep] = None,
    prefix: Optional[torch.Tensor] = None,
) -> list[list[Hypothesis]]:
    """The most likely next token at every step (the result of beam search with beam 1);
    options.beam_size is not used."""
    return _single_path_search(models, src, 1, lambda lprobs: lprobs.argmax(dim=-1), options, use_cache, candidates,
                               decoder_step, prefix)


@torch.inference_mode()
def sample(
    models: Sequence[Transformer],
    src: torch.Tensor,
    options: DecodingOptions = DecodingOptions(sampling=True),
    generator: Optional[torch.Generator] = None,
    candidates: Optional[torch.Tensor] = None,
    decoder_step: Optional[DecoderStep] = None,
    prefix: Optional[torch.Tensor] = None,
) -> list[list[Hypothesis]]:
    """options.nbest independent samples per sentence from softmax(log p / temperature),
    restricted to the top_k tokens and the top_p nucleus. Scores are the model's own
    log-probabilities (before temperature and filtering); the samples of a sentence are sorted
    by score."""

    def choose(lprobs: torch.Tensor) -> torch.Tensor:
        logits = top_k_top_p_filter(lprobs / options.temperature, options.top_k, options.top_p)
        return torch.multinomial(logits.softmax(dim=-1), 1, generator=generator).view(-1)

    return _single_path_search(models, src, options.nbest, choose, options, True, candidates, decoder_step, prefix)


@torch.inference_mode()
def next_token_alternatives(models: Sequence[Transformer], src: torch.Tensor, prefix: torch.Tensor, count: int,
                            candidates: Optional[torch.Tensor] = None) -> list[list[int]]:
    """The ``count`` most likely ids at the first position after each sentence's target prefix
    (prefix (B, P), PAD_ID-filled; an empty one: the first position), most likely first, pad and
    bos never among them (eos may be). Sentences with prefixes of one length are decoded together."""
    lengths = prefix.ne(PAD_ID).sum(dim=1)
    out: list[list[int]] = [[] for _ in range(src.size(0))]
    for length in lengths.unique().tolist():
        rows = lengths.eq(length).nonzero().view(-1)
        tokens = torch.cat([torch.full((rows.numel(), 1), BOS_ID, dtype=torch.long, device=src.device),
                            prefix[rows, :length]], dim=1)
        state = DecoderState(models, src.index_select(0, rows), use_cache=False, vocab=candidates)
        lprobs = forbid_specials(state.log_probs(tokens), None)
        top = lprobs.topk(min(count, lprobs.size(1)), dim=1)
        for row, ids, scores in zip(rows.tolist(), top.indices.tolist(), top.values.tolist()):
            ids = [i for i, s in zip(ids, scores) if math.isfinite(s)]
            out[row] = candidates[ids].tolist() if candidates is not None else ids
    return out


def search(
    models: Sequence[Transformer],
    src: torch.Tensor,
    options: DecodingOptions,
    generator: Optional[torch.Generator] = None,
    candidates: Optional[torch.Tensor] = None,
    decoder_step: Optional[DecoderStep] = None,
    prefix: Optional[torch.Tensor] = None,
    constraints: Optional[BatchConstraints] = None,
) -> list[list[Hypothesis]]:
    """The search the options ask for: sampling, greedy (beam 1) or beam search; candidates:
    the ids it may emit (a shortlist's ``vocab``), None: all; decoder_step: the decoder step
    (``decoder_step.AotStep`` for xf translate --compile), None: eager; prefix (B, P): each
    sentence's forced first output ids, PAD_ID-filled (``collate_prefix``; None: none);
    constraints: hard lexical constraints (beam search only, beam 1 included; None: none)."""
    if constraints:
        if options.sampling:
            raise ValueError("lexical constraints need beam search, not sampling")
        return beam_search(models, src, options, candidates=candidates, decoder_step=decoder_step, prefix=prefix,
                           constraints=constraints)
    if options.sampling:
        return sample(models, src, options, generator, candidates, decoder_step, prefix)
    if options.beam_size == 1:
        return greedy_search(models, src, options, candidates=candidates, decoder_step=decoder_step, prefix=prefix)
    return beam_search(models, src, options, candidates=candidates, decoder_step=decoder_step, prefix=prefix)
