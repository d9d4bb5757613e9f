"""Steering a translation: target prefixes (forced, then searched), alternatives at the position
after the prefix and hard lexical constraints, in the searches (against exhaustive search and the
unsteered search) and in xf translate --input-format jsonl (the reader's errors name the file and
line)."""

import json
from types import SimpleNamespace

import pytest
import torch

from xformer_cli.decode.plan import Machine, plan_decoding
from xformer_cli.decode.constraints import BatchConstraints
from xformer_cli.decode.engines import XfEngine, collate_prefix
from xformer_cli.base.errors import ConfigError, XfError
from xformer_cli.settings.options import TranslateOptions
from xformer_cli.decode.search import (DecoderState, beam_search, greedy_search, next_token_alternatives, sample,
                                with_prefix_candidates)
from xformer_cli.decode.steering import encode_prefixes, read_steered_line
from xformer_cli.text.vocab import BOS_ID, EOS_ID, PAD_ID

from helpers import D, SOURCES, assert_same, batch, exhaustive, tiny

pytestmark = pytest.mark.usefixtures("one_thread")


def prefixes(*rows):
    return collate_prefix([list(r) for r in rows], torch.device("cpu"))


# -- the searches ----------------------------------------------------------------------------------
@pytest.mark.parametrize("alpha", [0.6, 0.0])
def test_wide_beam_with_a_prefix_equals_exhaustive_search_over_outputs_that_start_with_it(alpha):
    model = tiny(vocab_size=6, seed=3)
    src = batch([4, 5, 4], [5])
    prefix = [[5], [4, 4]]
    found = beam_search([model], src, D(beam_size=12, nbest=3, lenpen=alpha, max_len_a=0, max_len_b=3),
                        prefix=prefixes(*prefix))
    for i in range(src.size(0)):
        every = exhaustive(model, src[i, : (src[i] != PAD_ID).sum()], 3, alpha, "gnmt", nbest=10**6)
        best = [(s, out) for s, out in every if out[: len(prefix[i])] == prefix[i]][:3]
        assert [h.tokens for h in found[i]] == [out for _, out in best]
        assert [h.score for h in found[i]] == pytest.approx([s for s, _ in best], abs=1e-5)


@torch.no_grad()
def test_greedy_with_a_prefix_forces_it_then_takes_the_most_likely_token():
    model = tiny()
    src = batch(*SOURCES)
    prefix = [[20, 21], [], [22], [23, 24, 25]]
    found = greedy_search([model], src, D(max_len_b=6), prefix=prefixes(*prefix))
    for i, hyps in enumerate(found):
        tokens = hyps[0].tokens
        assert tokens[: len(prefix[i])] == prefix[i]
        state = DecoderState([model], src[i : i + 1], use_cache=False)  # the slow reference: full decoding
        for t in range(len(prefix[i]), len(tokens)):
            lprobs = state.log_probs(torch.tensor([[BOS_ID] + tokens[:t]]))[0]
            lprobs[PAD_ID] = lprobs[BOS_ID] = float("-inf")
            if t < max(len(SOURCES[i]) + 6, len(prefix[i])):  # at the limit only eos may follow
                assert int(lprobs.argmax()) == tokens[t]
            assert hyps[0].positional_scores[t] == pytest.approx(float(lprobs[tokens[t]]), abs=1e-4)


def test_batched_prefixes_equal_one_by_one_and_no_prefix_is_the_unsteered_search():
    model = tiny()
    src = batch(*SOURCES)
    prefix = [[20, 21], [], [22], [23, 24, 25]]
    for search, options in ((beam_search, D(beam_size=4, nbest=3, max_len_b=6)), (greedy_search, D(max_len_b=6))):
        together = search([model], src, options, prefix=prefixes(*prefix))
        alone = [search([model], batch(s), options, prefix=prefixes(p) if p else None)[0]
                 for s, p in zip(SOURCES, prefix)]
        assert_same(together, alone)
        assert_same([together[1]], search([model], batch(SOURCES[1]), options))  # the one without a prefix
        for hyps, p in zip(together, prefix):
            assert all(h.tokens[: len(p)] == p for h in hyps)


def test_a_prefix_longer_than_the_limit_raises_the_limit():
    model = tiny()
    found = beam_search([model], batch([5]), D(beam_size=2, nbest=2, max_len_a=0, max_len_b=1),
                        prefix=prefixes([20, 21, 22]))
    for h in found[0]:
        assert h.tokens[:3] == [20, 21, 22] and h.tokens[-1] == EOS_ID and len(h.tokens) <= 4


