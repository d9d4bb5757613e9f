"""xf serve over one multilingual model: several directions of one checkpoint from one copy in
memory (one engine opened, its batches shared), each direction's sources tagged with its target
(languages.vocabulary_for), its answers equal to searching the tagged source directly; /languages
lists them; a direction not served is LibreTranslate's 400; the refusals at start are one line.
The models are random and tiny (helpers.multilingual_checkpoint: pairs en-de, en-fr)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest

pytest.importorskip("starlette", reason="the serve extra is not installed")
pytest.importorskip("uvicorn", reason="the serve extra is not installed")

from helpers import REPO, FakeEngine, FakeSp, call, multilingual_checkpoint  # noqa: E402
from xformer_cli.serve import directions as serve_directions  # noqa: E402
from xformer_cli.model.checkpoint import load_checkpoint, save_checkpoint  # noqa: E402
from xformer_cli.settings.config import build_options  # noqa: E402
from xformer_cli.base.errors import ConfigError, XfError  # noqa: E402
from xformer_cli.text.languages import TaggedVocabulary, tag, vocabulary_for  # noqa: E402
from xformer_cli.settings.options import ServeOptions, TranslateOptions, model_spec  # noqa: E402
from xformer_cli.serve.batch_queue import BatchQueue, Direction, Job, word_alignments  # noqa: E402
from xformer_cli.model.facts import from_export  # noqa: E402
from xformer_cli.serve.server import Server  # noqa: E402
from xformer_cli.serve.directions import load_directions, load_glossaries, model_directions  # noqa: E402
from xformer_cli.decode.translate import Stats, encode_lines, hypothesis_texts, search_lines  # noqa: E402
from xformer_cli.text.vocab import load_sentencepiece  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py: torch on one thread
DECODING = {"max_len_a": 0.5, "max_len_b": 3, "beam_size": 4, "nbest": 2, "threads": 1, "max_wait_ms": 0,
            "split_sentences": False}
MULTI = {"pairs": ["en-de", "en-fr"], "source_lang": "src", "target_lang": "tgt"}


# -- which directions a --model serves -------------------------------------------------------------
def test_model_spec_reads_one_direction_several_or_none():
    assert model_spec("en-de=avg.pt") == ([("en", "de")], "avg.pt")
    assert model_spec("en-de, en-fr=multi.pt") == ([("en", "de"), ("en", "fr")], "multi.pt")
    assert model_spec("multi.pt") == (None, "multi.pt")
    assert model_spec("eng-deu=avg.pt") == ([("eng", "deu")], "avg.pt")
    for spec, message in (("en-de,en-de=m.pt", "direction en-de is given twice"),
                          ("en-de,fr=m.pt", "expected SOURCE-TARGET=CHECKPOINT"),
                          ("", "expected SOURCE-TARGET=CHECKPOINT"),
                          ("en-en=m.pt", "the source and the target are both 'en'")):
        with pytest.raises(ValueError, match=message):
            model_spec(spec)


@pytest.mark.parametrize("listed, meta, served", [
    (None, MULTI, [("en", "de", True), ("en", "fr", True)]),  # every pair the meta records
    ([("en", "fr")], MULTI, [("en", "fr", True)]),
    # a source of the model into a target of the model it was not trained on: zero-shot, when listed
    ([("fr", "de")], {"pairs": ["en-de", "fr-en"]}, [("fr", "de", False)]),
    ([("xx", "de")], {}, [("xx", "de", True)]),  # bilingual recording no languages: the user's codes
    ([("en", "de")], {"source_lang": "en", "target_lang": "de"}, [("en", "de", True)]),  # a listed one confirms it
    (None, {"source_lang": "en", "target_lang": "de"}, [("en", "de", True)]),
    # ISO 639-3 names a language as 639-1 does; the direction is served under the model's codes
    ([("eng", "deu")], {"source_lang": "en", "target_lang": "de"}, [("en", "de", True)]),
    ([("eng", "fra")], MULTI, [("en", "fr", True)]),
    ([("en", "deu")], {"pairs": ["en-de", "fr-en"]}, [("en", "de", True)]),
])
def test_model_directions(listed, meta, served):
    assert model_directions(listed, from_export({"languages": meta}, "m.pt"), "m.pt") == served


@pytest.mark.parametrize("listed, meta, message", [
    ([("de", "fr")], MULTI, "--model m.pt: the model translates en-de, en-fr, not de-fr \\(from en into de, fr\\)"),
    ([("en", "es")], MULTI, "translates en-de, en-fr, not en-es"),
    ([("en", "de"), ("en", "fr")], {"source_lang": "en", "target_lang": "de"}, "a bilingual model translates one "
                                                                               "direction, not en-de, en-fr"),
    (None, {}, "the checkpoint does not record its languages: name its direction, e.g. en-de=m.pt"),
    # a bilingual model named for a direction it does not translate (German served as French)
    ([("en", "fr")], {"source_lang": "en", "target_lang": "de"}, "--model m.pt: the model translates en-de, not "
                                                                 "en-fr \\(its recorded languages\\)"),
])
def test_model_directions_refused(listed, meta, message):
    with pytest.raises(XfError, match=message):
        model_directions(listed, from_export({"languages": meta}, "m.pt"), "m.pt")


def test_options_refuse_a_direction_twice_across_models_and_defer_what_the_meta_decides():
    with pytest.raises(ConfigError, match="--model: direction en-de is given more than once"):
        build_options(ServeOptions, {"model": ["en-de=a.pt", "en-de,en-fr=m.pt"]}, "test")
    with pytest.raises(ConfigError, match="--glossary en-es=...: no --model serves en-es"):
        build_options(ServeOptions, {"model": ["en-de,en-fr=m.pt"], "glossary": ["en-es=t.tsv"]}, "test")
    # a model named without its directions: its meta says them, read at start (load_directions)
    options = build_options(ServeOptions, {"model": ["m.pt"], "glossary": ["en-fr=t.tsv"]}, "test")
    assert options.model == ("m.pt",)


# -- one engine, one queue: the directions of one model batched together ----------------------------
def test_directions_of_one_engine_share_its_batches():
    engine, other = FakeEngine(), FakeEngine()
    de, fr = (Direction("en", t, engine, FakeSp(), TranslateOptions(path=("m",))) for t in ("de", "fr"))
    es = Direction("en", "es", other, FakeSp(), TranslateOptions(path=("b",)))
    queue = BatchQueue(max_batch_tokens=100, max_wait_ms=200, max_queue_lines=100)
    jobs = [Job(de, [[5, 6]]), Job(es, [[7]]), Job(fr, [[8, 9, 10]])]
    for job in jobs:
        queue.submit(job)
    queue.start()
    results = [job.future.result(5) for job in jobs]
    queue.stop()
    assert results == [[["6 5"]], [["7"]], [["10 9 8"]]]
    assert engine.batches == [[[8, 9, 10], [5, 6]]] and other.batches == [[[7]]]  # de and fr: one search


# -- a multilingual model served in-process -----------------------------------------------------------
@pytest.fixture(scope="module")
def multi(multi30k_dir, tmp_path_factory) -> str:
    return multilingual_checkpoint(tmp_path_factory.mktemp("multi") / "multi.pt", multi30k_dir)


@pytest.fixture(scope="module")
def lines(multi30k_dir) -> list[str]:
    return (multi30k_dir / "test2016.en").read_text(encoding="utf-8").splitlines()[:6]


def start(directions, options) -> Server:
    server = Server(directions, options, [])
    server.loop = asyncio.new_event_loop()  # one loop for the server's requests, as uvicorn runs it
    server.queue.start()
    return server


def stop(server: Server) -> None:
    server.queue.stop()
    server.loop.close()


def ask(server, path="/translate", method="POST", **fields):
    body = json.dumps(fields).encode() if method == "POST" else b""
    return server.loop.run_until_complete(call(server.app(), path, body, method=method))


@pytest.fixture(scope="module")
def served(multi, tmp_path_factory):
    """``--model multi.pt``: every pair its meta records, the opens of an engine counted; en-fr
    with a glossary ('man' -> homme)."""
    terms = tmp_path_factory.mktemp("glossary") / "terms.tsv"
    terms.write_text("man\thomme\n", encoding="utf-8")
    options = build_options(ServeOptions, {"model": [multi], "glossary": [f"en-fr={terms}"], **DECODING}, "test")
    opened = []
    real = serve_directions.open_engine
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(serve_directions, "open_engine", lambda o, **kw: opened.append(o.path) or real(o, **kw))
        server = start(load_directions(options, load_glossaries(options)), options)
    server.opened = opened
    yield server
    stop(server)


def reference(engine, path: str, target: str, lines: list[str]) -> list[list[str]]:
    """Each line's hypotheses as xf translate decodes them: the source tagged by vocabulary_for,
    searched by the engine with the server's options, outside the server."""
    ckpt = load_checkpoint(path)
    sp = load_sentencepiece(ckpt["spm_model"], path)
    vocab = vocabulary_for(sp, ckpt["meta"], target)
    pieces = encode_lines(vocab, lines, engine.max_source, Stats())
    assert all(ids[0] == sp.piece_to_id(tag(target)) for ids in pieces)
    options = build_options(ServeOptions, {"model": [path], **DECODING}, "test").translate_options(path)
    found, _ = search_lines(engine, pieces, options, Stats(), max_tokens=2048, max_sentences=None)
    return [hypothesis_texts(sp, hyps) for hyps in found]


