"""xf serve for real text: paragraphs split into sentences and joined back with their own spacing,
a sentence over the model's positions split rather than cut, /detect and source "auto", the
request shapes of LibreTranslate's clients (query string, form, multipart, libretranslatepy itself),
/translate_file. The segmenter and the fitting are unit-tested on their own; the server is a real
process on 127.0.0.1 (test_serve.Served); every request loop is bounded."""

from __future__ import annotations

import asyncio
import base64
import json
import uuid
from pathlib import Path
from urllib.parse import urlencode

import pytest

pytest.importorskip("starlette", reason="the serve extra is not installed")
pytest.importorskip("sentencex", reason="the serve extra is not installed")

from xformer_cli.settings.config import build_options  # noqa: E402
from xformer_cli.settings.options import ServeOptions, TranslateOptions  # noqa: E402
from xformer_cli.text.segment import fit, line_texts, sentence_spans, split_texts  # noqa: E402
from xformer_cli.serve.batch_queue import Direction  # noqa: E402
from xformer_cli.serve.server import Server  # noqa: E402

from helpers import DECODING, FakeEngine, FakeSp, Served, call, until, xf_translate  # noqa: E402



# -- the segmenter and the fitting ----------------------------------------------------------------
def boundaries(language: str, path: Path, per_paragraph: int = 5, paragraphs: int = 200) -> tuple[int, int, int]:
    """(found, wrong, missed) sentence boundaries on paragraphs of ``per_paragraph`` consecutive
    newstest lines joined by a space (each line one sentence: the boundaries are known)."""
    lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    found = wrong = missed = 0
    for p in range(paragraphs):
        group = lines[p * per_paragraph:(p + 1) * per_paragraph]
        text = " ".join(group)
        gold, at = set(), 0
        for line in group[:-1]:
            at += len(line) + 1
            gold.add(at)
        cuts = {start for start, _ in sentence_spans(text, language)} - {0}
        found, wrong, missed = found + len(cuts & gold), wrong + len(cuts - gold), missed + len(gold - cuts)
    return found, wrong, missed


@pytest.mark.parametrize("language", ["en", "de"])
def test_sentence_boundaries_of_newstest_paragraphs(language, shared_data):
    path = shared_data / "wmt14" / f"newstest2013.en-de.{language}"  # ../shared/data's, or generated
    found, wrong, missed = boundaries(language, path)
    # docs/serve.md: P 0.98, R 0.93-0.94 over 1,200 paragraphs; a headline without a full stop is
    # no boundary to any segmenter, and a line of two sentences counts as a wrong one
    assert found / (found + wrong) > 0.9 and found / (found + missed) > 0.85


def test_sentence_spans_keep_every_character():
    line = "  Mr. Smith went home.  He slept!\tThe end  "
    spans = sentence_spans(line, "en")
    assert [line[a:b] for a, b in spans] == ["Mr. Smith went home.", "He slept!", "The end"]
    between = [line[b:a] for (_, b), (a, _) in zip([(0, 0)] + spans, spans + [(len(line), 0)])]
    assert all(not gap.strip() for gap in between)  # only whitespace is left out
    assert sentence_spans("", "en") == [] and sentence_spans(" \t ", "en") == []
    assert sentence_spans("x" * 1_000_000, "en") == [(0, 1_000_000)]


def piece(i: int) -> str:  # ids: 1 a word ending in a comma, 2 a word, 3 inside a word
    return {1: "\u2581a,", 2: "\u2581b", 3: "c"}[i]


