"""xf serve's glossaries: --glossary DIRECTION=FILE per direction and a request's own ``glossary``
field, applied to each sentence as lexical constraints with the item's own; the answer's
``glossaryTerms``. A glossary's effect is checked against what it stands for: a sentence served with
a glossary term gets the translation that the same sentence gets with the term's forms as its
``constraints``, and a sentence without a term the plain one. In-process over the ASGI interface
with the tests' tiny checkpoint (sentence splitting on, the default), and once through a real
``xf serve`` process (start-up errors, the YAML key)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest

pytest.importorskip("starlette", reason="the serve extra is not installed")

from xformer_cli.settings.config import build_options  # noqa: E402
from xformer_cli.frame import load_command_options
from xformer_cli.base.errors import ConfigError, XfError  # noqa: E402
from xformer_cli.text.glossary import Glossary, find_terms  # noqa: E402
from xformer_cli.settings.options import ServeOptions, TranslateOptions  # noqa: E402
from xformer_cli.serve.batch_queue import Direction  # noqa: E402
from xformer_cli.serve.fields import form_fields  # noqa: E402
from xformer_cli.serve.server import Server  # noqa: E402
from xformer_cli.serve.directions import load_directions, load_glossaries  # noqa: E402

from helpers import REPO, Served, call  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
DECODING = {"max_len_a": 0.5, "max_len_b": 3, "beam_size": 4, "threads": 1, "max_wait_ms": 0}


def glossary_file(tmp_path, text: str, name: str = "terms.tsv") -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


# -- matching over two glossaries, by hand ---------------------------------------------------------
def test_two_glossaries_are_matched_as_one_the_first_winning_a_term(tmp_path):
    server = Glossary.load(glossary_file(tmp_path, "cat\tKatze|Katzen\nmountain bike\tMountainbike\ndog\tHund\n"))
    request = Glossary.from_pairs([["bike", "Rad"], ["Dog", ["Köter", "Töle"]], ["a cat sat", "Sitzkatze"]],
                                  "'glossary'")
    line = "A dog and a cat on a Mountain Bike; a cat sat, a bike, a dog."
    # the longest term at a position, whichever glossary has it; the first glossary's entry on a tie
    assert find_terms(line, [request, server]) == [
        ("dog", ["Köter", "Töle"], 0), ("cat", ["Katze", "Katzen"], 1), ("mountain bike", ["Mountainbike"], 1),
        ("a cat sat", ["Sitzkatze"], 0), ("bike", ["Rad"], 0)]
    # the same as one glossary holding both, the request's entries over the server's
    merged = Glossary.from_pairs([[k, v] for k, v in {**server.entries, **request.entries}.items()], "merged")
    for text in (line, "catalogue of bikes", "DOG dog cat", "a cat sat", "bike mountain bike", ""):
        assert [forms for _, forms, _ in find_terms(text, [request, server])] == merged.constraints(text)
        assert [forms for _, forms, _ in find_terms(text, [server])] == server.constraints(text)


def test_two_glossaries_match_as_their_merged_glossary_on_random_texts():
    import random

    rng = random.Random(0)
    words = ["a", "cat", "Cat", "sat", "mountain", "bike", "dog", "food", "catalogue", "x-ray"]
    phrase = lambda n: " ".join(rng.choice(words) for _ in range(n))  # noqa: E731
    for _ in range(300):
        first, second = ({phrase(rng.randint(1, 3)).lower(): [f"T{rng.randint(0, 99)}"]
                          for _ in range(rng.randint(1, 5))} for _ in range(2))
        glossaries = [Glossary.from_pairs([[k, v] for k, v in g.items()], "g") for g in (first, second)]
        merged = Glossary.from_pairs([[k, v] for k, v in {**second, **first}.items()], "merged")
        text = phrase(rng.randint(0, 12)) + rng.choice(["", ".", "s"])
        found = find_terms(text, glossaries)
        assert [forms for _, forms, _ in found] == merged.constraints(text), (text, first, second)
        assert all((first if g == 0 else second)[key] == forms for key, forms, g in found)


def test_a_request_glossary_is_read_by_the_files_rules():
    glossary = Glossary.from_pairs([["cat", "Katze|Katzen"], [" Mountain bike ", ["Mountainbike", "MTB"]]],
                                   "'glossary'")
    assert glossary.entries == {"cat": ["Katze", "Katzen"], "mountain bike": ["Mountainbike", "MTB"]}
    for pairs, message in [
        ([["cat"]], "'glossary' item 1: expected a \\[source, target\\] pair"),
        (["cat\tKatze"], "item 1: expected a \\[source, target\\] pair"),
        ([["cat", "Katze"], ["dog", 3]], "item 2: the source term must be a string"),
        ([["cat", []]], "item 1: the source term must be a string, the target a string or a non-empty list"),
        ([[" ", "Katze"]], "item 1: an empty source term"),
        ([["cat", "Katze|"]], "item 1: an empty target term"),
        ([["cat", "Katze"], ["CAT", "Mieze"]], "item 2: the source term 'CAT' is given twice"),
        ([["a\nb", "x"]], "item 1: a term holds a line break"),
    ]:
        with pytest.raises(ConfigError, match=message):
            Glossary.from_pairs(pairs, "'glossary'")


# -- the options and the start-up ------------------------------------------------------------------
def test_glossary_options(tmp_path):
    (tmp_path / "xf.yaml").write_text("serve: {model: [en-de=a.pt, de-en=b.pt], glossary: [en-de=terms.tsv]}\n")
    options = load_command_options(ServeOptions, tmp_path / "xf.yaml", {}, section="serve")
    assert options.glossary == ("en-de=terms.tsv",) and options.max_glossary_terms == 500
    assert options.translate_options("a.pt").glossary is None  # the server applies it, not xf translate's reader
    for values, message in (({"glossary": ["en-fr=t.tsv"]}, "no --model serves en-fr"),
                            ({"glossary": ["en-de=t.tsv", "en-de=u.tsv"]}, "direction en-de is given more than once"),
                            ({"glossary": ["t.tsv"]}, "--glossary 't.tsv': expected SOURCE-TARGET=FILE")):
        with pytest.raises(ConfigError, match=message):
            build_options(ServeOptions, {"model": ["en-de=a.pt"], **values}, "test")
    # a glossary for a direction CTranslate2 serves: refused by its plan, before the model loads
    (tmp_path / "a.pt").write_bytes(b"")
    options = build_options(ServeOptions, {"model": [f"en-de={tmp_path / 'a.pt'}"], "glossary": ["en-de=t.tsv"],
                                           "engine": "ctranslate2"}, "test")
    with pytest.raises(ConfigError, match="--glossary en-de=... gives lexical constraints, which need xf's beam "
                                          "search: this runs CTranslate2"):
        load_directions(options, {"en-de": Glossary.from_pairs([["cat", "Katze"]], "test")})


def test_a_bad_glossary_file_names_the_direction_file_and_line(tmp_path):
    bad = glossary_file(tmp_path, "cat\tKatze\n\ndog\n")
    options = build_options(ServeOptions, {"model": ["en-de=a.pt"], "glossary": [f"en-de={bad}"]}, "test")
    with pytest.raises(XfError, match=f"--glossary en-de: {bad}: line 3: expected two tab-separated fields"):
        load_glossaries(options)


# -- the server in-process, with the tiny checkpoint -----------------------------------------------
@pytest.fixture(scope="module")
def served(ckpt, tmp_path_factory):
    """An en-de server whose direction's glossary holds 'man' -> Hund and 'girl' -> Katze|Katzen."""
    terms = glossary_file(tmp_path_factory.mktemp("glossary"), "man\tHund\ngirl\tKatze|Katzen\n")
    options = build_options(ServeOptions, {"model": [f"en-de={ckpt}"], "glossary": [f"en-de={terms}"],
                                           "max_glossary_terms": 3, "max_constraints": 3, "max_constraint_forms": 3,
                                           "max_constraint_subwords": 120, **DECODING}, "test")
    server = Server(load_directions(options, load_glossaries(options)), options, [])
    server.loop = asyncio.new_event_loop()  # one loop for the server's requests, as uvicorn runs it
    server.queue.start()
    yield server
    server.queue.stop()
    server.loop.close()