def test_one_model_in_memory_serves_both_directions(served, multi, lines):
    assert served.opened == [(multi,)]  # one engine opened for two directions
    de, fr = served.directions["en-de"], served.directions["en-fr"]
    assert de.engine is fr.engine and de.options == fr.options
    assert isinstance(de.sp, TaggedVocabulary) and (de.sp.target_lang, fr.sp.target_lang) == ("de", "fr")
    assert de.target_sp is fr.target_sp is de.sp.sp  # target-side text: never tagged

    status, languages = ask(served, "/languages", "GET")
    assert status == 200 and languages == [{"code": "en", "name": "English", "targets": ["de", "fr"]}]
    answers = {}
    for target in ("de", "fr"):
        status, answer = ask(served, q=lines, source="en", target=target, alternatives=1, glossary=False)
        assert status == 200, answer
        expected = reference(de.engine, multi, target, lines)
        assert answer["translatedText"] == [hyps[0] for hyps in expected]
        assert answer["alternatives"] == [hyps[1:2] for hyps in expected]
        answers[target] = answer["translatedText"]
    # each direction searched its own tagged source (reference asserts the tag first); whether a
    # random model then writes other words depends on its vocabulary (the generated corpus's: not)
    assert de.sp.tag_id != fr.sp.tag_id