def test_prefix_with_sampling_ensembles_and_a_shortlist():
    model = tiny()
    src = batch(*SOURCES[:2])
    prefix = prefixes([20, 21], [22])
    gen = torch.Generator().manual_seed(0)
    for hyps, p in zip(sample([model], src, D(sampling=True, nbest=3, max_len_b=5), gen, prefix=prefix), ([20, 21], [22])):
        assert all(h.tokens[: len(p)] == p for h in hyps)
    single = beam_search([model], src, D(beam_size=3, nbest=2, max_len_b=5), prefix=prefix)
    assert_same(beam_search([model, model], src, D(beam_size=3, nbest=2, max_len_b=5), prefix=prefix), single)
    # a shortlist without the prefix tokens: with_prefix_candidates adds them, so they can be forced
    candidates = with_prefix_candidates(torch.tensor([0, 1, 2, 3, 5, 6, 7, 30]), prefix)
    assert candidates.tolist() == [0, 1, 2, 3, 5, 6, 7, 20, 21, 22, 30]
    for hyps, p in zip(beam_search([model], src, D(beam_size=3, max_len_b=5), candidates=candidates, prefix=prefix),
                       ([20, 21], [22])):
        assert hyps[0].tokens[: len(p)] == p and set(hyps[0].tokens) <= set(candidates.tolist())


@torch.no_grad()
def test_alternatives_are_the_most_likely_next_tokens_each_completed():
    model = tiny()
    src = batch(*SOURCES[:3])
    prefix = [[20, 21], [], [22]]
    firsts = next_token_alternatives([model], src, collate_prefix(prefix, torch.device("cpu"), keep_empty=True), 3)
    for i, p in enumerate(prefix):
        state = DecoderState([model], src[i : i + 1], use_cache=False)
        lprobs = state.log_probs(torch.tensor([[BOS_ID] + p]))[0]
        lprobs[PAD_ID] = lprobs[BOS_ID] = float("-inf")
        assert firsts[i] == lprobs.topk(3).indices.tolist()
    engine = XfEngine([model], torch.device("cpu"))
    options = TranslateOptions(path=("x",), beam_size=4, alternatives=3, max_len_b=6)
    found = engine.search([s for s in SOURCES[:3]], options, prefixes=prefix)
    for i, p in enumerate(prefix):
        assert [h.tokens[len(p)] for h in found[i]] == firsts[i]
        for h, first in zip(found[i], firsts[i]):  # each: the search's best with prefix + that token forced
            alone = beam_search([model], batch(SOURCES[i]), D(beam_size=4, max_len_b=6), prefix=prefixes(p + [first]))
            assert_same([[h]], [alone[0][:1]])


def contains(out, phrase):
    return any(out[i : i + len(phrase)] == list(phrase) for i in range(len(out)))


def meets(out, constraints):
    return all(any(contains(out, form) for form in forms) for forms in constraints)


@pytest.mark.parametrize("alpha", [0.6, 0.0])
@pytest.mark.parametrize("constraints", [
    ([[[5, 5]]], [[[4]], [[1]]]),  # a two-token phrase; two constraints
    ([[[4, 1], [5]]], []),  # a disjunctive one (either form); a sentence without, in the same batch
    ([[[1, 4]], [[4, 5]]], [[[5]]]),  # two that may overlap ("1 4 5" meets both)
])
def test_wide_beam_with_constraints_equals_exhaustive_search_over_outputs_that_meet_them(alpha, constraints):
    model = tiny(vocab_size=6, seed=3)
    src = batch([4, 5, 4], [5])
    options = D(beam_size=36, nbest=3, lenpen=alpha, max_len_a=0, max_len_b=3)
    given = BatchConstraints(list(constraints))
    found = beam_search([model], src, options, constraints=given)
    assert given.unmet == []
    for i in range(src.size(0)):
        every = exhaustive(model, src[i, : (src[i] != PAD_ID).sum()], 3, alpha, "gnmt", nbest=10**6)
        best = [(s, out) for s, out in every if meets(out[:-1], constraints[i])][:3]
        assert [h.tokens for h in found[i]] == [out for _, out in best]
        assert [h.score for h in found[i]] == pytest.approx([s for s, _ in best], abs=1e-5)