def test_fit_cuts_at_a_clause_then_a_word_then_anywhere():
    assert fit([2] * 4, 4, piece) == [[2] * 4]
    # a clause end in the second half of the window wins over a later word start
    assert fit([2, 2, 1, 2, 2, 2, 2], 4, piece) == [[2, 2, 1], [2, 2, 2, 2]]
    # a clause end in the first half makes a chunk too short: the latest word start instead
    assert fit([1, 2, 2, 2, 2, 2], 4, piece) == [[1, 2, 2, 2], [2, 2]]
    assert fit([2, 3, 3, 3, 2, 3, 3], 4, piece) == [[2, 3, 3, 3], [2, 3, 3]]
    assert fit([3] * 9, 4, piece) == [[3] * 4, [3] * 4, [3]]  # no word start at all: at the limit
    chunks = fit([3] * 100_000, 64, piece)  # a long single word: linear, every id kept
    assert sum(chunks, []) == [3] * 100_000 and max(map(len, chunks)) == 64


class WordSp(FakeSp):
    """Whitespace-separated numbers as ids (FakeSp), a full stop or ! after one dropped."""

    def encode(self, lines, out_type=int):
        return super().encode([line.replace(".", "").replace("!", "") for line in lines])


def test_split_texts_puts_every_piece_back_in_place():
    units = split_texts([["5 6. 7 8!", "", "  9  "], ["  "]], "en", WordSp(), max_source=3)
    assert units.pieces == [[5, 6], [7, 8], [9]] and units.sentences == 3 and units.split_long == 0
    translations = ["A.", "B!", "C"]
    assert [layout.render(translations.__getitem__) for layout in units.layouts] == ["A. B!\n\n  C  ", "  "]
    long = split_texts([["1 2 3 4 5 6 7."]], "en", WordSp(), max_source=4)
    assert long.pieces == [[1, 2, 3, 4], [5, 6, 7]] and long.split_long == 1
    assert long.layouts[0].render(lambda i: f"<{i}>") == "<0> <1>"  # pieces of one sentence join with a space
    lines = line_texts([["5 6", "7"], ["8"]], WordSp().encode)
    assert lines.pieces == [[5, 6], [7], [8]]
    assert [layout.render(str) for layout in lines.layouts] == ["0\n1", "2"]


# -- a real server --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def served(ckpt):
    server = Served("--model", f"en-de={ckpt}", *DECODING, "--max-chars", "20000", "--max-queue-lines", "400")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def sentences(multi30k_dir) -> list[str]:
    return (multi30k_dir / "test2016.en").read_text(encoding="utf-8").splitlines()[:12]


@pytest.mark.slow
def test_a_paragraph_comes_back_whole_with_its_spacing(served, ckpt, sentences, tmp_path):
    s = [line.rstrip(" .") + "." for line in sentences[:6]]  # Multi30k's " ." as a full stop
    reference = [hyps[0] for hyps in xf_translate(ckpt, s, tmp_path)]
    text = f"{s[0]} {s[1]}  {s[2]}\n\n\t{s[3]}\r\n{s[4]} {s[5]}\n"
    status, _, answer = served.translate(text)
    r = reference
    assert status == 200 and answer["translatedText"] == f"{r[0]} {r[1]}  {r[2]}\n\n\t{r[3]}\n{r[4]} {r[5]}\n"
    assert "truncated" not in answer
    # paragraphs of a list, an empty paragraph and a whitespace-only one
    status, _, answer = served.translate([f"{s[0]} {s[1]}", "\n\n", "   ", s[2]])
    assert status == 200 and answer["translatedText"] == [f"{r[0]} {r[1]}", "\n\n", "   ", r[2]]
    assert until(lambda: any("| sentences 3 |" in line for line in served.lines), 10)


@pytest.mark.slow
def test_nothing_is_cut(served, ckpt, sentences, tmp_path):
    # one sentence far over the model's positions (128) comes back translated whole, split to fit
    long = ", ".join(line.rstrip(" .") for line in sentences[:12]) + "."
    status, _, answer = served.translate(long)
    assert status == 200 and "truncated" not in answer and answer["translatedText"].strip()
    assert until(lambda: any("sentences split to fit 1" in line for line in served.lines), 10)
    word = "x" * 10_000  # one word of 10,000 characters: in pieces, translated, nothing cut
    status, _, answer = served.translate(word)
    assert status == 200 and "truncated" not in answer
    # a 1 MB single word: refused whole with a reason (the body limit), never cut
    status, _, answer = served.translate("y" * 1_000_000)
    assert status == 413 and "over the limit" in answer["error"]


