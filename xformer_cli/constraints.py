"""Hard lexical constraints for beam search: the bookkeeping of dynamic beam allocation.

Each sentence may carry constraints, each a list of alternative forms (token-id phrases; one form:
a plain constraint, several: a disjunctive one, any form satisfies it). The search
(``search.beam_search``) asks this module three things at every step:
- ``mask_eos``: a hypothesis may end only when all its sentence's constraints are met (at the
  sentence's maximum length every hypothesis must end: one that has not met them is dropped);
- ``extensions``: the candidates, the beam's usual 2k best extensions plus, for every live
  hypothesis, the next token of every unmet constraint (the first token of each form, and the
  token after each partial match), ordered by dynamic beam allocation (Post & Vilar 2018, as
  vectorized by Hu et al. 2019): candidates fall into banks by the constraint tokens they have met,
  and are taken round-robin across banks (the best of each bank, most tokens met first, then the
  second best of each, ...), so the beam always holds hypotheses at every stage of progress;
- ``follow``: the new beam's hypotheses, to advance each one's match state by its new token.

A form is matched anywhere in the output as a contiguous phrase (overlapping partial matches are
all followed, so "a a b" meets "a b"). Sentences without constraints keep the search's own
candidates in its own order: their outputs are exactly the unconstrained ones.

A sentence with a constraint whose shortest form is longer than its length limit is searched
without its constraints; one whose search ends with no hypothesis meeting them all (they cannot
all fit, or the beam lost them) has none: ``search.beam_search`` searches those again without
constraints, so each gets its unconstrained output. Both are listed in ``unmet`` (batch indices).
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from .vocab import EOS_ID, PAD_ID

LOG_ZERO = float("-inf")

# A hypothesis' match state: per constraint, None when met, else the set of (form, matched length)
# partial matches in progress (a frozenset, so states can be shared between beams).
State = tuple


def start_state(constraints: Sequence[Sequence[tuple[int, ...]]]) -> State:
    return tuple(frozenset() for _ in constraints)


def advance(constraints: Sequence[Sequence[tuple[int, ...]]], state: State, token: int) -> State:
    """The state after emitting ``token``."""
    out = []
    for forms, partial in zip(constraints, state):
        if partial is None:
            out.append(None)
            continue
        grown = {(f, n + 1) for f, n in partial if forms[f][n] == token}
        grown |= {(f, 1) for f, form in enumerate(forms) if form[0] == token}
        out.append(None if any(n == len(forms[f]) for f, n in grown) else frozenset(grown))
    return tuple(out)


def all_met(state: State) -> bool:
    return all(partial is None for partial in state)


def progress(constraints: Sequence[Sequence[tuple[int, ...]]], state: State) -> int:
    """Constraint tokens met: a met constraint counts its shortest form's length, an unmet one its
    longest partial match (at most that length - 1). The bank of a hypothesis."""
    total = 0
    for forms, partial in zip(constraints, state):
        shortest = min(len(f) for f in forms)
        total += shortest if partial is None else min(max((n for _, n in partial), default=0), shortest - 1)
    return total


def next_tokens(constraints: Sequence[Sequence[tuple[int, ...]]], state: State) -> set[int]:
    """The tokens that start or continue a form of an unmet constraint."""
    out = set()
    for forms, partial in zip(constraints, state):
        if partial is not None:
            out.update(form[0] for form in forms)
            out.update(forms[f][n] for f, n in partial)
    return out


def longest_needed(constraints: Sequence[Sequence[tuple[int, ...]]]) -> int:
    """The most output tokens one constraint needs (its shortest form's): more than the limit and
    the constraints cannot be met (together they may need more: forms can overlap)."""
    return max(min(len(f) for f in forms) for forms in constraints)


class BatchConstraints:
    """The constraints of one batch's sentences, given as ``per_sentence[i]``: a list of
    constraints, each a list of forms (lists of token ids, none empty); [] for a sentence without.
    ``unmet``: after a search, the batch indices of the sentences whose constraints were not met."""

    def __init__(self, per_sentence: Sequence[Sequence[Sequence[Sequence[int]]]]):
        self.constraints = [[[tuple(form) for form in forms] for forms in sentence] for sentence in per_sentence]
        for sentence in self.constraints:
            if any(not forms or not all(forms) for forms in sentence):
                raise ValueError("a constraint must have at least one form, each of at least one token")
        self.unmet: list[int] = []

    def __bool__(self) -> bool:
        return any(self.constraints)

    def rows(self, rows: Sequence[int]) -> "BatchConstraints":
        """The constraints of a batch whose sentence j is this batch's ``rows[j]``."""
        return BatchConstraints([self.constraints[i] for i in rows])

    def tokens(self) -> list[int]:
        """Every token of every form (a shortlist must hold them: they are always candidates)."""
        return sorted({t for sentence in self.constraints for forms in sentence for form in forms for t in form})

    # -- the search's calls -----------------------------------------------------------------------
    def start(self, max_len: torch.Tensor, beams: int) -> None:
        """Open a search of this batch with ``beams`` rows per sentence and each sentence's most
        output tokens ``max_len``; sentences whose constraints cannot fit are searched without."""
        self.beams, self.max_len = beams, max_len.tolist()
        self.active = list(range(len(self.constraints)))  # batch index of each sentence still searched
        for i, (sentence, limit) in enumerate(zip(self.constraints, self.max_len)):
            if sentence and longest_needed(sentence) > limit:
                self.constraints[i] = []
                self.unmet.append(i)
        self.states = [start_state(self.constraints[i]) if self.constraints[i] else None
                       for i in self.active for _ in range(beams)]
        self.prev_states = self.states

    def mask_eos(self, lprobs: torch.Tensor, step: int) -> torch.Tensor:
        """lprobs (rows, V) with eos forbidden to every row with an unmet constraint before its
        sentence's maximum length (there the search makes every row end)."""
        rows = [r for r, s in enumerate(self.states)
                if s is not None and not all_met(s) and self.max_len[self.active[r // self.beams]] > step]
        if rows:
            lprobs[torch.tensor(rows, device=lprobs.device), EOS_ID] = LOG_ZERO  # column EOS_ID: a shortlist holds 0-3
        return lprobs

    def extensions(self, scores: torch.Tensor, lprobs: torch.Tensor, candidates: Optional[torch.Tensor]):
        """As ``search._best_extensions`` (scores (sents k,), lprobs (sents k, V)) but W >= 2k wide:
        a constrained sentence's candidates in dynamic beam allocation's order, the others' 2k best
        in their own order, each padded with -inf candidates of the token pad (never chosen)."""
        k, vocab = self.beams, lprobs.size(1)
        cand = (scores[:, None] + lprobs).view(-1, k * vocab)  # (sents, k V)
        top_idx = cand.topk(2 * k, dim=1).indices
        pools = top_idx.tolist()
        cols = {}  # token id -> column
        for s, pool in enumerate(pools):
            if self.constraints[self.active[s]]:
                seen = set(pool)
                for b in range(k):
                    for t in sorted(next_tokens(self.constraints[self.active[s]], self.states[s * k + b])):
                        col = cols.setdefault(t, t if candidates is None else int(torch.searchsorted(candidates, t)))
                        if b * vocab + col not in seen:
                            seen.add(b * vocab + col)
                            pool.append(b * vocab + col)
        width = max(len(pool) for pool in pools)
        idx = torch.tensor([pool + [PAD_ID] * (width - len(pool)) for pool in pools], device=cand.device)
        if any(self.constraints[i] for i in self.active):
            idx = self._allocate(idx, cand.gather(1, idx).tolist(), vocab, candidates)
        top_beam, top_token = idx // vocab, idx % vocab
        if candidates is not None:
            top_token = candidates[top_token]
        return cand.gather(1, idx), top_beam, top_token, lprobs.view(-1, k * vocab).gather(1, idx)

    def _allocate(self, idx: torch.Tensor, pool_scores: list[list[float]], vocab: int,
                  candidates: Optional[torch.Tensor]) -> torch.Tensor:
        """Each constrained sentence's pool reordered: finite candidates by (rank in its bank,
        most tokens met first), then the rest as they were."""
        k, rows = self.beams, idx.tolist()
        ids = (candidates.tolist() if candidates is not None else None)
        for s, (pool, values) in enumerate(zip(rows, pool_scores)):
            constraints = self.constraints[self.active[s]]
            if not constraints:
                continue
            banks = []
            for flat, value in zip(pool, values):
                beam, token = divmod(flat, vocab)
                token = ids[token] if ids is not None else token
                state = self.states[s * k + beam]
                banks.append(progress(constraints, state if token == EOS_ID else advance(constraints, state, token)))
            finite = sorted((p for p, v in enumerate(values) if v != LOG_ZERO), key=lambda p: (-banks[p], -values[p]))
            rank, seen = {}, {}
            for p in finite:
                rank[p] = seen.get(banks[p], 0)
                seen[banks[p]] = rank[p] + 1
            order = sorted(finite, key=lambda p: (rank[p], -banks[p])) + [p for p, v in enumerate(values) if v == LOG_ZERO]
            rows[s] = [pool[p] for p in order]
        return torch.tensor(rows, device=idx.device)

    def follow(self, rows: torch.Tensor, tokens: torch.Tensor) -> None:
        """The new beam: row r continues row ``rows[r]`` with ``tokens[r]``."""
        self.prev_states = self.states
        new = []
        for parent, token in zip(rows.tolist(), tokens.tolist()):
            state = self.prev_states[parent]
            new.append(None if state is None else advance(self.constraints[self.active[parent // self.beams]],
                                                          state, token))
        self.states = new

    def met(self, row: int) -> bool:
        """Whether the hypothesis that row ``row`` held before the last ``follow`` met its constraints."""
        state = self.prev_states[row]
        return state is None or all_met(state)

    def keep(self, keep: torch.Tensor, keep_rows: torch.Tensor) -> None:
        """Only sentences ``keep`` (positions among the active ones) and rows ``keep_rows`` stay."""
        self.active = [self.active[s] for s in keep.tolist()]
        self.states = [self.states[r] for r in keep_rows.tolist()]

    def count_unmet(self, finished: list[list]) -> list[int]:
        """The sentences (batch indices) with no finished hypothesis meeting their constraints,
        added to ``unmet``; returns them."""
        missing = [i for i, hyps in enumerate(finished) if not hyps]
        self.unmet = sorted(set(self.unmet) | set(missing))
        return missing