def test_constraints_are_met_and_sentences_without_keep_their_unconstrained_output():
    model = tiny()
    src = batch(*SOURCES)
    constraints = [[[[20, 21]]], [], [[[22], [23, 24]], [[25]]], []]
    for options in (D(beam_size=4, nbest=3, max_len_b=6), D(beam_size=1, max_len_b=6)):
        found = beam_search([model], src, options, constraints=BatchConstraints(constraints))
        plain = beam_search([model], src, options)
        for i, c in enumerate(constraints):
            if c:
                assert all(meets(h.tokens, c) and h.tokens[-1] == EOS_ID for h in found[i])
            else:
                assert found[i] == plain[i]  # bit for bit, scores included
    # one by one, with an ensemble, with a prefix
    opts = D(beam_size=4, nbest=2, max_len_b=6)
    together = beam_search([model], src, opts, constraints=BatchConstraints(constraints))
    alone = [beam_search([model], batch(s), opts, constraints=BatchConstraints([c]))[0] for s, c in zip(SOURCES, constraints)]
    assert_same(together, alone)
    assert_same(beam_search([model, model], src, opts, constraints=BatchConstraints(constraints)), together)
    steered = beam_search([model], src, opts, prefix=prefixes([20], [], [], [21]), constraints=BatchConstraints(constraints))
    assert all(h.tokens[0] == 20 and meets(h.tokens, constraints[0]) for h in steered[0])
    assert all(h.tokens[0] == 21 for h in steered[3])


def test_constraint_tokens_are_candidates_even_outside_a_shortlist():
    model = tiny()
    src = batch(*SOURCES[:2])
    given = BatchConstraints([[[[25, 26]]], []])
    candidates = torch.unique(torch.cat([torch.tensor([0, 1, 2, 3, 5, 6, 7, 30]), torch.tensor(given.tokens())]))
    found = beam_search([model], src, D(beam_size=3, max_len_b=5), candidates=candidates, constraints=given)
    assert contains(found[0][0].tokens, [25, 26]) and set(found[0][0].tokens) <= set(candidates.tolist())
    assert found[1] == beam_search([model], src, D(beam_size=3, max_len_b=5), candidates=candidates)[1]


def test_a_constraint_that_cannot_fit_gives_the_unconstrained_output_and_is_reported():
    model = tiny()
    src = batch(*SOURCES[:2])
    options = D(beam_size=3, nbest=2, max_len_a=0, max_len_b=2)
    given = BatchConstraints([[[[20, 21, 22]]], [[[20]], [[21]]]])  # 3 tokens in 2; 2 in 2: fits
    found = beam_search([model], src, options, constraints=given)
    assert given.unmet == [0]
    assert found[0] == beam_search([model], src, options)[0]
    assert all(meets(h.tokens, [[[20]], [[21]]]) for h in found[1])
    with pytest.raises(ValueError, match="at least one token"):
        BatchConstraints([[[[]]]])


# -- the jsonl reader ------------------------------------------------------------------------------
def test_steered_lines():
    assert read_steered_line('{"source": "a dog", "prefix": "ein"}', 1, "in.jsonl").prefix == "ein"
    assert read_steered_line('{"source": "a dog"}', 1, "in.jsonl").prefix == ""
    assert read_steered_line("  ", 3, "in.jsonl").source == ""
    assert read_steered_line('{"source": "a", "constraints": ["Hund", ["Katze", "Katzen"]]}', 1, "x").constraints == [
        ["Hund"], ["Katze", "Katzen"]]
    for line, message in [
        ('["a dog"]', "in.jsonl: line 4: expected a JSON object"),
        ('{"source": "a dog", "prefix": 3}', "in.jsonl: line 4: 'prefix' must be a string"),
        ('{"source": "a dog", "prefix": "\\ud800"}', "in.jsonl: line 4: 'prefix' is not valid text"),
        ('{"prefix": "ein"}', "in.jsonl: line 4: no 'source'"),
        ('{"source": "a", "prefx": "ein"}', "in.jsonl: line 4: unknown key 'prefx'"),
        ('{"source": "a", "constraints": "Hund"}', "in.jsonl: line 4: 'constraints' must be a list"),
        ('{"source": "a", "constraints": [""]}', "in.jsonl: line 4: an empty constraint"),
        ('{"source": "a", "constraints": [[]]}', "in.jsonl: line 4: an empty constraint"),
        ('{"source": "a", "constraints": [["Hund", 3]]}', "in.jsonl: line 4: 'constraints' must be a string"),
        ('{"source": "a"', "in.jsonl: line 4: not JSON"),
        ('{"source": "a", "constraints": ' + "[" * 100_000 + "]" * 100_000 + "}",
         "in.jsonl: line 4: nests arrays or objects deeper than 64 levels"),  # was a RecursionError
        ("1" + "0" * 4400, "in.jsonl: line 4: not JSON xf reads: an integer of 4,401 digits"),  # was an AttributeError (test_fuzz)
    ]:
        with pytest.raises(ConfigError, match="^" + message.replace("(", r"\(")):
            read_steered_line(line, 4, "in.jsonl")