@pytest.mark.slow
def test_without_splitting_a_cut_is_reported(ckpt, sentences):
    server = Served("--model", f"en-de={ckpt}", *DECODING, "--no-split-sentences", "--max-chars", "20000")
    try:
        status, _, answer = server.translate([" ".join(sentences[:12]), sentences[0]])
        assert status == 200 and answer["truncated"] == 1
    finally:
        assert server.stop() == 0
    assert "| truncated lines 1" in server.log and "sentences split / lines truncated" in server.log


@pytest.mark.slow
def test_detect_and_source_auto(served, sentences):
    pytest.importorskip("py3langid", reason="the detect extra is not installed")
    status, _, answer = served.request("POST", "/detect", {"q": sentences[0]})
    assert status == 200 and answer == [{"language": "en", "confidence": 1.0}]  # the one language served
    status, _, answer = served.translate(sentences[0], source="auto")
    assert status == 200 and answer["detectedLanguage"] == {"language": "en", "confidence": 1.0}
    status, _, plain = served.translate(sentences[0])
    assert answer["translatedText"] == plain["translatedText"]
    for text, why in (("12 345 !!!", "has no letters"),
                      ("Bonjour à tous, je voudrais réserver une chambre pour deux nuits.", "looks like 'fr'")):
        status, _, answer = served.translate(text, source="auto")
        assert status == 400 and why in answer["error"] and "translates from: en" in answer["error"]
    status, _, answer = served.request("POST", "/detect", {"q": "  "})
    assert status == 400 and "'q' is empty" in answer["error"]


@pytest.mark.slow
def test_libretranslate_request_shapes(served, sentences):
    status, _, expected = served.translate(sentences[0])
    fields = urlencode({"q": sentences[0], "source": "en", "target": "de"})
    # fields in the query string of a POST with an empty body (a popular client sends them so)
    status, _, answer = served.request("POST", f"/translate?{fields}", raw=b"")
    assert status == 200 and answer == expected
    # query string and JSON body together: the body's fields win
    status, _, answer = served.request("POST", "/translate?source=xx", {"q": sentences[0], "source": "en",
                                                                        "target": "de"})
    assert status == 200 and answer == expected
    # multipart/form-data fields
    boundary = uuid.uuid4().hex
    body = "".join(f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'
                   for k, v in (("q", sentences[0]), ("source", "en"), ("target", "de"))) + f"--{boundary}--\r\n"
    status, _, answer = served.request("POST", "/translate", raw=body.encode(),
                                       headers={"Content-Type": f"multipart/form-data; boundary={boundary}"})
    assert status == 200 and answer == expected

    libretranslatepy = pytest.importorskip("libretranslatepy")
    client = libretranslatepy.LibreTranslateAPI(f"http://127.0.0.1:{served.port}")
    assert client.translate(sentences[0], "en", "de") == expected["translatedText"]
    assert client.languages() == [{"code": "en", "name": "English", "targets": ["de"]}]
    if served.request("POST", "/detect", {"q": "a"})[0] == 200:  # with the detect extra
        assert client.detect(sentences[0]) == [{"language": "en", "confidence": 1.0}]


@pytest.mark.slow
def test_api_key_in_the_query_string(ckpt, sentences, tmp_path):
    (tmp_path / "keys").write_text("k-1\n")
    server = Served("--model", f"en-de={ckpt}", *DECODING, "--api-keys", str(tmp_path / "keys"))
    try:
        fields = urlencode({"q": sentences[0], "source": "en", "target": "de"})
        assert server.request("POST", f"/translate?{fields}", raw=b"")[0] == 403
        assert server.request("POST", f"/translate?{fields}&api_key=k-1", raw=b"")[0] == 200
        assert server.request("POST", "/translate?api_key=k-1", {"q": "a", "source": "en", "target": "de"})[0] == 200
        assert server.request("POST", "/detect", {"q": "a"})[0] == 403
    finally:
        assert server.stop() == 0