def ask(server, path="/translate", method="POST", **fields):
    body = json.dumps({"source": "en", "target": "de", **fields}).encode()
    return server.loop.run_until_complete(call(server.app(), path, body, method=method))


def translated(server, q, **fields):
    status, answer = ask(server, q=q, **fields)
    assert status == 200, answer
    return answer


def test_the_directions_glossary_forces_its_term(served):
    answer = translated(served, "A man sleeps.")
    assert "Hund" in answer["translatedText"]
    assert answer["glossaryTerms"] == [{"source": "man", "target": ["Hund"], "from": "server", "inTranslation": True}]
    assert translated(served, "A man sleeps.", glossary=True) == answer == translated(served, "A man sleeps.",
                                                                                       glossary=None)
    # the same as the term's form given as the sentence's constraint, without the glossary
    steered = translated(served, "A man sleeps.", constraints=["Hund"], glossary=False)
    assert answer["translatedText"] == steered["translatedText"] and "glossaryTerms" not in steered
    plain = translated(served, "A man sleeps.", glossary=False)
    assert plain["translatedText"] != answer["translatedText"] and "glossaryTerms" not in plain
    # a text without a term: the plain translation, and an empty report
    assert translated(served, "Two dogs play.") == {**translated(served, "Two dogs play.", glossary=False),
                                                    "glossaryTerms": []}


