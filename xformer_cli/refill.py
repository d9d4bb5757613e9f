"""Refilled batches: beam search (greedy: beam 1) over a pool of sentences, in a batch that never
runs half-empty (``xf translate --refill``).

``search.beam_search`` decodes a batch until its longest sentence is done, and the sentences done
before it leave, so the late steps decode few rows. ``refill_search`` keeps ``slots`` sentences
decoding: when one is done, the next waiting sentence takes its rows at the next step, as
CTranslate2's and vLLM's continuous batching do. The newcomer brings its encoder output and its
cross-attention keys and values (padded to the widest source decoding, its padding masked), and
writes its self-attention keys and values into the rows' shared buffers from the next slot on;
the cache's ``starts`` hide the slots before it (they hold the sentence it replaced). Every row
has its own step: its position, its maximum length, its length penalty and its target prefix.
Waiting sentences are encoded ``slots`` at a time in pool order: for a pool sorted by length
(``translation.search_lines``) these are the batches of the search without refill, so the
encoder outputs are the same.

A sentence's hypotheses are those ``beam_search`` finds for it: tokens identical, scores within
float rounding (the masked slots weigh exactly 0, but the sums run over other lengths). Not here,
``search`` runs them batch by batch: sampling, lexical constraints, a shortlist (its candidates
are a batch's), a compiled step (its graph takes one length for every row), ``all_finished``.

``refill_stream`` is the same search over a pool that grows while it runs (``xf serve --refill``:
requests join the running batch): ``feed(count, wait)`` hands it up to ``count`` new sentences
(key, source ids, target prefix ids) whenever it has free slots (``wait``: none is decoding, so
the feed may block for one, or return none to end the search), and ``on_done(key, hypotheses)``
gets each sentence as soon as it is done. ``refill_search`` is ``refill_stream`` over a list.
"""

from __future__ import annotations

from collections import deque
from typing import Callable, Hashable, Optional, Sequence

import torch

from .batching import collate_source
from .model import Transformer
from .options import DecodingOptions
from .search import (LOG_ZERO, DecoderState, Hypothesis, _best_extensions, _finished_and_next, force_tokens,
                     length_penalty, max_output_lengths)
from .vocab import BOS_ID, EOS_ID, PAD_ID


# feed(count, wait) -> up to count new sentences: (key, source ids without eos, target prefix ids or None)
Feed = Callable[[int, bool], Sequence[tuple[Hashable, Sequence[int], Optional[Sequence[int]]]]]
# A sentence ready to decode: key, its encoder output (S, D) under each model (eos included), its
# output limit (most tokens before eos), its prefix ids (None: none)
Entry = tuple[Hashable, list[torch.Tensor], int, Optional[list[int]]]


class _Waiting:
    """Sentences not decoding yet, asked of ``feed`` ``chunk`` at a time and encoded together as
    they come (for a list fed in order: ``chunk`` at a time in pool order)."""

    def __init__(self, models: Sequence[Transformer], feed: Feed, device, chunk: int, options: DecodingOptions):
        self.models, self.feed, self.device, self.chunk, self.options = models, feed, device, chunk, options
        self.max_positions = min(model.cfg.max_positions for model in models)
        self.ready: deque[Entry] = deque()

    def take(self, count: int, wait: bool = False) -> list[Entry]:
        """Up to ``count`` sentences; ``wait``: nothing decodes, the feed may block for some."""
        while len(self.ready) < count:
            new = list(self.feed(self.chunk, wait and not self.ready))
            if not new:
                break
            src = collate_source([ids for _, ids, _ in new]).to(self.device)
            memories = [model.encode(src)[0] for model in self.models]  # (chunk, S, D) each
            limits = max_output_lengths(torch.tensor([len(ids) for _, ids, _ in new]), self.options.max_len_a,
                                        self.options.max_len_b, self.max_positions).tolist()
            for row, ((key, ids, prefix), limit) in enumerate(zip(new, limits)):
                prefix = list(prefix) if prefix else None  # a prefix longer than the limit raises it
                limit = max(limit, len(prefix)) if prefix else limit
                self.ready.append((key, [memory[row, : len(ids) + 1] for memory in memories], limit, prefix))
        return [self.ready.popleft() for _ in range(min(count, len(self.ready)))]