def test_a_direction_not_served_is_a_400_naming_the_served_ones(served):
    status, answer = ask(served, q="A man.", source="en", target="es")
    assert status == 400 and answer == {"error": "en-es is not served; served: en-de, en-fr"}
    status, answer = ask(served, q="A man.", source="de", target="fr")
    assert status == 400 and "de-fr is not served" in answer["error"]


def test_auto_detects_among_the_served_sources_then_takes_the_direction(served, lines):
    pytest.importorskip("py3langid", reason="the detect extra is not installed")
    status, detected = ask(served, q=lines[0], source="auto", target="fr")
    status_en, given = ask(served, q=lines[0], source="en", target="fr")
    assert status == status_en == 200 and detected.pop("detectedLanguage")["language"] == "en"
    assert detected == given


def test_each_direction_keeps_its_glossary_and_confidence(served):
    fr, de = served.directions["en-fr"], served.directions["en-de"]
    assert fr.glossary is not None and de.glossary is None
    status, answer = ask(served, q="A man sleeps.", source="en", target="fr")
    assert status == 200 and "homme" in answer["translatedText"]
    assert answer["glossaryTerms"] == [{"source": "man", "target": ["homme"], "from": "server", "inTranslation": True}]
    status, answer = ask(served, q="A man sleeps.", source="en", target="de")
    assert status == 200 and "glossaryTerms" not in answer
    # a request's own constraint: target text, encoded without the tag, forced into the translation
    status, answer = ask(served, q="A man sleeps.", source="en", target="de", constraints=["Hund"])
    assert status == 200 and "Hund" in answer["translatedText"]
    if fr.scorer.probability is not None:  # py3langid: wrong_language is judged against the direction's target
        assert (fr.scorer.target_lang, de.scorer.target_lang) == ("fr", "de")