def test_a_request_glossary_forces_its_term_and_wins_over_the_directions(served):
    answer = translated(served, ["A man sleeps.", "A boy runs."], glossary=[["man", "Fahrrad"], ["boy", "Baum"]])
    first, second = answer["translatedText"]
    assert "Fahrrad" in first and "Hund" not in first and "Baum" in second
    assert answer["glossaryTerms"] == [
        [{"source": "man", "target": ["Fahrrad"], "from": "request", "inTranslation": True}],
        [{"source": "boy", "target": ["Baum"], "from": "request", "inTranslation": True}]]
    # with the item's own constraints: its own first, then the glossary's, both met
    text = "A man sleeps on a bench in the park."
    both = translated(served, text, glossary=[["man", "Fahrrad"]], constraints=["Baum"])
    assert "Fahrrad" in both["translatedText"] and "Baum" in both["translatedText"]
    assert both["translatedText"] == translated(served, text, constraints=["Baum", "Fahrrad"],
                                                glossary=False)["translatedText"]
    # the direction's terms still apply beside the request's, unless server_glossary is false
    mixed = translated(served, "A girl and a man.", glossary=[["man", "Fahrrad"]])
    assert [(t["source"], t["from"]) for t in mixed["glossaryTerms"]] == [("girl", "server"), ("man", "request")]
    own = translated(served, "A girl and a man.", glossary=[["man", "Fahrrad"]], server_glossary=False)
    assert [(t["source"], t["from"]) for t in own["glossaryTerms"]] == [("man", "request")]
    assert own["translatedText"] == translated(served, "A girl and a man.", constraints=["Fahrrad"],
                                               glossary=False)["translatedText"]


def test_a_term_in_the_second_sentence_is_applied_to_that_sentence_only(served):
    paragraph = "Two dogs play.  A boy runs.\nA dog sleeps."
    answer = translated(served, paragraph, glossary=[["boy", "Baum"]])
    first, second, third = (translated(served, s, glossary=False)["translatedText"]
                            for s in ("Two dogs play.", "A boy runs.", "A dog sleeps."))
    steered = translated(served, "A boy runs.", constraints=["Baum"], glossary=False)["translatedText"]
    assert "Baum" in steered and steered != second
    assert answer["translatedText"] == f"{first}  {steered}\n{third}"  # its spacing kept, the others plain
    assert answer["glossaryTerms"] == [{"source": "boy", "target": ["Baum"], "from": "request", "inTranslation": True}]