def _padded(memories: Sequence[torch.Tensor], width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Encoder outputs (S_i, D) as one (n, width, D) batch, zeros after each, and its padding
    mask (n, width), True at padding."""
    out = memories[0].new_zeros(len(memories), width, memories[0].size(-1))
    pad = torch.ones(len(memories), width, dtype=torch.bool, device=out.device)
    for i, memory in enumerate(memories):
        out[i, : memory.size(0)] = memory
        pad[i, : memory.size(0)] = False
    return out, pad


def _fit(x: torch.Tensor, width: int, dim: int, fill) -> torch.Tensor:
    """x cut or padded with ``fill`` to ``width`` along ``dim`` (a new tensor either way)."""
    if x.size(dim) >= width:
        return x.narrow(dim, 0, width).contiguous()
    shape = list(x.shape)
    shape[dim] = width - x.size(dim)
    return torch.cat([x, x.new_full(shape, fill)], dim=dim)


class RefillState(DecoderState):
    """``DecoderState`` of a refilled batch: sentence slot j owns rows j * beams ... j * beams +
    beams - 1 from its first step on (no step 0 with one row per sentence), and ``admit`` puts
    new sentences into slots in place. The encoder outputs and cross-attention keys and values
    are (slots, W, ...) with W the widest source decoding, padding masked."""

    def __init__(self, models: Sequence[Transformer], first: Sequence[Entry], beams: int, capacity: int):
        for model in models:
            if model.training:
                raise ValueError("search needs models in eval mode (call model.eval())")
        self.models, self.projections, self.compiled, self.beams = list(models), None, None, beams
        self.widths = [entry[1][0].size(0) for entry in first]  # each slot's source length, eos included
        self.encoded = [_padded([entry[1][m] for entry in first], max(self.widths)) for m in range(len(models))]
        self.caches = [model.new_cache(capacity) for model in models]
        for cache in self.caches:
            cache.starts = torch.zeros(len(first) * beams, dtype=torch.long, device=self.encoded[0][0].device)

    @property
    def length(self) -> int:
        """Slots of the self-attention buffers filled so far (every row writes one a step)."""
        return self.caches[0].length

    def admit(self, slots: list[int], entries: Sequence[Entry]) -> None:
        """Sentences ``entries`` (``_Waiting.take``) take sentence slots ``slots``, after the first
        step (the cross-attention keys and values of the others exist): their rows' prefixes
        begin at the next slot."""
        for j, entry in zip(slots, entries):
            self.widths[j] = entry[1][0].size(0)
        width = max(self.widths)
        where = torch.tensor(slots, device=self.encoded[0][0].device)
        rows = (where[:, None] * self.beams + torch.arange(self.beams, device=where.device)).view(-1)
        for m, (model, cache) in enumerate(zip(self.models, self.caches)):
            new_memory, new_pad = _padded([entry[1][m] for entry in entries], width)
            memory, pad = (_fit(x, width, 1, fill) for x, fill in zip(self.encoded[m], (0.0, True)))
            memory[where], pad[where] = new_memory, new_pad
            self.encoded[m] = (memory, pad)
            for i, layer in enumerate(model.decoder_layers):
                keys, values = (_fit(x, width, 2, 0.0) for x in cache.cross[i])  # (slots, H, W, K)
                keys[where], values[where] = layer.cross_attn.project_kv(new_memory)
                cache.cross[i] = (keys, values)
            cache.starts[rows] = cache.length

    def select_sentences(self, keep: torch.Tensor, keep_rows: torch.Tensor) -> None:
        super().select_sentences(keep, keep_rows)
        self.widths = [self.widths[j] for j in keep.tolist()]

    def drop_slots(self, count: int) -> None:
        """Forget the first ``count`` slots of the self-attention buffers (no row uses them)."""
        for cache in self.caches:
            cache.drop_slots(count)


def refill_search(models: Sequence[Transformer], sources: Sequence[Sequence[int]], options: DecodingOptions,
                  slots: int, prefix: Optional[torch.Tensor] = None, device: Optional[torch.device] = None,
                  ) -> list[list[Hypothesis]]:
    """Beam search (beam 1: greedy) of every sentence of ``sources`` (ids without eos), ``slots``
    sentences decoding at once, a done one replaced by the next in pool order at the next step;
    returns each sentence's nbest hypotheses, best first, in pool order: those of
    ``search.beam_search`` (and ``greedy_search``) over the same sentences. prefix (len(sources),
    P): each sentence's forced first output ids, PAD_ID-filled (``engines.collate_prefix``; None:
    none); device: the models' (None: the CPU)."""
    found: list[list[Hypothesis]] = [[] for _ in sources]
    if not sources:
        return found
    prefixes = [row[row.ne(PAD_ID)].tolist() for row in prefix.cpu()] if prefix is not None else [None] * len(sources)
    max_positions = min(model.cfg.max_positions for model in models)
    limits = max_output_lengths(torch.tensor([len(s) for s in sources]), options.max_len_a, options.max_len_b,
                                max_positions).tolist()
    longest = max(max(limit, len(p or ())) for limit, p in zip(limits, prefixes))
    fed = 0

    def feed(count: int, wait: bool):
        nonlocal fed
        start, fed = fed, min(fed + count, len(sources))
        return [(i, sources[i], prefixes[i]) for i in range(start, fed)]

    def on_done(i: int, hyps: list[Hypothesis]) -> None:
        found[i] = hyps

    refill_stream(models, feed, on_done, options, slots, device, capacity=2 * (longest + 1))
    return found