def multipart_file(name: str, data: bytes, **fields: str) -> tuple[bytes, dict]:
    boundary = uuid.uuid4().hex
    parts = [f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode()
             for k, v in fields.items()]
    parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{name}"\r\n'
                 "Content-Type: text/plain\r\n\r\n".encode() + data + b"\r\n")
    return b"".join(parts) + f"--{boundary}--\r\n".encode(), {"Content-Type": f"multipart/form-data; boundary={boundary}"}


@pytest.mark.slow
def test_translate_file(served, sentences):
    text = f"{sentences[0]}\n\n{sentences[1]}\n"
    _, _, expected = served.translate(text)
    body, headers = multipart_file("doc.txt", text.encode(), source="en", target="de")
    status, _, answer = served.request("POST", "/translate_file", raw=body, headers=headers)
    assert status == 200 and answer["translatedFileUrl"].startswith("data:text/plain;charset=utf-8;base64,")
    assert base64.b64decode(answer["translatedFileUrl"].split(",", 1)[1]).decode() == expected["translatedText"]
    # a blank file and a whitespace-only text come back as sent, at once (they were a 504 after --timeout)
    body, headers = multipart_file("blank.txt", b"\n \n", source="en", target="de")
    status, _, answer = served.request("POST", "/translate_file", raw=body, headers=headers)
    assert status == 200 and base64.b64decode(answer["translatedFileUrl"].split(",", 1)[1]) == b"\n \n"
    assert served.translate("   ")[::2] == (200, {"translatedText": "   ", "confidence": 1.0})
    body, headers = multipart_file("doc.pdf", b"%PDF", source="en", target="de")
    status, _, answer = served.request("POST", "/translate_file", raw=body, headers=headers)
    assert status == 400 and "only .txt" in answer["error"]
    status, _, answer = served.request("POST", "/translate_file", {"q": "a", "source": "en", "target": "de"})
    assert status == 400 and "multipart field 'file'" in answer["error"]
    assert "Traceback" not in served.log and json.dumps(answer)


# -- nothing to translate --------------------------------------------------------------------------
@pytest.mark.parametrize("split,expected", [
    (True, ["   ", "\n", " \t\n \n", ["  ", "\n"]]),  # as sent
    (False, ["", "\n", "\n\n", ["", "\n"]]),  # as xf translate gives such lines: empty
])
def test_a_whitespace_only_text_is_answered_at_once(split, expected):
    """Regression: a whitespace-only text (sentences split) made a job of no sentences, which the
    queue never finished: a 504 after --timeout. Nothing to search is answered without the queue,
    here one whose worker never starts (a request that waited on it would be a 504)."""
    options = build_options(ServeOptions, {"model": ["en-de=x.pt"], "timeout": 2, "split_sentences": split}, "test")
    server = Server([Direction("en", "de", FakeEngine(), FakeSp(), TranslateOptions(path=("x",)))], options, [])
    app = server.app()

    async def answers():
        out = []
        for q in ["   ", "\n", " \t\n \n", ["  ", "\n"]]:
            body = json.dumps({"q": q, "source": "en", "target": "de"}).encode()
            status, answer = await call(app, "/translate", body)
            assert status == 200, answer
            out.append(answer["translatedText"])
        body, headers = multipart_file("blank.txt", b" \t\n \n", source="en", target="de")
        status, answer = await call(app, "/translate_file", body, content_type=headers["Content-Type"])
        assert status == 200, answer
        out.append(base64.b64decode(answer["translatedFileUrl"].split(",", 1)[1]).decode())
        return out

    assert asyncio.run(answers()) == [*expected, expected[2]]