def test_format_html_with_a_glossary(served):
    page = '<p class="a">A boy in a <b>red</b> shirt.</p><p>Two dogs play.</p>'
    answer = translated(served, page, format="html", glossary=[["boy", "Baum"]])
    out = answer["translatedText"]
    assert out.startswith('<p class="a">') and out.count("<b>") == out.count("</b>") == 1 and "Baum" in out
    plain = translated(served, page, format="html", glossary=False)["translatedText"]
    assert out.split("</p>")[1] == plain.split("</p>")[1]  # the block without the term: as without a glossary
    assert answer["glossaryTerms"] == [{"source": "boy", "target": ["Baum"], "from": "request", "inTranslation": True}]


def test_a_whitespace_only_text_comes_back_as_sent_with_an_empty_report(served):
    assert translated(served, " \n\t") == {"translatedText": " \n\t", "confidence": 1.0, "glossaryTerms": []}
    assert translated(served, ["  ", "A man."], glossary=[["man", "Fahrrad"]])["glossaryTerms"][0] == []


def test_a_term_that_cannot_be_met_is_reported_not_refused(served):
    long_form = " ".join(["Fahrradweg"] * 12)  # more subwords than the sentence's length limit (|X|/2 + 3)
    answer = translated(served, "A boy runs.", glossary=[["boy", long_form]])
    assert answer["translatedText"] == translated(served, "A boy runs.", glossary=False)["translatedText"]
    assert answer["glossaryTerms"] == [{"source": "boy", "target": [long_form], "from": "request",
                                        "inTranslation": False}]


@pytest.mark.parametrize("glossary,status,message", [
    ("boy\tBaum", 400, "'glossary' must be a list of [source, target] pairs"),
    ({"boy": "Baum"}, 400, "'glossary' must be a list of [source, target] pairs"),
    ([["boy"]], 400, "'glossary' item 1: expected a [source, target] pair"),
    ([["boy", "Baum"], ["Boy", "Busch"]], 400, "'glossary' item 2: the source term 'Boy' is given twice"),
    ([["boy", "Baum|"]], 400, "'glossary' item 1: an empty target term"),
    ([["a", "b"], ["c", "d"], ["e", "f"], ["g", "h"]], 413, "'glossary' has 4 pairs, over the limit of 3"),
    ([["boy", "a|b|c|d"]], 413, "'glossary' item 1: 'boy' has 4 target forms, over the limit of 3 "
                                "(--max-constraint-forms)"),
    # the tiny model's sentencepiece has no piece for Cyrillic: it would be forced in as ⁇
    ([["boy", "Baum"], ["man", "Käfer|Жук"]], 400, "'glossary' item 2: the target term 'Жук' of 'man' has characters "
     "the model's vocabulary cannot spell (Ж у к)"),
])
def test_a_bad_request_glossary_is_an_error_naming_the_field(served, glossary, status, message):
    got, answer = ask(served, q="A boy runs.", glossary=glossary)
    assert (got, answer["error"][:len(message)]) == (status, message), answer


