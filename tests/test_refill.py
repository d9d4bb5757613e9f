"""Refilled batches (refill.py): every sentence gets the hypotheses of today's batch search, the
batch stays full while sentences wait, and search_lines uses refill only where it applies."""

import random

import pytest
import torch

from test_search import D, _count_decoder_rows, assert_same, batch, tiny
from xformer_cli.engines import XfEngine, collate_prefix
from xformer_cli.options import TranslateOptions
from xformer_cli.refill import RefillState, refill_search, refill_stream
from xformer_cli.search import beam_search, greedy_search
from xformer_cli.translation import Stats, search_lines


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: tiny tensors gain nothing from threads


def mixed_sources(count, seed=0, vocab=40):
    """Sentences of 1 to 20 ids in no order of length: short ones finish early, long ones late."""
    rng = random.Random(seed)
    return [[rng.randrange(4, vocab) for _ in range(rng.choice([1, 2, 3, 5, 8, 13, 20]))] for _ in range(count)]


SOURCES = mixed_sources(13)
CPU = torch.device("cpu")


def alone(models, sources, options, prefixes=None):
    """Today's search, one sentence a batch."""
    out = []
    for i, s in enumerate(sources):
        prefix = collate_prefix([prefixes[i]], CPU) if prefixes is not None else None
        out.append(beam_search(models, batch(s), options, prefix=prefix)[0])
    return out


@pytest.mark.parametrize("options", [D(beam_size=4, max_len_b=6), D(beam_size=4, nbest=3, max_len_b=6),
                                     D(beam_size=1, max_len_b=6), D(beam_size=3, lenpen=0.0, max_len_b=2)],
                         ids=["beam4", "nbest3", "beam1", "lenpen0"])
def test_refill_equals_the_search_of_each_sentence(options):
    model = tiny()
    expected = alone([model], SOURCES, options)
    for slots in (1, 2, 5, len(SOURCES), 40):
        assert_same(refill_search([model], SOURCES, options, slots), expected)
    by_length = sorted(range(len(SOURCES)), key=lambda i: -len(SOURCES[i]))  # sorted, as search_lines gives it
    got = refill_search([model], [SOURCES[i] for i in by_length], options, 4)
    assert_same(got, [expected[i] for i in by_length])


def test_refill_equals_the_batch_search():
    model = tiny()
    options = D(beam_size=4, nbest=2, max_len_b=6)
    assert_same(refill_search([model], SOURCES, options, len(SOURCES)), beam_search([model], batch(*SOURCES), options))


def test_refill_with_beam_one_equals_greedy():
    model = tiny()
    options = D(beam_size=1, max_len_b=6)
    expected = [greedy_search([model], batch(s), options)[0] for s in SOURCES]
    assert_same(refill_search([model], SOURCES, options, 3), expected)


@pytest.mark.parametrize("positions", ["learned", "rope", "alibi"])
def test_each_row_has_its_own_position(positions):
    model = tiny(positions=positions)
    options = D(beam_size=3, nbest=2, max_len_b=5)
    assert_same(refill_search([model], SOURCES, options, 3), alone([model], SOURCES, options))


def test_target_prefixes_and_ensembles():
    models = [tiny(seed=1), tiny(seed=2)]
    rng = random.Random(3)
    prefixes = [[rng.randrange(4, 40) for _ in range(rng.choice([0, 0, 1, 3, 9]))] for _ in SOURCES]
    options = D(beam_size=4, nbest=2, max_len_b=6)
    got = refill_search(models, SOURCES, options, 4, collate_prefix(prefixes, CPU))
    assert_same(got, alone(models, SOURCES, options, prefixes))
    for hyps, prefix in zip(got, prefixes):
        assert all(h.tokens[: len(prefix)] == prefix for h in hyps)


def test_the_batch_stays_full_while_sentences_wait():
    model = tiny()
    rows = _count_decoder_rows(model)
    sources = mixed_sources(30, seed=4)
    refill_search([model], sources, D(beam_size=2, max_len_b=4), 6)
    rows = list(rows)
    # 6 sentences x 2 beams at every step until no sentence waits (24 wait at first, and at most
    # 6 finish a step), then the batch shrinks as sentences finish
    assert rows[0] == 12 and rows.count(12) >= 1 + 24 // 6
    assert rows == sorted(rows, reverse=True) and all(r % 2 == 0 for r in rows)
    # batch by batch, the same sentences take more steps over fewer rows
    batched = _count_decoder_rows(model)
    for i in range(0, 30, 6):
        beam_search([model], batch(*sources[i : i + 6]), D(beam_size=2, max_len_b=4))
    assert len(rows) < len(batched) and sum(rows) / len(rows) > sum(batched) / len(batched)