def test_translate_jsonl_input_with_prefixes(tmp_path, ckpt):
    from xformer_cli.commands.translate import translate
    from xformer_cli.model.checkpoint import load_ensemble

    _, sp = load_ensemble([ckpt], torch.device("cpu"))
    lines = [{"source": "a man sleeps", "prefix": "ein Hund"}, {"source": "two dogs"}, {"source": "", "prefix": "x"},
             {"source": "a cat", "prefix": ""}]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines), encoding="utf-8")
    (tmp_path / "in.txt").write_text("two dogs\na cat\n", encoding="utf-8")

    def run(name, path, **kw):
        translate(TranslateOptions(path=(str(ckpt),), input=str(tmp_path / path), output=str(tmp_path / name),
                                   quiet=True, device="cpu", max_len_b=8, **kw))
        return (tmp_path / name).read_text(encoding="utf-8").splitlines()

    out = run("out.txt", "in.jsonl", input_format="jsonl")
    plain = run("plain.txt", "in.txt")
    assert len(out) == 4 and out[2] == ""
    assert [out[1], out[3]] == plain  # no prefix: the unsteered translation
    first = json.loads(run("out.jsonl", "in.jsonl", input_format="jsonl", output_format="jsonl")[0])
    pieces = sp.encode("ein Hund", out_type=str)
    assert first["hypotheses"][0]["tokens"][: len(pieces)] == pieces
    alts = run("alts.txt", "in.jsonl", input_format="jsonl", alternatives=2, beam_size=2)
    assert [line.split(" ||| ")[0] for line in alts] == ["0", "0", "1", "1", "2", "2", "3", "3"]
    (tmp_path / "bad.jsonl").write_text('{"source": "a"}\n[1]\n', encoding="utf-8")
    with pytest.raises(ConfigError, match="bad.jsonl: line 2: expected a JSON object"):
        run("bad.txt", "bad.jsonl", input_format="jsonl")
    assert not (tmp_path / "bad.txt").exists()  # nothing half-written


def test_translate_jsonl_input_with_constraints(tmp_path, ckpt):
    from xformer_cli.commands.translate import translate

    lines = [{"source": "a man sleeps", "constraints": ["Hund", ["Katze", "Katzen"]]}, {"source": "two dogs"},
             {"source": "a cat", "prefix": "ein", "constraints": ["Fahrrad"]}]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines), encoding="utf-8")
    (tmp_path / "in.txt").write_text("two dogs\n", encoding="utf-8")

    def run(name, path, **kw):
        kw.setdefault("max_len_b", 8)
        translate(TranslateOptions(path=(str(ckpt),), input=str(tmp_path / path), output=str(tmp_path / name),
                                   quiet=True, device="cpu", **kw))
        return (tmp_path / name).read_text(encoding="utf-8").splitlines()

    out = run("out.txt", "in.jsonl", input_format="jsonl", beam_size=4)
    assert "Hund" in out[0] and ("Katze" in out[0] or "Katzen" in out[0])
    assert out[2].startswith("ein") and "Fahrrad" in out[2]
    assert out[1] == run("plain.txt", "in.txt", beam_size=4)[0]  # no constraints: the unconstrained translation
    alts = run("alts.txt", "in.jsonl", input_format="jsonl", alternatives=2, beam_size=2)
    assert len(alts) == 6 and all("Hund" in line for line in alts if line.startswith("0 |||"))
    with pytest.raises(ConfigError, match="in.jsonl: line 1: 'constraints' gives lexical constraints, which need "
                       "xf's beam search: this runs --sampling"):
        run("bad.txt", "in.jsonl", input_format="jsonl", sampling=True)
    # a constraint longer than a sentence's length limit: translated without it (counted, warned)
    (tmp_path / "long.jsonl").write_text(json.dumps({"source": "a", "constraints": ["Hund " * 5]}) + "\n",
                                         encoding="utf-8")
    (tmp_path / "a.txt").write_text("a\n", encoding="utf-8")
    short = dict(max_len_a=0.0, max_len_b=3)
    assert run("long.txt", "long.jsonl", input_format="jsonl", **short) == run("a.out", "a.txt", **short)