@torch.inference_mode()
def refill_stream(models: Sequence[Transformer], feed: Feed, on_done: Callable[[Hashable, list[Hypothesis]], None],
                  options: DecodingOptions, slots: int, device: Optional[torch.device] = None,
                  capacity: int = 0) -> None:
    """Beam search (beam 1: greedy) of every sentence ``feed`` hands out (the module's docstring),
    ``slots`` sentences decoding at once, a done one's rows taken by the next at the next step;
    ``on_done(key, nbest hypotheses best first)`` as each is done, the hypotheses
    ``search.beam_search`` finds for it. Ends when nothing decodes and the feed gives nothing.
    capacity: the buffer slots before those no row uses are shed (0: twice the longest output
    admitted so far, which it follows). The rules of a step (the 2k best extensions, finished
    hypotheses, when a sentence is done) are beam_search's, applied to each sentence at its own step."""
    # One function on purpose, as _beam_search: a step is one story over tensors that change together.
    k, nbest = options.beam_size, options.nbest
    lp = lambda length: length_penalty(length, options.lenpen, options.lenpen_style)  # noqa: E731
    waiting = _Waiting(models, feed, device, slots, options)

    def prefix_rows(entries: Sequence[Entry], width: int) -> torch.Tensor:
        return torch.tensor([(e[3] or []) + [PAD_ID] * (width - len(e[3] or [])) for e in entries],
                            dtype=torch.long, device=device)

    while first := waiting.take(slots, wait=True):  # a batch from nothing (the feed may block for it)
        capacity = max(capacity, 2 * (max(e[2] for e in first) + 1))
        state = RefillState(models, first, k, capacity)
        device = state.encoded[0][0].device
        beam_offsets = torch.arange(k, device=device)
        fresh_scores = torch.zeros(k, device=device).index_fill_(0, beam_offsets[1:], LOG_ZERO)  # beam 0 alone live

        # Per sentence slot (host): key, slot of its bos, hypotheses found. Per slot (device): its own step etc.
        sent = [e[0] for e in first]
        start = [0] * len(sent)
        hyps_of: list[list[Hypothesis]] = [[] for _ in sent]
        step = torch.zeros(len(sent), dtype=torch.long, device=device)
        max_len = torch.tensor([e[2] for e in first], device=device)
        slot_prefix = prefix_rows(first, max(len(e[3]) for e in first if e[3])) if any(e[3] for e in first) else None
        max_lp = lp(max_len.double() + 1).float()  # penalty of the longest output each sentence may have
        fin_count = torch.zeros(len(sent), dtype=torch.long, device=device)
        fin_best = torch.full((len(sent), nbest), LOG_ZERO, device=device)  # best finished scores, sorted
        # Per row, in buffer slot coordinates: column c is the input token at slot c and its log-prob.
        tokens = torch.full((len(sent) * k, 1), BOS_ID, dtype=torch.long, device=device)
        pos_scores = torch.zeros(len(sent) * k, 1, device=device)
        scores = fresh_scores.repeat(len(sent))  # (rows,) cumulative log-probability
        limits_host, steps_host = [e[2] for e in first], [0] * len(sent)  # host copies: which rows are at their limit

        while sent:
            if state.length >= capacity and min(start) > 0:
                drop = min(start)
                state.drop_slots(drop)
                start = [s - drop for s in start]
                tokens, pos_scores = tokens[:, drop:], pos_scores[:, drop:]
            at_max_somewhere = any(s >= limit for s, limit in zip(steps_host, limits_host))
            at_max = max_len.le(step).repeat_interleave(k) if at_max_somewhere else None  # None: nothing to mask
            lprobs = state.next_log_probs(tokens, at_max)  # (rows, V)
            if slot_prefix is not None:
                width = slot_prefix.size(1)
                forced = slot_prefix.gather(1, step.clamp(max=width - 1)[:, None]).view(-1)
                forced = forced.masked_fill(step.ge(width), PAD_ID)  # (slots,): PAD_ID past the prefix
                lprobs = force_tokens(lprobs, forced.repeat_interleave(k), None)
            top_scores, top_beam, top_token, top_lprobs = _best_extensions(scores, lprobs, k, None)  # (slots, 2k)
            # finished candidates and the next beams, each slot at its own length
            base_rows, final, norm, order, rows = _finished_and_next(top_scores, top_beam, top_token, k,
                                                                     lp(step.double() + 1.0).float()[:, None])
            fin_count += final.sum(dim=1)
            fin_best = torch.cat([fin_best, norm], dim=1).topk(nbest, dim=1).values
            prev_tokens, prev_pos_scores = tokens, pos_scores
            scores = top_scores.gather(1, order).view(-1)
            tokens = torch.cat([tokens[rows], top_token.gather(1, order).view(-1, 1)], dim=1)
            pos_scores = torch.cat([pos_scores[rows], top_lprobs.gather(1, order).view(-1, 1)], dim=1)
            state.reorder_beams(rows)

            # Done: k finished, its maximum length, or no live hypothesis can beat its nbest-th finished one.
            best_live = scores.view(-1, k).max(dim=1).values  # (slots,)
            bound = best_live / torch.maximum(lp(step.float() + 2.0), max_lp)
            done = fin_count.ge(k) | max_len.le(step) | fin_best[:, -1].ge(bound)
            step += 1
            steps_host = [s + 1 for s in steps_host]
            done_flags, final_flags = torch.stack((done, final.any(dim=1))).tolist()  # the step's one sync
            done_slots = [j for j, d in enumerate(done_flags) if d]

            if any(final_flags):
                slot, rank = final.nonzero(as_tuple=True)
                done_rows = base_rows[:, 0][slot] + top_beam[slot, rank]
                for j, row_tokens, row_pos, s, last in zip(
                    slot.tolist(), prev_tokens[done_rows].tolist(), prev_pos_scores[done_rows].tolist(),
                    norm[slot, rank].tolist(), top_lprobs[slot, rank].tolist(),
                ):
                    own = start[j] + 1  # the column after its bos
                    hyps_of[j].append(Hypothesis(row_tokens[own:] + [EOS_ID], s, row_pos[own:] + [last]))
            if done_slots:
                for j in done_slots:
                    on_done(sent[j], sorted(hyps_of[j], key=lambda h: -h.score)[:nbest])
                entries = waiting.take(len(done_slots))
                refill, leave = done_slots[: len(entries)], done_slots[len(entries):]
                if entries:  # the next sentences take the rows of done ones
                    state.admit(refill, entries)
                    capacity = max(capacity, 2 * (max(e[2] for e in entries) + 1))
                    where = torch.tensor(refill, device=device)
                    where_rows = (where[:, None] * k + beam_offsets).view(-1)
                    for j, e in zip(refill, entries):
                        sent[j], start[j], steps_host[j], limits_host[j], hyps_of[j] = e[0], state.length, 0, e[2], []
                    new_max = torch.tensor([e[2] for e in entries], device=device)
                    step[where], max_len[where], fin_count[where] = 0, new_max, 0
                    max_lp[where] = lp(new_max.double() + 1).float()
                    fin_best[where] = LOG_ZERO
                    if slot_prefix is not None or any(e[3] for e in entries):
                        width = max([len(e[3]) for e in entries if e[3]] + [slot_prefix.size(1) if slot_prefix is not None else 1])
                        if slot_prefix is None:
                            slot_prefix = torch.full((len(sent), width), PAD_ID, dtype=torch.long, device=device)
                        slot_prefix = _fit(slot_prefix, width, 1, PAD_ID)
                        slot_prefix[where] = prefix_rows(entries, width)
                    scores.view(-1, k)[where] = fresh_scores
                    tokens[where_rows, -1] = BOS_ID
                if leave:  # nothing waits: done sentences leave the batch
                    keep = sorted(set(range(len(sent))) - set(leave))
                    sent, start = [sent[j] for j in keep], [start[j] for j in keep]
                    steps_host, limits_host = [steps_host[j] for j in keep], [limits_host[j] for j in keep]
                    hyps_of = [hyps_of[j] for j in keep]
                    if not sent:
                        break  # the next batch starts from nothing, as the first did
                    keep_t = torch.tensor(keep, device=device)
                    keep_rows = (keep_t[:, None] * k + beam_offsets).view(-1)
                    state.select_sentences(keep_t, keep_rows)
                    step, max_len, max_lp = step[keep_t], max_len[keep_t], max_lp[keep_t]
                    fin_count, fin_best = fin_count[keep_t], fin_best[keep_t]
                    slot_prefix = slot_prefix[keep_t] if slot_prefix is not None else None
                    tokens, pos_scores, scores = tokens[keep_rows], pos_scores[keep_rows], scores[keep_rows]
