"""Search: the length penalty and filters by hand, beam search against exhaustive search, and the
invariants (beam 1 = greedy, batched = one by one, cached = full prefix, ensembles)."""


import pytest
import torch
import torch.nn.functional as F


from xformer_cli.text.vocab import PAD_ID, BOS_ID, EOS_ID
from xformer_cli.decode.search import (
    DecoderState,
    beam_search,
    ensemble_log_probs,
    fairseq_length_penalty,
    gnmt_length_penalty,
    greedy_search,
    length_penalty,
    max_output_lengths,
    rescore,
    sample,
    top_k_top_p_filter,
)
from xformer_cli.decode.selection import top_candidates

from helpers import D, SOURCES, assert_same, batch, exhaustive, tiny


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: tiny tensors gain nothing from threads


# -- the math, by hand -----------------------------------------------------------------------------
def test_gnmt_length_penalty_by_hand():
    assert gnmt_length_penalty(1, 0.6) == 1.0  # ((5+1)/6)^a
    assert gnmt_length_penalty(7, 0.6) == pytest.approx(2**0.6)  # (12/6)^0.6 = 1.5157
    assert gnmt_length_penalty(7, 0.6) == pytest.approx(1.515716566510398)
    assert gnmt_length_penalty(25, 1.0) == pytest.approx(5.0)
    assert gnmt_length_penalty(13, 0.0) == 1.0
    t = gnmt_length_penalty(torch.tensor([1.0, 7.0]), 0.6)
    assert t.tolist() == pytest.approx([1.0, 1.515716566510398])


def test_fairseq_length_penalty_by_hand():
    assert fairseq_length_penalty(4, 0.5) == pytest.approx(2.0)
    assert fairseq_length_penalty(9, 1.0) == 9.0
    assert length_penalty(4, 0.5, "length") == pytest.approx(2.0)
    with pytest.raises(ValueError):
        length_penalty(4, 0.5, "other")


def test_max_output_lengths():
    lengths = torch.tensor([3, 10, 2000])
    assert max_output_lengths(lengths, 1.0, 50, 1024).tolist() == [53, 60, 1023]  # the paper's |X|+50
    assert max_output_lengths(lengths, 1.5, 2, 1024).tolist() == [6, 17, 1023]  # floor(1.5*3+2)
    assert max_output_lengths(lengths, 0.0, 0, 1024).tolist() == [0, 0, 0]


def test_ensemble_log_probs_average_probabilities():
    p1, p2 = torch.tensor([[0.5, 0.5]]), torch.tensor([[0.9, 0.1]])
    out = ensemble_log_probs([p1.log(), p2.log()])
    assert out.exp().tolist()[0] == pytest.approx([0.7, 0.3])  # not exp(mean log p)
    assert torch.equal(ensemble_log_probs([p1.log()]), p1.log())


@pytest.mark.parametrize("rows, width, n", [(64, 4 * 704, 8), (5, 4 * 8000, 8), (3, 4 * 1501, 8), (7, 7919, 4),
                                            (2, 1024, 8), (4, 52, 8), (1, 4 * 3000, 2)])