@pytest.mark.parametrize("fields,message", [
    (dict(constraints=["Haus", "Baum", "Hund", "Katze"]), "q item 1: 4 lexical constraints (its glossary terms "
     "included), over the limit of 3 a sentence (--max-constraints)"),
    # two of its own and the direction's two terms found in it
    (dict(q="A man and a girl run.", constraints=["Haus", "Baum"]), "q item 1: 4 lexical constraints"),
    (dict(q=["A boy runs.", "A man runs."], constraints=[[], ["Haus", "Baum", ["Hund", "Katze"]]]),
     "q item 2: 4 lexical constraints"),
    (dict(constraints=[["Haus", "Baum", "Hund", "Katze"]]), "q item 1: constraint 1 has 4 forms, over the limit "
     "of 3 (--max-constraint-forms)"),
    (dict(constraints=["Fahrradweg " * 8] * 2), "q item 1: its constraints' forms have 128 subwords together, "
     "over the limit of 120 a sentence (--max-constraint-subwords)"),
])
def test_constraints_over_the_limits_are_a_413_naming_the_item_and_the_limit(served, fields, message):
    got, answer = ask(served, **{"q": "A boy runs.", **fields})
    assert (got, answer["error"][:len(message)]) == (413, message), answer
    assert translated(served, "A boy runs.", constraints=["Haus", "Baum"])  # the server is up, the limits admit 2


def test_an_allocation_that_fails_is_a_500_naming_the_limits_and_the_server_stays_up(served, monkeypatch):
    import xformer_cli.serve.batch_queue as serve_queue

    def fails(*args, **kwargs):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate memory: "
                           "you tried to allocate 4333502464 bytes. Error code 12 (Cannot allocate memory)")

    with monkeypatch.context() as patched:
        patched.setattr(serve_queue, "search_lines", fails)
        got, answer = ask(served, q="A boy runs.")
    assert got == 500 and answer["error"].startswith("out of memory decoding this request's batch ([enforce fail")
    assert "--max-batch-tokens" in answer["error"] and "--max-constraints" in answer["error"]
    assert translated(served, "A boy runs.")["translatedText"]
def test_a_constraint_the_vocabulary_cannot_spell_is_refused(served):
    got, answer = ask(served, q="A boy runs.", constraints=[["Hund", "Hund €"]], glossary=False)
    assert (got, answer["error"]) == (400, "q item 1: the constraint 'Hund €' has characters the model's vocabulary "
                                           "cannot spell (€): they would come out as ⁇")


def test_a_glossary_file_term_the_vocabulary_cannot_spell_names_its_line(ckpt, tmp_path):
    terms = glossary_file(tmp_path, "man\tHund\n\nboy\tBaum|Жук\n")
    options = build_options(ServeOptions, {"model": [f"en-de={ckpt}"], "glossary": [f"en-de={terms}"]}, "test")
    with pytest.raises(XfError) as e:
        load_directions(options, load_glossaries(options))
    assert str(e.value) == (f"--glossary en-de: {terms}: line 3: the target term 'Жук' of 'boy' has characters the "
                            "model's vocabulary cannot spell (Ж у к): they would come out as ⁇")


def test_server_glossary_is_a_boolean(served):
    got, answer = ask(served, q="A boy runs.", server_glossary="no")
    assert (got, answer["error"]) == (400, "'server_glossary' must be true or false, got \"no\"")


def test_settings_say_which_directions_have_a_glossary(served):
    status, settings = ask(served, "/frontend/settings", "GET")
    assert status == 200 and (settings["glossaries"], settings["glossaryLimit"]) == (["en-de"], 3)


def test_a_form_can_turn_the_glossary_off():
    assert form_fields("q=a&glossary=false")["glossary"] is False
    assert form_fields("q=a&glossary=true")["glossary"] is True
    assert form_fields("q=a&glossary=x")["glossary"] == "x"  # then a 400 names the field
    assert form_fields("q=a&server_glossary=false")["server_glossary"] is False


def test_no_glossary_no_report(ckpt):
    options = build_options(ServeOptions, {"model": [f"en-de={ckpt}"], **DECODING}, "test")
    server = Server(load_directions(options), options, [])
    server.loop = asyncio.new_event_loop()
    server.queue.start()
    try:
        assert "glossaryTerms" not in translated(server, "A man sleeps.")
        assert "glossaryTerms" not in translated(server, "A man sleeps.", glossary=[])
    finally:
        server.queue.stop()
        server.loop.close()


