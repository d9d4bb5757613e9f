"""Hard lexical constraints for beam search: the bookkeeping of dynamic beam allocation, in tensors.

Each sentence may carry constraints, each a list of alternative forms (token-id phrases; one form:
a plain constraint, several: a disjunctive one, any form satisfies it). The search
(``search.beam_search``) asks this module three things at every step:
- ``mask_eos``: a hypothesis may end only when all its sentence's constraints are met (at the
  sentence's maximum length every hypothesis must end: one that has not met them is dropped);
- ``extensions``: the candidates, the beam's usual 2k best extensions plus, for every live
  hypothesis, its own k best next tokens, the next token of every unmet constraint (the first
  token of each form, and the token after each partial match) and, where a form waits for its
  word's end, its best token that ends the word; ordered by dynamic beam allocation (Post &
  Vilar 2018, as vectorized by Hu et al. 2019): candidates fall into banks by the constraint
  tokens they have met, and are taken round-robin across banks (the best of each bank, most
  tokens met first, then the second best of each, ...), so the beam holds hypotheses at every
  stage of progress, except those that the k best of the top bank (every constraint met) beat;
- ``follow``: the new beam's hypotheses, to advance each one's match state by its new token.

A form is matched anywhere in the output as a contiguous phrase (overlapping partial matches are
all followed, so "a a b" meets "a b"). Given ``word_starts`` (``word_boundaries``), a form is met
only where its last token ends a word: the token after it starts a word, is punctuation or is
eos (``Hund`` is met by ``Hund .`` and ``Hund bellt``, not inside ``Hunde``), as a whole-word
term-hit count reads the output. Sentences without constraints keep the search's own
candidates in its own order: their outputs are exactly the unconstrained ones.

The match state of a batch's hypotheses is two tensors: ``partial`` (rows, F, L + 1) bool, where
[r, f, n] says that row r's last n tokens are form f's first n (n = the form's length: the form
is complete and waits for a word boundary), and ``met`` (rows, C) bool. F: the most forms, C: the
most constraints, L: the longest form of a sentence of the batch (padding forms have no tokens,
padding constraints are met).

A sentence with a constraint whose shortest form is longer than its length limit is searched
without its constraints; one whose search ends with no hypothesis meeting them all (they cannot
all fit, or the beam lost them) has none: ``search.beam_search`` searches those again without
constraints, so each gets its unconstrained output. Both are listed in ``unmet`` (batch indices).
"""

from __future__ import annotations

import functools
import re
from typing import Optional, Sequence

import torch

from ..text.vocab import EOS_ID, PAD_ID
from .selection import top_candidates

LOG_ZERO = float("-inf")
NO_TOKEN = -1  # the token of a padding position of ``forms``: no output token equals it
ALLOCATE_ELEMENTS = 1 << 21  # candidate states (W x P) ranked at once: tens of MB, whatever the batch