def test_a_prefix_the_vocabulary_cannot_spell_is_refused_naming_its_line(spm_model):
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_proto=spm_model)
    assert encode_prefixes(sp, ["ein", ""], 100, "in.jsonl", 0)[1] == []
    with pytest.raises(ConfigError, match=r"^in.jsonl: line 3: the prefix 'ein Жук' has characters the model's "
                       r"vocabulary cannot spell \(Ж у к\): they would come out as ⁇$"):
        encode_prefixes(sp, ["ein", "", "ein Жук"], 100, "in.jsonl", 0)


def _letters(i: int) -> str:
    """i written in base 26 with the letters a-z."""
    out = ""
    while True:
        i, d = divmod(i, 26)
        out = chr(97 + d) + out
        if not i:
            return out


def test_translate_refuses_a_line_over_the_constraint_limits_naming_it(tmp_path, ckpt):
    from xformer_cli.commands.translate import translate

    def run(record, **kw):
        (tmp_path / "in.jsonl").write_text(json.dumps({"source": "a man"}) + "\n" + json.dumps(record) + "\n",
                                           encoding="utf-8")
        translate(TranslateOptions(path=(str(ckpt),), input=str(tmp_path / "in.jsonl"), input_format="jsonl",
                                   output=str(tmp_path / "out.txt"), quiet=True, device="cpu", **kw))

    def word(i):  # Hunda, Hundb, ...: letters the tiny vocabulary spells (it has no digits)
        return "Hund" + _letters(i)

    many = {"source": "a man", "constraints": [word(i) for i in range(17)]}
    with pytest.raises(ConfigError, match=r"in.jsonl: line 2: 17 lexical constraints \(its glossary terms included\), "
                       r"over the limit of 16 a sentence \(--max-constraints\)"):
        run(many)
    forms = {"source": "a man", "constraints": [[word(i) for i in range(5000)]]}  # once 23.8 GB: now refused
    with pytest.raises(ConfigError, match=r"line 2: constraint 1 has 5,000 forms, over the limit of 8 "
                       r"\(--max-constraint-forms\)"):
        run(forms)
    with pytest.raises(ConfigError, match=r"line 2: its constraints' forms have \d+ subwords together, over the "
                       r"limit of 10 a sentence \(--max-constraint-subwords\)"):
        run({"source": "a man", "constraints": ["Fahrradweg", "Katzenhaus", "Baum"]}, max_constraint_subwords=10)
    assert not (tmp_path / "out.txt").exists()  # nothing written
    glossary = tmp_path / "terms.tsv"
    glossary.write_text("man\tMann\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"line 2: 3 lexical constraints \(its glossary terms included\), over the "
                       r"limit of 2"):  # its own two and the glossary's term
        run({"source": "a man", "constraints": ["Hund", "Katze"]}, glossary=str(glossary), max_constraints=2)
    import xformer_cli.commands.translate as command

    def fails(*args, **kwargs):
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 23800000000 bytes")

    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(command, "translate_buffer", fails)
        with pytest.raises(XfError, match=r"^out of memory while decoding \(DefaultCPUAllocator: can't allocate memory: "
                           r"you tried .*\); lower --max-tokens, or what one line may ask \(--max-constraints"):
            run({"source": "a man"})
    crowded = tmp_path / "crowded.tsv"
    crowded.write_text("dog\tHund\n\nman\t" + "|".join("Mann" + _letters(i) for i in range(9)) + "\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=rf"^{crowded}: line 3: 'man' has 9 target forms, over the limit of 8 "
                       r"\(--max-constraint-forms\)$"):  # the file against the limit before any line
        run({"source": "a dog"}, glossary=str(crowded))
    run(many, max_constraints=17, max_len_b=4)  # a higher limit admits it
    assert len((tmp_path / "out.txt").read_text(encoding="utf-8").splitlines()) == 2