def test_a_glossary_needs_xfs_beam_search(served):
    import copy

    from xformer_cli.decode.plan import Machine, plan_decoding

    engine = copy.copy(served.directions["en-de"].engine)  # as opened by a CTranslate2 plan
    engine.plan = plan_decoding(TranslateOptions(path=("x",), engine="ctranslate2"), Machine())
    ct2 = Direction("en", "de", engine, served.directions["en-de"].sp, TranslateOptions(path=("x",), engine="ctranslate2"))
    server = Server([ct2], served.options, [])
    status, answer = asyncio.run(call(server.app(), "/translate", json.dumps(
        {"q": "A boy.", "source": "en", "target": "de", "glossary": [["boy", "Baum"]]}).encode()))
    assert status == 400 and "need xf's beam search" in answer["error"], answer


# -- a real server process -------------------------------------------------------------------------
@pytest.mark.slow
def test_start_up_with_a_glossary_and_its_errors(ckpt, tmp_path):
    def fails(args, message):
        proc = subprocess.run([sys.executable, "-m", "xformer_cli", "serve", "--port", "0", *args], capture_output=True,
                              text=True, cwd=REPO, timeout=120)
        assert proc.returncode != 0 and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and proc.stderr.startswith("xf: error: "), proc.stderr

    bad = glossary_file(tmp_path, "man\tHund\nboy Baum\n", "bad.tsv")
    # the file before the port and the models: a missing model is not what is reported
    fails(["--model", f"en-de={tmp_path / 'missing.pt'}", "--glossary", f"en-de={bad}"],
          f"--glossary en-de: {bad}: line 2: expected two tab-separated fields")
    fails(["--model", f"en-de={ckpt}", "--glossary", f"en-de={tmp_path / 'none.tsv'}"], "cannot read the glossary")
    fails(["--model", f"en-de={ckpt}", "--glossary", f"de-en={bad}"], "no --model serves de-en")
    unfit = glossary_file(tmp_path, "man\tHund\nboy\t" + "Baum " * 600 + "\n", "unfit.tsv")
    fails(["--model", f"en-de={ckpt}", "--glossary", f"en-de={unfit}"],
          f"--glossary en-de: {unfit}: line 2: the target term")

    good = glossary_file(tmp_path, "man\tHund\n", "good.tsv")
    (tmp_path / "xf.yaml").write_text(json.dumps({"serve": {"glossary": [f"en-de={good}"]}}), encoding="utf-8")
    server = Served("--config", str(tmp_path / "xf.yaml"), "--model", f"en-de={ckpt}", "--max-len-a", "0.5",
                    "--max-len-b", "3", "--threads", "1")
    try:
        assert "glossaries en-de" in server.log
        status, _, answer = server.translate("A man sleeps.")
        assert status == 200 and "Hund" in answer["translatedText"], answer
        status, _, answer = server.translate("A man sleeps.", glossary=[["man", 3]])
        assert status == 400 and answer["error"].startswith("'glossary' item 1:")
    finally:
        assert server.stop() == 0


def test_a_served_constraint_must_end_a_word_as_in_xf_translate(served, monkeypatch):
    """The queue gives the search the vocabulary's word boundaries when a batch has constraints
    (``Hund`` is not met inside ``Hunde``), as xf translate does, and none without."""
    import xformer_cli.serve.batch_queue as serve_queue
    from xformer_cli.decode.constraints import word_boundaries

    seen = []
    search = serve_queue.search_lines

    def recording(*args, **kwargs):
        seen.append(kwargs.get("word_starts"))
        return search(*args, **kwargs)

    monkeypatch.setattr(serve_queue, "search_lines", recording)
    translated(served, "A man sleeps.", constraints=["Hund"], glossary=False)
    translated(served, "A man sleeps.", glossary=False)
    assert len(seen) == 2 and seen[1] is None
    assert seen[0] is not None and seen[0].equal(word_boundaries(served.directions["en-de"].sp))