def test_slots_no_row_uses_are_shed():
    """One slot and a long pool: the buffers would grow with every sentence; they shed the slots
    of the sentences done, and the outputs stay the same."""
    model = tiny()
    dropped = []
    drop_slots = RefillState.drop_slots

    def spy(self, count):
        dropped.append(count)
        drop_slots(self, count)

    RefillState.drop_slots = spy
    try:
        sources = mixed_sources(12, seed=5)
        options = D(beam_size=2, max_len_b=6)
        got = refill_search([model], sources, options, 1)
    finally:
        RefillState.drop_slots = drop_slots
    assert dropped and all(count > 0 for count in dropped)
    assert_same(got, alone([model], sources, options))


def test_a_stream_takes_sentences_as_they_come_and_gives_each_when_done():
    """refill_stream (xf serve --refill): sentences join while others decode, with prefixes that
    arrive later, a pause with nothing decoding (the feed is asked to wait), and each sentence is
    handed back when it is done, with the hypotheses of its search alone."""
    model = tiny()
    options = D(beam_size=3, nbest=2, max_len_b=6)
    sources = mixed_sources(16, seed=6)
    rng = random.Random(7)
    prefixes = [[rng.randrange(4, 40) for _ in range(rng.choice([0, 0, 2, 7]))] if i >= 5 else [] for i in range(16)]
    arrivals = [[0, 1], [2], [], [3, 4, 5], [], [], [6, 7, 8, 9, 10, 11], [12], [13, 14, 15]]  # per call of feed
    calls, done = [], {}

    def feed(count, wait):
        calls.append(wait)
        if not arrivals:
            return []
        if wait:  # nothing decodes: what arrives next comes now
            while arrivals and not arrivals[0]:
                arrivals.pop(0)
        now = arrivals.pop(0) if arrivals else []
        if len(now) > count:  # the rest waits for the next call
            now, rest = now[:count], now[count:]
            arrivals.insert(0, rest)
        return [(f"s{i}", sources[i], prefixes[i] or None) for i in now]

    def on_done(key, hyps):
        assert key not in done
        done[key] = hyps

    refill_stream([model], feed, on_done, options, slots=3)
    expected = alone([model], sources, options, prefixes)
    assert sorted(done) == sorted(f"s{i}" for i in range(16))
    assert_same([done[f"s{i}"] for i in range(16)], expected)
    assert calls[0] and calls.count(True) >= 2  # waited at the start and again once all were done


# -- search_lines: refill where it applies ---------------------------------------------------------
class CountingEngine(XfEngine):
    def __init__(self, models):
        super().__init__(models, CPU)
        self.refilled = self.searched = 0

    def refill(self, sentences, options, prefixes=None):
        self.refilled += 1
        return super().refill(sentences, options, prefixes)

    def search(self, *args, **kwargs):
        self.searched += 1
        return super().search(*args, **kwargs)


def lines(engine, sources, **options):
    opts = TranslateOptions(path=("unused",), **options)
    found, _ = search_lines(engine, sources, opts, Stats(), max_tokens=opts.max_tokens or None,
                            max_sentences=None if opts.max_tokens else opts.batch_size)
    return found


def test_search_lines_refills_with_the_same_outputs():
    engine = CountingEngine([tiny()])
    sources = mixed_sources(20, seed=6) + [[]]  # an empty line: no search
    common = dict(beam_size=4, nbest=2, max_len_b=6, batch_size=5)
    batched = lines(engine, sources, **common)
    assert (engine.refilled, engine.searched) == (0, 4)
    refilled = lines(engine, sources, refill=True, **common)
    assert (engine.refilled, engine.searched) == (1, 4)
    assert refilled[-1] is None
    assert_same(refilled[:-1], batched[:-1])


def test_search_lines_falls_back_where_refill_does_not_apply():
    engine = CountingEngine([tiny()])
    sources = mixed_sources(8, seed=7)
    lines(engine, sources, refill=True, max_tokens=40, max_len_b=4)
    lines(engine, sources, refill=True, sampling=True, nbest=2, max_len_b=4)
    assert engine.refilled == 0 and engine.searched > 0