# -- xf serve --------------------------------------------------------------------------------------
def test_serve_steering_fields():
    from xformer_cli.serve.fields import HttpError
    from xformer_cli.serve.translation import steering_fields

    options = SimpleNamespace(plan=plan_decoding(TranslateOptions(path=("x",)), Machine()))  # an engine
    assert steering_fields({"q": "a"}, 1, False, "text", options) is None
    assert steering_fields({"prefix": "ein", "constraints": ["Hund", ["Katze", "Katzen"]]}, 1, False, "text",
                           options) == [("ein", [["Hund"], ["Katze", "Katzen"]])]
    assert steering_fields({"prefix": ["ein", ""]}, 2, True, "text", options) == [("ein", []), ("", [])]
    for payload, count, as_list, fmt, opts, message in [
        ({"prefix": "ein"}, 2, True, "text", options, "one entry per item"),
        ({"constraints": [["Hund"]]}, 2, True, "text", options, "one entry per item"),
        ({"constraints": [""]}, 1, False, "text", options, "q item 1: an empty constraint"),
        ({"prefix": 3}, 1, False, "text", options, "q item 1: 'prefix' must be a string"),
        ({"prefix": "ein"}, 1, False, "html", options, "format 'text' only"),
        ({"constraints": ["Hund"]}, 1, False, "text",
         SimpleNamespace(plan=plan_decoding(TranslateOptions(path=("x",), sampling=True), Machine())), "sampling"),
    ]:
        with pytest.raises(HttpError, match=message):
            steering_fields(payload, count, as_list, fmt, opts)


@pytest.mark.slow
def test_serve_prefix_and_constraints(ckpt, tmp_path):
    pytest.importorskip("starlette", reason="the serve extra is not installed")
    from helpers import DECODING, Served

    server = Served("--model", f"en-de={ckpt}", *DECODING)
    try:
        status, _, answer = server.translate(["a man sleeps", "two dogs"], prefix=["ein", ""],
                                             constraints=[["Hund"], []])
        assert status == 200, answer
        first, second = answer["translatedText"]
        assert first.startswith("ein") and "Hund" in first
        assert second == server.translate("two dogs")[2]["translatedText"]  # unsteered
        status, _, answer = server.translate("A man sleeps. A dog runs.", constraints=["Hund"])
        assert status == 400 and "constraints apply to one sentence" in answer["error"]
        status, _, answer = server.translate("A man sleeps. A dog runs.", prefix="ein")
        assert status == 200 and answer["translatedText"].startswith("ein")
    finally:
        server.stop()


def test_translate_with_a_glossary(tmp_path, ckpt):
    from xformer_cli.commands.translate import translate

    (tmp_path / "terms.tsv").write_text("man\tHund\nsleeps\tKatze|Katzen\n", encoding="utf-8")
    (tmp_path / "in.txt").write_text("a man sleeps\ntwo dogs\n", encoding="utf-8")
    (tmp_path / "in.jsonl").write_text(json.dumps({"source": "a man runs", "constraints": ["Fahrrad"]}) + "\n",
                                       encoding="utf-8")

    def run(name, path, **kw):
        translate(TranslateOptions(path=(str(ckpt),), input=str(tmp_path / path), output=str(tmp_path / name),
                                   quiet=True, device="cpu", max_len_b=8, beam_size=4, **kw))
        return (tmp_path / name).read_text(encoding="utf-8").splitlines()

    out = run("out.txt", "in.txt", glossary=str(tmp_path / "terms.tsv"))
    assert "Hund" in out[0] and "Katze" in out[0]
    assert out[1] == run("plain.txt", "in.txt")[1]  # no term found: the unconstrained translation
    steered = run("out2.txt", "in.jsonl", input_format="jsonl", glossary=str(tmp_path / "terms.tsv"))
    assert "Hund" in steered[0] and "Fahrrad" in steered[0]  # the line's own and the glossary's
    with pytest.raises(ConfigError, match="--glossary gives lexical constraints, which need xf's beam search"):
        plan_decoding(TranslateOptions(path=("x",), glossary="terms.tsv", sampling=True), Machine())