def test_top_candidates_is_topk(rows, width, n):
    """The grouped top-k (a top-k of group maxima, then of the chosen groups) gives torch.topk's
    values and, with distinct values, its indices: for widths with many divisors (grouped), a
    prime one and narrow ones (plain top-k)."""
    g = torch.Generator().manual_seed(width)
    x = torch.randn(rows, width, generator=g)
    x[0, :: max(1, width // 5)] = float("-inf")  # forbidden tokens: -inf, never among the top
    values, indices = top_candidates(x, n)
    expected = x.topk(n, dim=1)
    assert torch.equal(values, expected.values) and torch.equal(indices, expected.indices)


def test_top_candidates_with_ties_gives_the_top_values_at_distinct_indices():
    """Ties (a model's equal log-probs, -inf rows beyond the live ones): the same values, each
    at an index that holds it, no index twice."""
    x = torch.randint(0, 3, (6, 4 * 704)).float()
    x[1] = float("-inf")
    x[1, 17] = 0.0
    values, indices = top_candidates(x, 8)
    assert torch.equal(values, x.topk(8, dim=1).values)
    assert torch.equal(x.gather(1, indices), values)
    assert all(len(set(row)) == 8 for row in indices.tolist())


def test_top_k_top_p_filter_by_hand():
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    kept = lambda out: torch.isfinite(out[0]).tolist()  # noqa: E731
    assert kept(top_k_top_p_filter(logits, top_k=2)) == [True, True, False, False]
    assert kept(top_k_top_p_filter(logits, top_p=0.7)) == [True, True, False, False]  # 0.5 < 0.7 <= 0.8
    assert kept(top_k_top_p_filter(logits, top_p=0.81)) == [True, True, True, False]
    assert kept(top_k_top_p_filter(logits, top_p=0.3)) == [True, False, False, False]  # the best survives
    assert kept(top_k_top_p_filter(logits)) == [True] * 4
    shuffled = logits[:, [2, 0, 3, 1]]  # the filter follows probabilities, not positions
    assert kept(top_k_top_p_filter(shuffled, top_p=0.7)) == [False, True, False, True]


@pytest.mark.parametrize("alpha,style", [(0.6, "gnmt"), (1.0, "length"), (0.0, "gnmt"), (-0.5, "gnmt")])
@pytest.mark.parametrize("max_len,beam", [(1, 6), (2, 12), (3, 36)])
def test_wide_beam_equals_exhaustive_search(max_len, beam, alpha, style):
    # Vocabulary of 6: pad unk bos eos + 2 words, so 3 tokens can continue a hypothesis and 4 can
    # follow it. A beam of 4 * 3^(max_len-1) keeps every prefix and sees every eos; at max_len 1
    # that is a beam as wide as the vocabulary (6).
    model = tiny(vocab_size=6, seed=3)
    src = batch([4, 5, 4], [5])
    found = beam_search([model], src, D(beam_size=beam, nbest=3, lenpen=alpha, lenpen_style=style,
                                        max_len_a=0, max_len_b=max_len))
    for i in range(src.size(0)):
        best = exhaustive(model, src[i, : (src[i] != PAD_ID).sum()], max_len, alpha, style, nbest=3)
        assert [h.tokens for h in found[i]] == [out for _, out in best]
        assert [h.score for h in found[i]] == pytest.approx([s for s, _ in best], abs=1e-5)


def marian_beam(model, src_row, k, alpha, max_len):
    """Marian's beam (its beam_search.cpp) for one sentence, by hand and by full decoding: the
    extensions of the live hypotheses ranked together and the first (live count) taken, those
    ending in eos finished and the rest live, until none is; after max_len tokens the live end as
    they are, their score / |Y| without an eos (Marian's bound). The finished, best first by
    score / |Y|^alpha."""
    live, finished = [([], 0.0)], []
    with torch.no_grad():
        for step in range(max_len + 1):
            if step == max_len:
                finished += [(logp / len(tokens) ** alpha, tokens + [EOS_ID]) for tokens, logp in live]
                break
            extensions = []
            for tokens, logp in live:
                prev = torch.tensor([[BOS_ID] + tokens])
                lprobs = F.log_softmax(model(src_row[None], prev).float(), dim=-1)[0, -1]
                for t in range(model.cfg.vocab_size):
                    if t not in (PAD_ID, BOS_ID):
                        extensions.append((logp + lprobs[t].item(), tokens + [t]))
            extensions.sort(key=lambda e: -e[0])
            taken = extensions[: len(live) if step > 0 else k]
            finished += [(logp / len(out) ** alpha, out) for logp, out in taken if out[-1] == EOS_ID]
            live = [(out, logp) for logp, out in taken if out[-1] != EOS_ID]
            if not live:
                break
    return sorted(finished, key=lambda f: -f[0])


def test_marians_beam_rule_is_marians_beam():
    """--beam-rule marian against Marian's beam written out by hand, and the rule changes outputs
    (a search that ignored it would fail here: the fairseq rule differs on some sentences), its
    bound included (some sentences end there)."""
    sources = [[5, 6, 7, 8], [9, 10], [11, 12, 13, 14, 15, 16], [17, 18, 19], [20], [21, 22, 23, 24, 25]]
    differs = cut = 0
    for seed, k, alpha in [(1, 4, 1.0), (2, 3, 1.5), (4, 4, 0.6)]:
        model = tiny(vocab_size=30, seed=seed)
        options = dict(beam_size=k, nbest=1, lenpen=alpha, lenpen_style="length", max_len_a=1.0, max_len_b=3)
        src = batch(*sources)
        marian = beam_search([model], src, D(beam_rule="marian", **options))
        fairseq = beam_search([model], src, D(**options))
        for i, source in enumerate(sources):
            by_hand = marian_beam(model, src[i, : len(source) + 1], k, alpha, len(source) + 3)
            assert marian[i][0].tokens == by_hand[0][1], (seed, i)
            assert marian[i][0].score == pytest.approx(by_hand[0][0], abs=1e-4)
            differs += marian[i][0].tokens != fairseq[i][0].tokens
            cut += marian[i][0].cut
            assert marian[i][0].cut == (len(marian[i][0].tokens) == len(source) + 4)  # max_len subwords, no eos
    assert differs > 0 and cut > 0, (differs, cut)


def test_one_marian_search_reranked_is_a_search_with_each_lenpen():
    """xf average-checkpoints --choose-on-valid searches once with lenpen 0 and reranks: with
    Marian's rule too, a line cut at its bound counted without its eos."""
    sources = [[5, 6, 7, 8], [9, 10], [11, 12, 13, 14, 15, 16], [17, 18, 19], [20], [21, 22, 23, 24, 25]]
    model, src = tiny(vocab_size=30, seed=1), batch(*sources)
    options = dict(beam_size=4, lenpen_style="length", max_len_a=1.0, max_len_b=3, beam_rule="marian")
    once = beam_search([model], src, D(lenpen=0.0, **options), all_finished=True)
    assert any(h.cut for hyps in once for h in hyps)
    for alpha in (0.6, 1.0, 2.0):
        direct = beam_search([model], src, D(lenpen=alpha, nbest=4, **options))
        for i in range(len(sources)):
            reranked = rescore(once[i], alpha, "length")
            assert reranked[0].tokens == direct[i][0].tokens, (alpha, i)
            assert reranked[0].score == pytest.approx(direct[i][0].score, abs=1e-5)


def test_marians_beam_rule_is_a_plain_beam_search():
    from xformer_cli.base.errors import XfError
    from xformer_cli.decode.constraints import BatchConstraints

    model = tiny()
    with pytest.raises(XfError, match="--beam-rule marian is a plain beam search"):
        beam_search([model], batch([5, 6]), D(beam_rule="marian"), constraints=BatchConstraints([[[[7]]]]))


# -- invariants ------------------------------------------------------------------------------------
def test_beam_one_equals_greedy():
    model = tiny()
    src = batch(*SOURCES)
    for lenpen in (0.6, 0.0):
        beam = beam_search([model], src, D(beam_size=1, lenpen=lenpen, max_len_a=1.0, max_len_b=3))
        greedy = greedy_search([model], src, D(lenpen=lenpen, max_len_a=1.0, max_len_b=3))
        assert_same(beam, greedy)


def test_batched_equals_one_by_one():
    model = tiny()
    together = beam_search([model], batch(*SOURCES), D(beam_size=4, nbest=3, max_len_b=6))
    alone = [beam_search([model], batch(s), D(beam_size=4, nbest=3, max_len_b=6))[0] for s in SOURCES]
    assert_same(together, alone)
    together = greedy_search([model], batch(*SOURCES), D(max_len_b=6))
    alone = [greedy_search([model], batch(s), D(max_len_b=6))[0] for s in SOURCES]
    assert_same(together, alone)


def test_cached_decoding_equals_full_prefix_decoding():
    for positions in ("sinusoidal", "rope"):
        model = tiny(positions=positions)
        src = batch(*SOURCES)
        cached = beam_search([model], src, D(beam_size=4, nbest=2, max_len_b=6))
        full = beam_search([model], src, D(beam_size=4, nbest=2, max_len_b=6), use_cache=False)
        assert_same(cached, full)
        assert_same(greedy_search([model], src, D(max_len_b=6)), greedy_search([model], src, D(max_len_b=6), use_cache=False))


def test_ensemble_of_one_model_equals_that_model():
    model = tiny()
    src = batch(*SOURCES)
    single = beam_search([model], src, D(beam_size=4, nbest=2, max_len_b=5))
    assert_same(beam_search([model, model], src, D(beam_size=4, nbest=2, max_len_b=5)), single)


def test_ensemble_averages_probabilities():
    a, b = tiny(seed=1), tiny(seed=2)
    src = batch(*SOURCES[:2])
    prefix = torch.tensor([[BOS_ID, 7, 8], [BOS_ID, 9, 9]])
    with torch.no_grad():
        pa = F.softmax(a(src, prefix)[:, -1], dim=-1)
        pb = F.softmax(b(src, prefix)[:, -1], dim=-1)
        state = DecoderState([a, b], src, use_cache=False)
        got = state.log_probs(prefix)
    assert torch.allclose(got.exp(), (pa + pb) / 2, atol=1e-6)


def test_hypotheses_are_consistent():
    model = tiny()
    src = batch(*SOURCES)
    max_len = max_output_lengths(src.ne(PAD_ID).sum(1) - 1, 1.0, 3, model.cfg.max_positions)
    for hyps, limit in zip(beam_search([model], src, D(beam_size=5, nbest=5, max_len_b=3)), max_len.tolist()):
        assert len(hyps) == 5
        assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
        assert len({tuple(h.tokens) for h in hyps}) == 5
        for h in hyps:
            assert h.tokens[-1] == EOS_ID and EOS_ID not in h.tokens[:-1]
            assert not {PAD_ID, BOS_ID} & set(h.tokens)
            assert len(h.tokens) <= limit + 1 and len(h.positional_scores) == len(h.tokens)
            assert h.score == pytest.approx(sum(h.positional_scores) / gnmt_length_penalty(len(h.tokens), 0.6), abs=1e-5)


def test_nbest_larger_than_beam_is_refused():
    with pytest.raises(ValueError, match="nbest"):
        beam_search([tiny()], batch([5]), D(beam_size=2, nbest=3))


def test_training_mode_is_refused():
    with pytest.raises(ValueError, match="eval"):
        greedy_search([tiny().train()], batch([5]))


def _count_decoder_rows(model):
    rows = []
    decode = model.decode

    def spy(prev_output, *args, **kwargs):
        rows.append(prev_output.size(0))
        return decode(prev_output, *args, **kwargs)

    model.decode = spy
    return rows


def test_finished_sentences_leave_the_batch():
    model = tiny()
    rows = _count_decoder_rows(model)
    # max length a*|X|: the 1-word sentence stops after 1 token, the 6-word one after 6.
    beam_search([model], batch(*SOURCES), D(beam_size=3, max_len_a=1.0, max_len_b=0))
    # step 0: one row per sentence; then 3 beams each; a sentence leaves after its forced eos.
    assert rows == [4, 4 * 3, 3 * 3, 2 * 3, 2 * 3, 3, 3]


def test_search_stops_when_the_best_cannot_be_beaten():
    model = tiny()
    rows = _count_decoder_rows(model)
    decode = model.decode

    def likes_eos(*args, **kwargs):  # eos 8 nats more likely than anything else
        logits = decode(*args, **kwargs).clone()
        logits[..., EOS_ID] += 8.0
        return logits

    model.decode = likes_eos
    hyps = beam_search([model], batch([5, 6, 7]), D(beam_size=4, max_len_b=50))
    assert hyps[0][0].tokens == [EOS_ID]
    assert len(rows) <= 3  # far from the 53 steps allowed


def test_sampling():
    model = tiny()
    src = batch(*SOURCES)
    draw = lambda seed, **kw: sample([model], src, D(sampling=True, max_len_b=6, **kw), torch.Generator().manual_seed(seed))  # noqa: E731
    first, again = draw(1, nbest=3), draw(1, nbest=3)
    assert_same(first, again)
    assert [len(h) for h in first] == [3] * len(SOURCES)
    assert [h.tokens for hs in draw(2, nbest=3) for h in hs] != [h.tokens for hs in first for h in hs]
    # top-k 1 leaves no choice: greedy
    greedy = greedy_search([model], src, D(max_len_b=6))
    assert_same(draw(3, top_k=1), greedy)
    assert_same(draw(4, top_p=1e-6), greedy)
    with pytest.raises(ValueError):
        draw(1, temperature=0.0)
