"""The bookkeeping of lexical constraints (``constraints.BatchConstraints``, in tensors): match
states (overlaps, disjunctions, word ends), banks and the order of dynamic beam allocation, by hand."""

import pytest
import torch

from xformer_cli.decode.constraints import BatchConstraints, distinct_first, least_tokens, word_boundaries
from xformer_cli.text.vocab import BOS_ID, EOS_ID, PAD_ID

PHRASE = [(7, 8)]  # one constraint, one form: the phrase "7 8"
EITHER = [(5,), (7, 9)]  # one constraint, two forms
NOT_A_WORD_START = 9  # in WORDS, token 9 continues a word (as "e" after "▁Hund")
WORDS = torch.tensor([t != NOT_A_WORD_START for t in range(12)])


def could_end(constraints, tokens, word_starts=None):
    """Whether a hypothesis of ``tokens`` meets ``constraints`` if it ends there (eos next)."""
    given = BatchConstraints([constraints], word_starts)
    given.start(torch.tensor([20]), beams=1)
    for t in [*tokens, EOS_ID]:
        given.follow(torch.tensor([0]), torch.tensor([t]))
    return given.met(0)


def test_a_phrase_is_met_only_contiguously_and_overlapping_starts_are_followed():
    assert could_end([PHRASE], [7, 8])
    assert not could_end([PHRASE], [7, 5, 8])
    assert could_end([PHRASE], [7, 7, 8])  # the second 7 starts a new match
    assert could_end([[(1, 1, 2)]], [1, 1, 1, 2])
    assert could_end([PHRASE], [7, 8, 5])  # met stays met
    assert not could_end([PHRASE, [(4,)]], [7, 8])


def test_any_form_of_a_disjunctive_constraint_meets_it():
    assert could_end([EITHER], [5])
    assert could_end([EITHER], [7, 9])
    assert not could_end([EITHER], [7])
    assert not could_end([EITHER, PHRASE], [5])


def test_with_word_starts_a_form_must_end_a_word():
    assert could_end([PHRASE], [7, 8, NOT_A_WORD_START])  # subwords alone
    assert not could_end([PHRASE], [7, 8, NOT_A_WORD_START], WORDS)  # "Hund" inside "Hunde"
    assert could_end([PHRASE], [7, 8], WORDS)  # eos ends the word
    assert could_end([PHRASE], [7, 8, 5], WORDS)  # so does a word start
    assert could_end([PHRASE], [7, 8, NOT_A_WORD_START, 7, 8, 4], WORDS)  # met later
    assert could_end([EITHER], [5, NOT_A_WORD_START, 7, 9], WORDS)  # the other form


def test_word_boundaries_start_a_word_or_are_not_word_characters():
    class Pieces:  # a sentencepiece model's two calls
        pieces = ["<pad>", "<unk>", "<s>", "</s>", "\u2581Hund", "e", ".", "\u2581", "n", "-"]

        def get_piece_size(self):
            return len(self.pieces)

        def id_to_piece(self, i):
            return self.pieces[i]

    table = word_boundaries(Pieces())
    assert table.tolist() == [True, True, True, True, True, False, True, True, False, True]
    assert table[EOS_ID]


def test_banks_are_taken_round_robin_most_met_first_and_constraint_tokens_are_candidates():
    given = BatchConstraints([[[(5,)]]])
    given.start(torch.tensor([10]), beams=2)
    lprobs = torch.full((2, 6), -5.0)
    lprobs[:, [PAD_ID, BOS_ID]] = float("-inf")
    lprobs[0, [4, 1, 5]] = torch.tensor([-0.1, -0.5, -3.0])
    lprobs[1, [4, 1, 5]] = torch.tensor([-0.2, -0.3, -3.0])
    lprobs = given.mask_eos(lprobs, step=0)
    assert lprobs[:, EOS_ID].eq(float("-inf")).all()  # the constraint is unmet: no eos
    scores, beams, tokens, _ = given.extensions(torch.tensor([0.0, -1.0]), lprobs, None)
    finite = scores[0].isfinite()
    got = list(zip(beams[0][finite].tolist(), tokens[0][finite].tolist()))
    # bank 1 (5 met): (0, 5) -3, (1, 5) -4; bank 0: (0, 4) -0.1, (0, 1) -0.5, (1, 4) -1.2, (1, 1) -1.3
    assert got[:6] == [(0, 5), (0, 4), (1, 5), (0, 1), (1, 4), (1, 1)]
    assert len(set(got)) == len(got)  # each candidate once


def pool(row0_score, row1_score):
    """(beam, token) of the finite candidates of a beam of 2, constraint 5: row 0 has met it
    (emitted 5), row 1 has not; row 0 prefers 6 then 7, row 1 4, 6, 7, 1 and 5 at -3."""
    given = BatchConstraints([[[(5,)]]])
    given.start(torch.tensor([10]), beams=2)
    given.follow(torch.tensor([0, 1]), torch.tensor([5, 4]))
    lprobs = torch.full((2, 8), -6.0)
    lprobs[:, [PAD_ID, BOS_ID, EOS_ID]] = float("-inf")
    lprobs[0, [6, 7]] = torch.tensor([-0.5, -0.7])
    lprobs[1, [4, 6, 7, 1, 5]] = torch.tensor([-0.1, -0.2, -0.3, -0.4, -3.0])
    scores, beams, tokens, _ = given.extensions(torch.tensor([row0_score, row1_score]), lprobs, None)
    finite = scores[0].isfinite()
    return list(zip(beams[0][finite].tolist(), tokens[0][finite].tolist()))