def test_a_target_form_the_vocabulary_cannot_spell_is_refused(tmp_path, ckpt):
    """Regression: a glossary term or a constraint with characters the model's sentencepiece has no
    piece for was forced into the translation as ⁇. Refused before anything is written: a
    glossary's naming its file and line, a constraint's its input line."""
    from typer.testing import CliRunner

    from xformer_cli.cli import app

    (tmp_path / "terms.tsv").write_text("man\tHund\n\ndog\tKäfer|Жук\n", encoding="utf-8")
    (tmp_path / "in.txt").write_text("a man sleeps\na cat runs\n", encoding="utf-8")
    (tmp_path / "in.jsonl").write_text(json.dumps({"source": "a man"}) + "\n" + json.dumps(
        {"source": "a dog", "constraints": ["Hund", ["Katze", "Hund €"]]}) + "\n", encoding="utf-8")
    cannot = "has characters the model's vocabulary cannot spell"
    for args, message in [
        (["--input", tmp_path / "in.txt", "--glossary", tmp_path / "terms.tsv"],
         f"{tmp_path / 'terms.tsv'}: line 3: the target term 'Жук' of 'dog' {cannot} (Ж у к): they would come out "
         "as ⁇"),
        (["--input", tmp_path / "in.jsonl", "--input-format", "jsonl"],
         f"{tmp_path / 'in.jsonl'}: line 2: the constraint 'Hund €' {cannot} (€): they would come out as ⁇"),
    ]:
        result = CliRunner().invoke(app, ["translate", "--path", ckpt, *map(str, args), "--output",
                                          str(tmp_path / "out.txt"), "--quiet", "--max-len-b", "8"])
        assert result.exit_code == 2 and result.output == f"xf: error: {message}\n", result.output
        assert not (tmp_path / "out.txt").exists()  # nothing half-written


@pytest.mark.slow
@pytest.mark.kernels
def test_constraints_through_the_compiled_step_equal_eager(tmp_path):
    """A constrained batch runs the step compiled ahead of time (inductor's code) too: the eager
    search's hypotheses, and every sentence has one (capped at AVX2 too: tests/test_cpu_kinds.py)."""
    from xformer_cli.base import compiling
    from xformer_cli.decode.decoder_step import AotStep

    model = tiny()
    src = batch(*SOURCES)
    constraints = [[[[20, 21]]], [], [[[22], [23, 24]], [[25]]], []]
    options = D(beam_size=4, nbest=2, max_len_b=6)
    step = AotStep(compiling.AotPackages(tmp_path / "aot"))
    compiled = beam_search([model], src, options, decoder_step=step, constraints=BatchConstraints(constraints))
    assert_same(compiled, beam_search([model], src, options, constraints=BatchConstraints(constraints)))
    assert step.graphs == 1  # it ran compiled
    assert all(compiled), "every sentence has a translation"


def test_sentences_without_constraints_in_a_constrained_batch_get_the_plain_output_with_ties_and_wide_rows():
    """The plain search takes its 2k best with the grouped top-k (``selection.top_candidates``,
    used only for wide rows: k x V >= 1,024 here), whose choice among equal scores is its own: the
    constrained search takes them with the same top-k, so an unconstrained sentence of a
    constrained batch gets the plain output bit for bit even where scores tie (output rows
    duplicated in pairs: every token's score has a twin), with a shortlist too."""
    model = tiny(vocab_size=600, seed=4)
    with torch.no_grad():
        weight = model.output_proj.weight
        weight[5::2] = weight[4:-1:2]  # token 2j+1 scores exactly as token 2j: ties everywhere
    sources = ([5, 6, 7, 8, 9, 10], [11, 12], [13, 14, 15, 16], [17], [40, 41, 42])
    src = batch(*sources)
    constraints = [[[[20, 21]]], [], [[[22], [23, 24]], [[25]]], [], []]
    shortlist = torch.unique(torch.cat([torch.arange(4), torch.arange(4, 600, 2), torch.arange(5, 400, 2),
                                        torch.tensor(BatchConstraints(constraints).tokens())]))
    for options in (D(beam_size=4, nbest=4, max_len_b=6), D(beam_size=5, nbest=2, max_len_b=4)):
        for candidates in (None, shortlist):
            found = beam_search([model], src, options, candidates=candidates, constraints=BatchConstraints(constraints))
            plain = beam_search([model], src, options, candidates=candidates)
            for i in (1, 3, 4):
                assert found[i] == plain[i], (options, candidates is not None, i)  # tokens and scores, bit for bit
