"""The bookkeeping of lexical constraints: match states (overlaps, disjunctions), banks and the
tokens that advance an unmet constraint, by hand."""

import pytest

from xformer_cli.constraints import BatchConstraints, advance, all_met, next_tokens, progress, start_state

PHRASE = [(7, 8)]  # one constraint, one form: the phrase "7 8"
EITHER = [(5,), (7, 9)]  # one constraint, two forms


def run(constraints, tokens):
    state = start_state(constraints)
    for t in tokens:
        state = advance(constraints, state, t)
    return state


def test_a_phrase_is_met_only_contiguously_and_overlapping_starts_are_followed():
    assert all_met(run([PHRASE], [7, 8]))
    assert not all_met(run([PHRASE], [7, 5, 8]))
    assert all_met(run([PHRASE], [7, 7, 8]))  # the second 7 starts a new match
    assert all_met(run([[(1, 1, 2)]], [1, 1, 1, 2]))
    assert all_met(run([PHRASE], [7, 8, 5]))  # met stays met


def test_any_form_of_a_disjunctive_constraint_meets_it():
    assert all_met(run([EITHER], [5]))
    assert all_met(run([EITHER], [7, 9]))
    assert not all_met(run([EITHER], [7]))
    assert not all_met(run([EITHER, PHRASE], [5]))


def test_progress_counts_met_tokens_and_next_tokens_start_or_continue_a_form():
    constraints = [PHRASE, EITHER]
    assert progress(constraints, start_state(constraints)) == 0
    assert next_tokens(constraints, start_state(constraints)) == {7, 5}
    state = run(constraints, [7])
    assert progress(constraints, state) == 1  # half of 7 8; 7 of 7 9 counts at most 0 (the shortest form is 1 long)
    assert next_tokens(constraints, state) == {7, 8, 5, 9}
    state = run(constraints, [7, 8, 5])
    assert progress(constraints, state) == 3 and next_tokens(constraints, state) == set()


def test_batch_constraints_refuse_empty_forms_and_list_their_tokens():
    given = BatchConstraints([[[[7, 8]], [[5], [7, 9]]], []])
    assert bool(given) and given.tokens() == [5, 7, 8, 9]
    assert not BatchConstraints([[], []])
    assert given.rows([1, 0, 0]).constraints[1:] == [given.constraints[0]] * 2
    for bad in ([[[]]], [[[[]]]], [[[[1], []]]]):
        with pytest.raises(ValueError, match="at least one"):
            BatchConstraints(bad)