def test_each_hypothesis_own_best_are_candidates_and_the_top_bank_prunes_what_it_beats():
    # Row 0 met 5 but scores 10 below row 1: the 4 best of the beam are all row 1's; its own are there too.
    got = pool(-10.0, 0.0)
    assert {(0, 6), (0, 7)} <= set(got) and got[:4] == [(1, 5), (1, 4), (0, 6), (1, 6)]
    # Row 1 (5 unmet) scores 10 below: its extensions other than 5 are below the 2 best that met 5.
    got = pool(0.0, -10.0)
    met = [i for i, (b, t) in enumerate(got) if b == 0 or t == 5]
    assert got[:2] == [(0, 6), (0, 7)] and met == list(range(len(met)))  # all before the pruned


def test_a_sentence_without_constraints_keeps_the_plain_top_2k_in_order():
    given = BatchConstraints([[], [[(5,)]]])
    given.start(torch.tensor([10, 10]), beams=2)
    lprobs = torch.randn(4, 8, generator=torch.Generator().manual_seed(0)).log_softmax(dim=1)
    lprobs[:, [PAD_ID, BOS_ID]] = float("-inf")  # as the search forbids them (a padding candidate is pad)
    scores = torch.tensor([0.0, -1.0, 0.0, -2.0])
    got, beams, tokens, _ = given.extensions(scores, lprobs.clone(), None)
    plain = (scores[:, None] + lprobs).view(2, -1).topk(4, dim=1)
    assert torch.equal(got[0, :4], plain.values[0]) and got[0, 4:].eq(float("-inf")).all()
    assert torch.equal(beams[0, :4] * 8 + tokens[0, :4], plain.indices[0])


def test_batch_constraints_refuse_empty_forms_and_list_their_tokens():
    given = BatchConstraints([[[[7, 8]], [[5], [7, 9]]], []])
    assert bool(given) and given.tokens() == [5, 7, 8, 9]
    assert not BatchConstraints([[], []])
    assert given.rows([1, 0, 0]).constraints[1:] == [given.constraints[0]] * 2
    for bad in ([[[]]], [[[[]]]], [[[[1], []]]]):
        with pytest.raises(ValueError, match="at least one"):
            BatchConstraints(bad)


def test_least_tokens_lets_only_constraints_that_share_a_token_overlap():
    assert least_tokens([[(1, 4)], [(4, 5)]]) == 2  # "1 4 5" meets both
    assert least_tokens([[(1,)], [(2,)], [(3, 4)]]) == 4  # no token shared: end to end
    assert least_tokens([[(1, 2), (7,)], [(2, 3)], [(9,)]]) == 3  # 1 2 / 2 3 may overlap (2), then 9
    assert least_tokens([[(5,)], [(5,)]]) == 1  # one token meets both


def test_a_sentence_whose_constraints_cannot_fit_is_searched_without_them_up_front():
    given = BatchConstraints([[[(t,)] for t in range(4, 304)], [[(5,)]], [[(6, 7, 8), (9,)]]])  # 300 distinct words
    given.start(torch.tensor([10, 10, 2]), beams=4)
    assert given.unmet == [0] and given.constraints[0] == []
    assert given.constraints[2] == [[(9,)]]  # a form longer than the limit is dropped, the constraint stays
    assert given.token.shape == (3, 1)  # no state for what was dropped


def test_distinct_first_keeps_each_valid_candidate_once_in_order():
    generator = torch.Generator().manual_seed(0)
    for _ in range(50):
        pool = torch.randint(0, 12, (3, 20), generator=generator)
        valid = torch.rand(3, 20, generator=generator) < 0.7
        got = distinct_first(pool, valid)
        for row in range(3):
            want = list(dict.fromkeys(pool[row][valid[row]].tolist()))
            assert got[row, :len(want)].tolist() == want
            assert got[row, len(want):].eq(PAD_ID).all()


WORST = """
import resource, sys, time, random, torch
sys.path.insert(0, {tests!r})
from helpers import tiny, batch
from xformer_cli.decode.constraints import BatchConstraints
from xformer_cli.settings.options import DecodingOptions
from xformer_cli.decode.search import beam_search
torch.set_num_threads(1)
limits = DecodingOptions()
rng, vocab = random.Random(0), 8000
model = tiny(vocab_size=vocab)
per_form = limits.max_constraint_subwords // (limits.max_constraints * limits.max_constraint_forms)
sentence = [[[rng.randrange(4, vocab) for _ in range(per_form)] for _ in range(limits.max_constraint_forms)]
            for _ in range(limits.max_constraints)]
src = batch(*[[rng.randrange(4, vocab) for _ in range(20)] for _ in range(16)])
beam_search([model], src[:1], DecodingOptions())  # the plain search's own memory first
before, start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, time.perf_counter()
beam_search([model], src, DecodingOptions(), constraints=BatchConstraints([sentence] * 16))
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024, time.perf_counter() - start)
"""


def test_the_worst_batch_the_limits_admit_stays_in_the_documented_bound():
    """docs/decoding.md: a batch of 16 sentences, each at every default limit (16 constraints of
    8 forms, 256 subwords: random words of an 8,000 vocabulary, the most candidates), takes under
    400 MB beyond the plain search and no hang (before the limits and the flat state: 1,000 forms
    of one constraint took 44 s and 600 MB alone; 5,000 grew past 23 GB)."""
    import subprocess
    import sys
    from pathlib import Path

    script = WORST.format(tests=str(Path(__file__).parent))
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    megabytes, seconds = map(float, out.stdout.split())
    assert megabytes < 400 and seconds < 120, (megabytes, seconds)