def test_a_listed_zero_shot_direction_is_served_with_a_warning(multi30k_dir, tmp_path, capsys):
    path = multilingual_checkpoint(tmp_path / "zero.pt", multi30k_dir, pairs=("en-de", "fr-en"))
    options = build_options(ServeOptions, {"model": [f"fr-de,en-de={path}"], **DECODING}, "test")
    directions = load_directions(options)
    assert [d.code for d in directions] == ["fr-de", "en-de"] and directions[0].engine is directions[1].engine
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("xf: warning: --model")]
    assert warnings == [f"xf: warning: --model fr-de,en-de={path}: the model was not trained on fr-de (its pairs: "
                        "en-de, fr-en): served zero-shot"]  # one warning: en-de was trained


def test_confidence_for_a_direction_the_model_does_not_serve_is_refused_at_start(multi):
    options = build_options(ServeOptions, {"model": [multi], "confidence": ["en-es=c.json"], **DECODING}, "test")
    with pytest.raises(XfError, match="--confidence en-es=...: no --model serves en-es"):
        load_directions(options)


# -- refused at start: one line, exit non-zero --------------------------------------------------------
@pytest.mark.slow
def test_start_up_refusals_are_one_line(multi, multi30k_dir, tmp_path):
    def fails(args, message):
        proc = subprocess.run([sys.executable, "-m", "xformer_cli", "serve", "--port", "0", *args], capture_output=True,
                              text=True, cwd=REPO, timeout=120)
        assert proc.returncode != 0 and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and proc.stderr.startswith("xf: error: "), proc.stderr

    fails(["--model", f"de-fr={multi}"], f"--model de-fr={multi}: the model translates en-de, en-fr, not de-fr")
    fails(["--model", f"en-de={multi}", "--model", multi], "direction en-de is given more than once")
    # a checkpoint whose meta names a target its vocabulary has no tag for
    ckpt = load_checkpoint(multilingual_checkpoint(tmp_path / "de.pt", multi30k_dir, pairs=("en-de",)))
    ckpt["meta"]["pairs"] = ["en-de", "en-fr"]
    save_checkpoint(tmp_path / "untagged.pt", ckpt)
    fails(["--model", str(tmp_path / "untagged.pt")], "its vocabulary has no tag >>fra<< for fr")


def test_html_keeps_its_markup_in_either_direction(served):
    # the inline tags placed by the word alignment, which skips the direction's tag (no word of the text)
    for target in ("de", "fr"):
        status, answer = ask(served, q="<p>A man in a <b>red</b> shirt.</p>", source="en", target=target,
                             format="html")
        assert status == 200, answer
        text = answer["translatedText"]
        assert text.startswith("<p>") and text.endswith("</p>") and text.count("<b>") == text.count("</b>") == 1
    direction = served.directions["en-fr"]
    ids = direction.sp.encode("A man in a red shirt.")
    hyps = direction.engine.search([ids], direction.options)
    pairs = word_alignments(direction, [ids], hyps)[0]
    assert pairs and all(0 <= s < 6 for s, _ in pairs)  # six words: the tag is none of them


def test_a_multilingual_ctranslate2_export_serves_its_directions(multi, lines, tmp_path):
    pytest.importorskip("ctranslate2", reason="the ctranslate2 extra is not installed")
    from xformer_cli.model.checkpoint import model_from_checkpoint
    from xformer_cli.formats.ctranslate2 import write_model_directory

    loaded = load_checkpoint(multi)
    exported = tmp_path / "ct2"
    write_model_directory(exported, model_from_checkpoint(loaded, multi).eval(), loaded["spm_model"], source=multi)
    info = json.loads((exported / "xf.json").read_text(encoding="utf-8"))  # the languages, as xf export records them
    info["languages"] = {key: loaded["meta"][key] for key in ("source_lang", "target_lang", "pairs")}
    (exported / "xf.json").write_text(json.dumps(info), encoding="utf-8")
    options = build_options(ServeOptions, {"model": [str(exported)], "engine": "ctranslate2", **DECODING}, "test")
    server = start(load_directions(options), options)
    try:
        assert list(server.directions) == ["en-de", "en-fr"]
        engine = server.directions["en-de"].engine
        assert server.directions["en-fr"].engine is engine
        for target in ("de", "fr"):
            status, answer = ask(server, q=lines[:3], source="en", target=target)
            assert status == 200, answer
            assert answer["translatedText"] == [hyps[0] for hyps in reference(engine, multi, target, lines[:3])]
    finally:
        stop(server)