def distinct_first(pool: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """pool (S, W) of candidate indices, ``valid`` (S, W): each row's valid candidates, each once
    (its first place), in their order, then the token pad (never chosen) up to the width of the
    row with the most. By sorting: a (W, W) comparison is gigabytes for the pools of long
    constraint lists."""
    places = torch.arange(pool.size(1), device=pool.device)
    key = torch.where(valid, pool, -1 - places)  # invalid ones: distinct, below every index
    ordered, order = key.sort(dim=1, stable=True)  # equal ones: earliest first
    repeat = torch.zeros_like(valid)
    repeat[:, 1:] = ordered[:, 1:].eq(ordered[:, :-1])
    valid = valid & ~torch.empty_like(valid).scatter_(1, order, repeat)
    width = int(valid.sum(dim=1).max())
    kept = valid.to(torch.uint8).sort(dim=1, descending=True, stable=True).indices[:, :width]
    return torch.where(valid, pool, torch.full_like(pool, PAD_ID)).gather(1, kept)


@functools.lru_cache(maxsize=8)  # one table per model, not per buffer
def word_boundaries(sp) -> torch.Tensor:
    """bool (V,) over a sentencepiece model's ids: whether the piece may follow the end of a word
    (it starts a new word with ``▁``, or starts with a character that is not a word character,
    as a regex's ``(?!\\w)`` after a term; eos and the other specials do too)."""
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    return torch.tensor([i == EOS_ID or not p or p[0] == "\u2581" or re.match(r"\w", p[0]) is None
                         for i, p in enumerate(pieces)])


def least_tokens(constraints: Sequence[Sequence[tuple[int, ...]]]) -> int:
    """A lower bound of the output tokens that meet every constraint: two forms can share an
    output position only if they share a token, so constraints that share no token with each
    other (directly or through others) take disjoint positions, each group at least its longest
    shortest form ("1 4" and "4 5" may overlap in "1 4 5": 2; "a" and "b": 2)."""
    group = list(range(len(constraints)))  # union-find over constraints

    def root(c: int) -> int:
        while group[c] != c:
            group[c] = group[group[c]]
            c = group[c]
        return c

    owner: dict[int, int] = {}
    for c, forms in enumerate(constraints):
        for token in {t for form in forms for t in form}:
            group[root(c)] = root(owner.setdefault(token, c))
    need: dict[int, int] = {}
    for c, forms in enumerate(constraints):
        need[root(c)] = max(need.get(root(c), 0), min(map(len, forms)))
    return sum(need.values())


class BatchConstraints:
    """The constraints of one batch's sentences, given as ``per_sentence[i]``: a list of
    constraints, each a list of forms (lists of token ids, none empty); [] for a sentence without.
    word_starts: ``word_boundaries`` of the vocabulary (a form must end a word), None: a form is
    met by its tokens alone. ``unmet``: after a search, the batch indices of the sentences whose
    constraints were not met."""

    def __init__(self, per_sentence: Sequence[Sequence[Sequence[Sequence[int]]]],
                 word_starts: Optional[torch.Tensor] = None):
        self.constraints = [[[tuple(form) for form in forms] for forms in sentence] for sentence in per_sentence]
        for sentence in self.constraints:
            if any(not forms or not all(forms) for forms in sentence):
                raise ValueError("a constraint must have at least one form, each of at least one token")
        self.word_starts = word_starts
        self.unmet: list[int] = []

    def __bool__(self) -> bool:
        return any(self.constraints)

    def rows(self, rows: Sequence[int]) -> "BatchConstraints":
        """The constraints of a batch whose sentence j is this batch's ``rows[j]``."""
        return BatchConstraints([self.constraints[i] for i in rows], self.word_starts)

    def tokens(self) -> list[int]:
        """Every token of every form (a shortlist must hold them: they are always candidates)."""
        return sorted({t for sentence in self.constraints for forms in sentence for form in forms for t in form})

    # -- the search's calls -----------------------------------------------------------------------
    def start(self, max_len: torch.Tensor, beams: int) -> None:
        """Open a search of this batch with ``beams`` rows per sentence and each sentence's most
        output tokens ``max_len``. A form longer than its sentence's limit can never be met and is
        dropped; a sentence left with a constraint of no form, or whose constraints need more tokens
        than its limit (``least_tokens``), is searched without its constraints (listed in ``unmet``)."""
        for i, limit in enumerate(max_len.tolist()):
            kept = [[form for form in forms if len(form) <= limit] for forms in self.constraints[i]]
            if kept and (not all(kept) or least_tokens(kept) > limit):
                kept = []
                self.unmet.append(i)
            self.constraints[i] = kept
        device, k, sents = max_len.device, beams, len(self.constraints)
        # Every form's tokens laid end to end, one row a sentence: position p holds token[p] of the
        # form of constraint owner[p] at depth[p] (1: its first token); padding positions own the
        # extra constraint C (never one's) and hold NO_TOKEN.
        width = max([sum(len(f) for forms in s for f in forms) for s in self.constraints] + [1])
        ncons = max([len(s) for s in self.constraints] + [1])
        token = torch.full((sents, width), NO_TOKEN, dtype=torch.long)
        depth = torch.zeros(sents, width, dtype=torch.long)
        last = torch.zeros(sents, width, dtype=torch.bool)
        owner = torch.full((sents, width), ncons, dtype=torch.long)
        shortest = torch.zeros(sents, ncons, dtype=torch.long)
        for i, sentence in enumerate(self.constraints):
            p = 0
            for c, alternatives in enumerate(sentence):
                shortest[i, c] = min(len(form) for form in alternatives)
                for form in alternatives:
                    span = slice(p, p + len(form))
                    token[i, span], depth[i, span], owner[i, span] = torch.tensor(form), torch.arange(1, len(form) + 1), c
                    last[i, p + len(form) - 1] = True
                    p += len(form)
        self.beams, self.max_len, self.ncons = k, max_len, ncons
        self.most_tokens = int(shortest.sum(dim=1).max())  # the highest bank
        self.token, self.depth, self.last, self.owner, self.shortest = (
            t.to(device) for t in (token, depth, last, owner, shortest))
        self.constrained = torch.tensor([bool(s) for s in self.constraints], device=device)  # (sents,)
        self.any_constrained = bool(self)
        self.partial = torch.zeros(sents * k, width, dtype=torch.bool, device=device)
        unused = torch.arange(ncons)[None, :] >= torch.tensor([len(s) for s in self.constraints])[:, None]
        self.satisfied = unused.to(device).repeat_interleave(k, dim=0)  # padding constraints: met
        self.prev_partial, self.prev_satisfied = self.partial, self.satisfied

    def _sentence_of(self, rows: torch.Tensor) -> torch.Tensor:
        return torch.div(rows, self.beams, rounding_mode="floor")

    def _per_constraint(self, at: torch.Tensor, sents: torch.Tensor) -> torch.Tensor:
        """(N, C): whether any position (N, P) set in ``at`` belongs to each constraint."""
        owner = torch.where(at, self.owner[sents], self.ncons)  # unset: the padding constraint
        out = torch.zeros(at.size(0), self.ncons + 1, dtype=torch.bool, device=at.device)
        return out.scatter_(1, owner, True)[:, :-1]

    def _advance(self, partial: torch.Tensor, met: torch.Tensor, tokens: torch.Tensor, sents: torch.Tensor):
        """The states (partial (N, P), met (N, C)) of N hypotheses of sentences ``sents`` (N,)
        after emitting ``tokens`` (N,)."""
        depth = self.depth[sents]
        before = torch.zeros_like(partial)
        before[:, 1:] = partial[:, :-1]  # depth d matched after this token: d - 1 were, before it
        grown = self.token[sents].eq(tokens[:, None]) & (depth.eq(1) | before)
        if self.word_starts is None:  # a form is met by its tokens
            done = grown & self.last[sents]
        else:  # a complete form (it waited at its length) is met if this token may follow a word
            done = partial & self.last[sents] & self.word_starts.to(tokens.device)[tokens][:, None]
        return grown, met | self._per_constraint(done, sents)

    def _waiting(self, partial: torch.Tensor, sents: torch.Tensor) -> torch.Tensor:
        """(N, C): a form of the constraint is complete and waits for a word boundary."""
        return self._per_constraint(partial & self.last[sents], sents)

    def _ready(self, partial: torch.Tensor, met: torch.Tensor, sents: torch.Tensor) -> torch.Tensor:
        """(N, C): met, or met by ending here (eos ends a word)."""
        return met | self._waiting(partial, sents)

    def _progress(self, partial: torch.Tensor, met: torch.Tensor, sents: torch.Tensor) -> torch.Tensor:
        """(N,): constraint tokens met, the bank: a met constraint (or a complete form waiting for
        the word's end) counts its shortest form's length, an unmet one its longest partial match
        (at most that length - 1). The word's end is no bank of its own: with one more bank per
        constraint the banks outnumber a beam of 4 and those that have begun none get no place."""
        matched = partial * self.depth[sents]  # (N, P): the depth of each matched position
        longest = torch.zeros(partial.size(0), self.ncons + 1, dtype=torch.long, device=partial.device)
        longest = longest.scatter_reduce_(1, self.owner[sents], matched, "amax")[:, :-1]  # (N, C)
        shortest = self.shortest[sents]
        per = torch.where(self._ready(partial, met, sents), shortest, torch.minimum(longest, shortest - 1))
        return per.sum(dim=1)

    def mask_eos(self, lprobs: torch.Tensor, step: int) -> torch.Tensor:
        """lprobs (rows, V) with eos forbidden to every row with an unmet constraint before its
        sentence's maximum length (there the search makes every row end)."""
        rows = torch.arange(lprobs.size(0), device=lprobs.device)
        sents = self._sentence_of(rows)
        forbid = ~self._ready(self.partial, self.satisfied, sents).all(dim=1) & self.max_len[sents].gt(step)
        lprobs[:, EOS_ID].masked_fill_(forbid, LOG_ZERO)  # column EOS_ID: a shortlist holds 0-3
        return lprobs

    def choose(self, scores: torch.Tensor, lprobs: torch.Tensor, step: int, candidates: Optional[torch.Tensor]):
        """``selection.PlainSelection.choose``'s call: eos forbidden where constraints are unmet
        (``mask_eos``), then dynamic beam allocation's extensions (``extensions``)."""
        return self.extensions(scores, self.mask_eos(lprobs, step), candidates)

    def extensions(self, scores: torch.Tensor, lprobs: torch.Tensor, candidates: Optional[torch.Tensor]):
        """As ``selection.best_extensions`` (scores (sents k,), lprobs (sents k, V)) but W >= 2k wide:
        a constrained sentence's candidates in dynamic beam allocation's order, the others' 2k best
        in their own order, each padded with -inf candidates of the token pad (never chosen)."""
        k, vocab = self.beams, lprobs.size(1)
        sents = scores.size(0) // k
        cand = (scores[:, None] + lprobs).view(-1, k * vocab)  # (sents, k V)
        top_idx = top_candidates(cand, 2 * k)[1]  # (sents, 2k): the plain search's, so its output is theirs
        rows = torch.arange(sents * k, device=cand.device)
        row_sent = self._sentence_of(rows)
        offset = (rows % k) * vocab  # (rows,): where each row's columns start in its sentence's k V
        # Each hypothesis' own k best next tokens (Post & Vilar add the best one): hypotheses that
        # have met their constraints score below those that have not paid for them yet, so the 2k
        # best rarely hold their extensions; with their own they go on, or end, as in a beam
        # search among them alone.
        own = offset[:, None] + lprobs.topk(min(k, vocab), dim=1).indices  # (rows, k)
        # The next token of each unmet constraint's forms: the first of each, the one after each partial match.
        # The next token of each unmet constraint's forms: the first of each, the one after each partial match.
        token = self.token[row_sent]  # (rows, P)
        open_ = ~self._ready(self.partial, self.satisfied, row_sent)  # (rows, C)
        open_ = torch.cat([open_, open_.new_zeros(open_.size(0), 1)], dim=1).gather(1, self.owner[row_sent])
        after = torch.zeros_like(self.partial)
        after[:, 1:] = self.partial[:, :-1]
        wanted = (self.depth[row_sent].eq(1) | after) & open_ & token.ne(NO_TOKEN)  # (rows, P)
        cols = token.clamp(min=0) if candidates is None else torch.searchsorted(candidates, token.clamp(min=0))
        steered = offset[:, None] + cols  # (rows, P)
        constrained = self.constrained[row_sent]
        parts = [top_idx, own.view(sents, -1), steered.view(sents, -1)]
        valid = [torch.ones_like(top_idx, dtype=torch.bool), constrained[:, None].expand_as(own).reshape(sents, -1),
                 (wanted & constrained[:, None]).view(sents, -1)]
        if self.word_starts is not None:  # a form that waits for a word boundary: the best token that ends the word
            starts = self.word_starts.to(lprobs.device)
            starts = starts if candidates is None else starts[candidates]
            parts.append((offset + lprobs.masked_fill(~starts, LOG_ZERO).argmax(dim=1)).view(sents, k))
            valid.append((self._waiting(self.partial, row_sent).any(dim=1) & constrained).view(sents, k))
        idx = distinct_first(torch.cat(parts, dim=1), torch.cat(valid, dim=1))  # (sents, W)
        if self.any_constrained:  # a few sentences at a time: the states of their W candidates are W x P each
            step = max(1, ALLOCATE_ELEMENTS // (idx.size(1) * self.token.size(1)))
            idx = torch.cat([self._allocate(idx[s:s + step], cand[s:s + step].gather(1, idx[s:s + step]), vocab,
                                            candidates, s) for s in range(0, sents, step)])
        top_beam, top_token = idx // vocab, idx % vocab
        if candidates is not None:
            top_token = candidates[top_token]
        return cand.gather(1, idx), top_beam, top_token, lprobs.view(-1, k * vocab).gather(1, idx)

    def _allocate(self, idx: torch.Tensor, values: torch.Tensor, vocab: int,
                  candidates: Optional[torch.Tensor], first: int) -> torch.Tensor:
        """Sentences ``first``... of the batch: each constrained one's pool idx (sents, W) reordered (the others unchanged): the
        finite candidates round-robin across banks (rank 0 of every bank, most met first, then
        rank 1, ...), then those that the k best of the top bank beat, then the -inf ones."""
        k, (sents, width) = self.beams, idx.shape
        beam, col = idx // vocab, idx % vocab
        token = col if candidates is None else candidates[col]
        mine = slice(first, first + sents)
        parents = ((first + torch.arange(sents, device=idx.device))[:, None] * k + beam).view(-1)
        who = self._sentence_of(parents)
        partial, met = self._advance(self.partial[parents], self.satisfied[parents], token.view(-1), who)
        bank = self._progress(partial, met, who).view(sents, width)
        finite = torch.isfinite(values)
        bank = torch.where(finite, bank, torch.full_like(bank, -1))
        # Sorted by bank, then score, then place in the pool (two stable sorts): the rank in its bank.
        by_score = values.sort(dim=1, descending=True, stable=True).indices
        by_bank = bank.gather(1, by_score).sort(dim=1, descending=True, stable=True).indices
        ranked = by_score.gather(1, by_bank)  # (sents, W): pool positions
        ranked_bank = bank.gather(1, ranked)
        place = torch.arange(width, device=idx.device).expand(sents, width)
        starts = torch.ones_like(ranked_bank, dtype=torch.bool)
        starts[:, 1:] = ranked_bank[:, 1:].ne(ranked_bank[:, :-1])
        rank_sorted = place - torch.where(starts, place, torch.zeros_like(place)).cummax(dim=1).values
        rank = torch.empty_like(rank_sorted).scatter_(1, ranked, rank_sorted)  # (sents, W)
        # Within a round, most met first (Post & Vilar): at beam 1 the constraint is placed first.
        full = self.shortest[mine].sum(dim=1)[:, None]  # (sents, 1): the top bank, every constraint met
        span = self.most_tokens + 2
        key = rank * span + (full - bank)
        # A candidate that has not met them all and scores below the k best that have is pruned
        # as a beam search prunes one that k others beat: its continuations only score lower. It
        # keeps a place after the others (the beam takes it if nothing else is left). Without
        # this, the partial matches of a long constraint (a bank per subword) take the beam's
        # places from the continuations of those that met it, which then go on as a greedy search
        # (one that, in a weak model, never ends) and ramble to the length limit.
        top_values = torch.where(bank.eq(full), values, torch.full_like(values, LOG_ZERO))
        beaten = bank.lt(full) & values.lt(top_values.topk(min(k, width), dim=1).values[:, -1:])
        rounds = span * (width + 1)  # more than any rank * span + (full - bank)
        key = key + rounds * beaten + 2 * rounds * ~finite
        key = torch.where(self.constrained[mine, None], key, place)  # unconstrained sentences: as they were
        return idx.gather(1, key.sort(dim=1, stable=True).indices)

    def follow(self, rows: torch.Tensor, tokens: torch.Tensor) -> None:
        """The new beam: row r continues row ``rows[r]`` with ``tokens[r]``."""
        self.prev_partial, self.prev_satisfied = self.partial, self.satisfied
        self.partial, self.satisfied = self._advance(self.partial[rows], self.satisfied[rows], tokens,
                                                     self._sentence_of(rows))

    def met_rows(self, rows: torch.Tensor) -> torch.Tensor:
        """bool (N,): whether the hypotheses that rows ``rows`` held before the last ``follow``
        met their constraints (ending there: eos may follow a word)."""
        sents = self._sentence_of(rows)
        return self._ready(self.prev_partial[rows], self.prev_satisfied[rows], sents).all(dim=1)

    def met(self, row: int) -> bool:
        """Whether the hypothesis that row ``row`` held before the last ``follow`` met its constraints."""
        return bool(self.met_rows(torch.tensor([row], device=self.partial.device))[0])

    def keep(self, keep: torch.Tensor, keep_rows: torch.Tensor) -> None:
        """Only sentences ``keep`` (positions among the active ones) and rows ``keep_rows`` stay."""
        self.token, self.depth, self.last, self.owner, self.shortest = (
            t[keep] for t in (self.token, self.depth, self.last, self.owner, self.shortest))
        self.constrained, self.max_len = self.constrained[keep], self.max_len[keep]
        self.partial, self.satisfied = self.partial[keep_rows], self.satisfied[keep_rows]
        self.any_constrained = bool(self.constrained.any())

    def count_unmet(self, finished: list[list]) -> list[int]:
        """The sentences (batch indices) with no finished hypothesis meeting their constraints,
        added to ``unmet``; returns them."""
        missing = [i for i, hyps in enumerate(finished) if not hyps]
        self.unmet = sorted(set(self.unmet) | set(missing))
        return missing
