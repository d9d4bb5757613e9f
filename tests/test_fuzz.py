"""Fuzzing the parsers a stranger reaches, with hypothesis: xf serve's requests (JSON, form-encoded
and multipart bodies, the query string) through the ASGI app in-process with the tests' tiny
checkpoint, HTML documents (``html_text``), glossary files, the lines of ``xf translate
--input-format jsonl`` and the config.json of ``xf import huggingface``.

The property everywhere: whatever the input, it is read, or refused with the project's one-line
error (XfError, ConfigError; over HTTP a 4xx whose body is {"error": one line}), never a traceback,
a 500 or a hang (each example's time bounded by ``deadline``, a request's by the server's
--timeout). The examples come from a fixed seed (``derandomize``): the same on every run and in CI.

Inputs that once failed are drawn too: texts of whitespace only (once a 504), nesting 100,000
deep in jsonl input and config.json (a RecursionError), comments and tags left open at the end of
a document (their text was translated), glossary files with a UTF-8 byte-order mark (the first
term lost) and more constraints and forms than the limits admit (a 413, once gigabytes).
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import io
import json
import re
from urllib.parse import urlencode

import pytest

hypothesis = pytest.importorskip("hypothesis", reason="the test extra is not installed (hypothesis)")
pytest.importorskip("starlette", reason="the serve extra is not installed")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from xformer_cli.text import html_text  # noqa: E402
from xformer_cli.settings.config import build_options  # noqa: E402
from xformer_cli.base.errors import ConfigError, XfError  # noqa: E402
from xformer_cli.text.glossary import Glossary, find_terms  # noqa: E402
from xformer_cli.formats.huggingface import config_from_marian, read_marian, special_ids  # noqa: E402
from xformer_cli.settings.options import ServeOptions  # noqa: E402
from xformer_cli.serve.server import Server  # noqa: E402
from xformer_cli.serve.directions import load_directions, load_glossaries  # noqa: E402
from xformer_cli.decode.steering import encode_constraints, encode_prefixes, read_steered_line  # noqa: E402
from xformer_cli.decode.translate import Stats, decode_input_line  # noqa: E402

from helpers import MARIAN_CONFIG, call  # noqa: E402

pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.filterwarnings("ignore:Generating overly large repr")]  # the 100,000-deep texts


def fuzz(examples: int, deadline_ms: int = 2000):
    """hypothesis's settings here: ``examples`` drawn from a fixed seed, none saved between runs, each
    within ``deadline_ms`` (generous: the test machines are slow and shared)."""
    return settings(max_examples=examples, derandomize=True, database=None, deadline=deadline_ms,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def one_line(error: Exception) -> None:
    assert str(error) and "\n" not in str(error), repr(error)


# -- the pieces of the inputs ----------------------------------------------------------------------
# Words the tiny model and the glossary know, and the characters parsers trip on: line breaks of
# every kind, a byte-order mark, NUL, a lone surrogate, the delimiters of each format.
PIECES = ["man", "girl", "dog", "A", "young", "Hund", "is", "running", ".", ",", "!", "?", "|", "\t", "\n", "\r\n",
          "\r", " ", "  ", "\u00a0", "\u2028", "\u3000", "\ufeff", "\x00", "\x85", "é", "İ", "ß", "漢字", "😀",
          "\ud800", "<b>", "</b>", "<br>", "&amp;", "%", "%zz", "%ff", "+", "&", "=", '"', "'", "\\", "[", "{", "-"]
TEXT = st.one_of(st.lists(st.sampled_from(PIECES), max_size=10).map("".join), st.text(max_size=20))
SENTENCES = st.lists(st.sampled_from(PIECES), min_size=1, max_size=16).map(" ".join)  # text with its spaces
LONG_NUMBER = "1" + "0" * 4400  # more digits than Python's int() takes (4,300)
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-2, 3), st.integers(), st.floats(), TEXT,
                    st.just("<long number>"))
JSON = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
                    max_leaves=8)
DEPTHS = st.integers(1, 100) | st.just(100_000)  # nesting of jsonl lines and config.json (once a RecursionError)


def usually(good, bad):
    """``good``'s examples three times in four, ``bad``'s the fourth (hypothesis's one_of draws each
    branch alike: most requests should get past the first check)."""
    return st.sampled_from([True, True, True, False]).flatmap(lambda ok: good if ok else bad)


def dumps(value) -> str:
    """JSON text of ``value``, the string "<long number>" written as a number of 4,401 digits."""
    return json.dumps(value).replace('"<long number>"', LONG_NUMBER)


def utf8(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")  # a lone surrogate: invalid UTF-8, as a client may send


def nested(depth: int) -> str:
    return '{"a": ' * (depth // 2) + "[" * (depth - depth // 2) + "]" * (depth - depth // 2) + "}" * (depth // 2)


@st.composite
def json_texts(draw, value, depth=DEPTHS) -> str:
    """The JSON text of a drawn ``value``, or it cut short, or nested ``depth`` deep, or any text."""
    text = dumps(draw(value))
    return draw(usually(st.just(text), st.one_of(st.integers(0, len(text)).map(lambda n: text[:n]), depth.map(nested),
                                                 TEXT)))


# -- xf serve, in-process over the ASGI interface --------------------------------------------------
KEY = "k-1"
FIELDS = ["q", "source", "target", "format", "alternatives", "api_key", "glossary", "server_glossary", "prefix",
          "constraints", "file"]
SPELLED = st.lists(st.sampled_from(["man", "girl", "dog", "young", "Hund", "Katze", "is", ".", "|", " ", "a"]),
                   min_size=1, max_size=5).map("".join)
FORM = usually(SPELLED, TEXT)  # a target form: mostly one the vocabulary spells, so that most requests are translated
FORMS = st.one_of(FORM, st.lists(FORM, max_size=10))  # a constraint: a form, or alternative forms (limit: 8)
DROP = object()  # a field taken out


@st.composite
def payloads(draw) -> dict:
    """A /translate request's fields, good ones (so that most requests are translated), then up to
    two of them (or others) set to any JSON value or taken out."""
    payload = draw(st.fixed_dictionaries(
        {"q": SENTENCES | st.lists(SENTENCES, min_size=1, max_size=4), "source": st.sampled_from(["en", "en", "auto"]),
         "target": st.just("de"), "api_key": st.just(KEY)},
        optional={"format": st.sampled_from(["text", "html"]), "alternatives": st.integers(0, 1),
                  "glossary": st.booleans() | st.lists(st.lists(FORMS, min_size=2, max_size=2), max_size=4),
                  "server_glossary": st.booleans(), "prefix": FORM, "constraints": st.lists(FORMS, max_size=20)}))
    if isinstance(payload["q"], list):  # one prefix and one list of constraints per item
        payload.update({k: [payload[k]] * len(payload["q"]) for k in ("prefix", "constraints") if k in payload})
    changed = st.lists(st.sampled_from([*FIELDS, "extra"]), unique=True, max_size=draw(st.sampled_from([0, 0, 1, 2])))
    for key in draw(changed):
        payload[key] = draw(JSON | st.just(DROP))
    return {k: v for k, v in payload.items() if v is not DROP}


@st.composite
def form_pairs(draw) -> list[tuple[str, str]]:
    """The fields of a form or query string: q (repeated or not), source, target, api_key and others."""
    texts = SENTENCES | TEXT
    pairs = [("q", t) for t in draw(usually(st.lists(texts, min_size=1, max_size=3), st.just([])))]
    pairs += [("source", draw(usually(st.sampled_from(["en", "auto"]), TEXT))),
              ("target", draw(usually(st.just("de"), TEXT))), ("api_key", draw(usually(st.just(KEY), TEXT)))]
    values = usually(st.sampled_from(["0", "1", "2", "-1", "\u00b2", "true", "false", "html", "text", "[]"]), texts)
    known = st.lists(st.sampled_from(FIELDS[3:]), unique=True, max_size=draw(st.sampled_from([0, 0, 1, 3])))
    pairs += [(key, draw(values)) for key in draw(known)]
    pairs += draw(st.lists(st.tuples(TEXT, values), max_size=draw(st.sampled_from([0, 0, 1]))))  # fields xf ignores
    return draw(st.permutations(pairs))


def form(pairs) -> bytes:
    return urlencode(pairs, encoding="utf-8", errors="surrogatepass").encode("ascii")


@st.composite
def multipart(draw, files=st.booleans()) -> tuple[bytes, bytes]:
    """(body, content type) of multipart/form-data: form_pairs' fields, a file if ``files`` draws
    True, maybe cut or garbled."""
    boundary = draw(usually(st.just("xf-fuzz"), st.sampled_from(["a", "x" * 70, ""])))
    parts = [utf8(f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n')
             for name, value in draw(form_pairs())]
    if draw(files):  # what /translate_file reads
        name = draw(usually(st.sampled_from(["doc.txt", "DOC.TXT"]), st.sampled_from(["doc.pdf", ""]) | TEXT))
        data = draw(st.binary(max_size=40) | TEXT.map(utf8))
        parts.append(utf8(f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{name}"\r\n'
                          "Content-Type: text/plain\r\n\r\n") + data + b"\r\n")
    body = b"".join(parts) + f"--{boundary}--\r\n".encode()
    body = draw(usually(st.just(body), st.integers(0, len(body)).map(lambda n: body[:n]) | st.binary(max_size=60)))
    kind = draw(usually(st.just(f"multipart/form-data; boundary={boundary}"), st.sampled_from(
        ["multipart/form-data", 'multipart/form-data; boundary="xf-fuzz"; charset=latin-1'])))
    return body, kind.encode("latin-1")


CONTENT_TYPES = usually(st.just(b"application/json"), st.sampled_from(
    [b"", b"text/plain", b"application/x-www-form-urlencoded", b"multipart/form-data; boundary=xf-fuzz"]))
PATHS = usually(st.just("/translate"), st.sampled_from(["/detect", "/translate_file"]))


@st.composite
def length_header(draw, body: bytes) -> list[tuple[bytes, bytes]]:
    """No Content-Length, the right one, or one a client got wrong."""
    wrong = st.sampled_from(["0", "-1", " 7 ", "abc", "9" * 30, "\u00b2"]) | st.text(st.characters(max_codepoint=255),
                                                                                       max_size=3)
    value = draw(usually(st.sampled_from([None, str(len(body))]), wrong))
    return [] if value is None else [(b"content-length", value.encode("latin-1"))]


@pytest.fixture(scope="module")
def served(ckpt, tmp_path_factory):
    """An en-de server over the tiny checkpoint with a glossary and an API key, its limits low (so
    that the 413s are reached), its --timeout short (a request stuck is a 504, which fails)."""
    folder = tmp_path_factory.mktemp("fuzz-serve")
    (folder / "terms.tsv").write_text("man\tHund\ngirl\tKatze|Katzen\n", encoding="utf-8")
    options = build_options(ServeOptions, {
        "model": [f"en-de={ckpt}"], "glossary": [f"en-de={folder / 'terms.tsv'}"], "max_glossary_terms": 3,
        "max_chars": 200, "max_lines": 6, "max_body_bytes": 20_000, "timeout": 5, "max_len_a": 0.5, "max_len_b": 3,
        "beam_size": 2, "nbest": 2, "threads": 1, "max_wait_ms": 0}, "test")
    server = Server(load_directions(options, load_glossaries(options)), options, [KEY])
    server.asgi, server.loop = server.app(), asyncio.new_event_loop()
    server.queue.start()
    yield server
    server.queue.stop()
    server.loop.close()


def answered(server, path: str, body: bytes, headers: list, query: bytes = b"") -> int:
    """The status of one request; a 200 or a 4xx (a client's mistake) whose body is one line of error."""
    log = io.StringIO()
    with contextlib.redirect_stderr(log):  # the access log: on a 500 it holds the cause
        status, answer = server.loop.run_until_complete(call(server.asgi, path, body, headers=headers, query=query))
    hypothesis.event(f"{path} {status}")  # what was reached: pytest --hypothesis-show-statistics
    assert status == 200 or 400 <= status < 500 and status != 499, f"{status} {answer}; log: {log.getvalue()}"
    if status != 200:
        assert list(answer) == ["error"] and isinstance(answer["error"], str) and "\n" not in answer["error"], answer
    return status


@fuzz(300, 5000)
@given(data=st.data())
def test_json_bodies_are_answered(served, data):
    payload = data.draw(usually(payloads(), JSON))
    body = utf8(data.draw(json_texts(st.just(payload), st.integers(1, 3000))))  # parse_json takes any depth
    kind = data.draw(CONTENT_TYPES)
    answered(served, data.draw(PATHS), body, [(b"content-type", kind), *data.draw(length_header(body))])


@fuzz(200, 5000)
@given(data=st.data())
def test_form_bodies_and_query_strings_are_answered(served, data):
    pairs = data.draw(form_pairs())
    body = data.draw(usually(st.just(form(pairs)), TEXT.map(utf8) | st.binary(max_size=40)))
    query = data.draw(st.one_of(st.just(b""), form_pairs().map(form), st.binary(max_size=30)))
    kind = data.draw(usually(st.just(b"application/x-www-form-urlencoded"),
                             st.sampled_from([b"application/x-www-form-urlencoded; charset=x", b"application/json"])))
    if data.draw(st.booleans()):  # the fields in the query string alone (LibreTranslate's GET-like POST)
        body, query = b"", form(pairs)
    answered(served, data.draw(PATHS), body, [(b"content-type", kind), *data.draw(length_header(body))], query)


@fuzz(200, 5000)
@given(data=st.data())
def test_multipart_bodies_are_answered(served, data):
    path = data.draw(st.sampled_from(["/translate", "/translate_file", "/detect"]))
    files = usually(st.just(True), st.just(False)) if path == "/translate_file" else st.booleans()
    body, kind = data.draw(multipart(files))
    answered(served, path, body, [(b"content-type", kind), *data.draw(length_header(body))])


# -- HTML ------------------------------------------------------------------------------------------
TAGS = ["<p>", "</p>", "<b>", "</b>", "<i>", "</i>", "<a href='x'>", "</a>", '<span class="notranslate">', "</span>",
        "<div>", "</div>", "<br>", "<br/>", "<img src=x>", "<code>", "</code>", "<pre>", "</pre>", "<!-- c -->",
        "<!DOCTYPE html>", "&amp;", "&lt;", "&#x110000;", "&#x0;", "&nosuch;", " ", "\n", "man", "girl", "Hund", ".",
        "un", "belie"]
BROKEN = ["<", ">", "</", "<!--", "-->", '<a href="', "<script>", "</script>", "<style>", "<textarea>", "<![CDATA[",
          "]]>", "<?xml ?>", "=", '"', "'"]
DOCUMENTS = st.one_of(st.lists(st.sampled_from(TAGS + BROKEN) | TEXT, max_size=30).map("".join), st.text(max_size=60))
SECRET = "zqxj"  # a word that is no piece's above: where it shows up in a block, hidden text was translated
HIDDEN = [f"<!--{SECRET}-->", f"<script>{SECRET}</script>", f"<style>{SECRET}", f'<span translate="no">{SECRET}</span>',
          f"<p title='{SECRET}'>", f"<code>{SECRET}</code>", f"<textarea>{SECRET}"]
HIDDEN += [f"<!--{SECRET}", f'<a title="{SECRET}']  # left open at the end (once translated as text)


@fuzz(800, 1000)
@given(document=DOCUMENTS, data=st.data())
def test_any_document_parses_keeps_its_markup_and_renders(document, data):
    parsed = html_text.parse(document)
    assert "".join(p if isinstance(p, str) else p.raw for p in parsed.parts) == document  # nothing lost
    words = [len(b.words) for b in parsed.blocks]
    parsed.render([(b.text, [(i, i) for i in range(n)], None) for b, n in zip(parsed.blocks, words)])
    translated = [data.draw(st.lists(st.sampled_from(["X", "Y&", "<z>"]), max_size=6)) for _ in words]
    aligned = [st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, len(t) - 1)), max_size=6) if n and t
               else st.none() for n, t in zip(words, translated)]  # (source word, target word) pairs, or none
    pairs = [data.draw(st.none() | pairs_of) for pairs_of in aligned]
    html_text.parse(parsed.render([(" ".join(t), p, None) for t, p in zip(translated, pairs)]))


@fuzz(40, 3000)
@given(pieces=st.lists(st.sampled_from(["x", " ", "<b>", "<i>", "</b>", "<br>", "<", "<a ", "</", "&", "=", "'",
                                        "<!--"]), min_size=1, max_size=4), length=st.integers(4000, 5000))
def test_long_documents_of_a_few_pieces_parse_in_time(pieces, length):
    """As long as xf serve reads by default (--max-chars 5000): tags nested or left open by the
    thousand, every example within the deadline."""
    parsed = html_text.parse(("".join(pieces) * length)[:length])
    html_text.parse(parsed.render([(b.text, [(i, i) for i in range(len(b.words))], None) for b in parsed.blocks]))


@fuzz(60, 3000)
@given(unit=st.lists(st.sampled_from(["<b>", "<i>", "<a href=x>", "<span>", "<p>", "<code>", "x", "<br>", "<!--"]),
                     min_size=1, max_size=3).map("".join), depth=st.integers(1, 2000), closed=st.booleans())
def test_deeply_nested_documents_parse_and_render(unit, depth, closed):
    """Tags nested as deep as a document of xf serve's default --max-chars (5000) nests them, closed or not."""
    ends = "".join(f"</{name}>" for name in reversed(re.findall(r"<(\w+)", unit)))
    parsed = html_text.parse(unit * depth + " man " + ends * depth * closed)
    html_text.parse(parsed.render([(b.text, [(i, i) for i in range(len(b.words))], None) for b in parsed.blocks]))


@fuzz(300, 1000)
@given(before=st.lists(st.sampled_from(TAGS), max_size=8), hidden=st.sampled_from(HIDDEN),
       after=st.lists(st.sampled_from(TAGS), max_size=8))
def test_hidden_text_is_never_translated(before, hidden, after):
    """What a browser does not show as text (a comment, a script, translate="no", an attribute) is
    not sent to the model, wherever it stands among well-formed markup."""
    document = "".join(before) + hidden + ("" if hidden.endswith(SECRET) else "".join(after))
    assert not any(SECRET in word for b in html_text.parse(document).blocks for word in b.words), document


# -- glossary files --------------------------------------------------------------------------------
TERM = st.lists(st.sampled_from(["cat", "Katze", "mountain", "bike", " ", "-", ".", "é", "İ", "ß", "K", "ǅ", "漢",
                                 "\u00a0", "\ufeff", "\x85", "\u2028"]), min_size=1, max_size=4).map("".join)
BOMS = st.sampled_from([b"", codecs.BOM_UTF8])  # a BOM once took the first term with it


@st.composite
def glossary_lines(draw) -> list[tuple[str, list[str]]]:
    return draw(st.lists(st.tuples(TERM, st.lists(TERM, min_size=1, max_size=3)), max_size=5))


@fuzz(500, 1000)
@given(entries=glossary_lines(), noise=st.lists(TEXT, max_size=2), newline=st.sampled_from(["\n", "\r\n", "\r"]),
       bom=BOMS, raw=usually(st.none(), st.binary(max_size=60)), data=st.data())
def test_any_glossary_file_loads_or_is_one_line(tmp_path_factory, entries, noise, newline, bom, raw, data):
    lines = [f"{source}\t{'|'.join(forms)}" for source, forms in entries] + noise
    path = tmp_path_factory.getbasetemp() / "fuzz-terms.tsv"
    path.write_bytes(raw if raw is not None else bom + utf8(newline.join(data.draw(st.permutations(lines)))))
    try:
        glossary = Glossary.load(str(path))
    except ConfigError as e:
        one_line(e)
        assert str(e).startswith(f"{path}: ")
        return
    for line in [*noise, *(source for source, _ in entries), data.draw(TEXT)]:
        glossary.constraints(line)
        find_terms(line, [glossary, Glossary.from_pairs([["cat", "Katze"]], "test")])
    if raw is None and not noise:  # every term is found in a line that is the term as the file writes it
        for source, forms in entries:
            assert glossary.constraints(source) == [[form.strip() for form in forms]], (source, glossary.entries)


# -- xf translate --input-format jsonl -------------------------------------------------------------
STEERED = st.fixed_dictionaries({"source": TEXT}, optional={
    "prefix": TEXT | JSON, "constraints": st.lists(st.one_of(TEXT, st.lists(TEXT, max_size=3)), max_size=3) | JSON})


@pytest.fixture(scope="module")
def sp(spm_model):
    import sentencepiece as spm

    return spm.SentencePieceProcessor(model_proto=spm_model)


@fuzz(500, 1000)
@given(lines=st.lists(st.one_of(json_texts(STEERED), json_texts(JSON)).map(utf8) | st.binary(max_size=30), max_size=5))
def test_any_jsonl_input_is_read_or_one_line(sp, lines):
    stats = Stats()
    for n, raw in enumerate(io.BytesIO(b"\n".join(lines)), 1):  # as xf translate reads a file: bytes, a line at a time
        text = decode_input_line(raw, n, stats, "in.jsonl")
        try:
            steered = read_steered_line(text, n, "in.jsonl")
            encode_prefixes(sp, [steered.prefix], 128, "in.jsonl", n - 1)
            encode_constraints(sp, [steered.constraints], 128, "in.jsonl", n - 1)
        except ConfigError as e:
            one_line(e)
            assert str(e).startswith(f"in.jsonl: line {n}: ")


# -- xf import huggingface: config.json ------------------------------------------------------------
HF_KEYS = [*MARIAN_CONFIG, "pad_token_id", "eos_token_id", "decoder_start_token_id", "normalize_before",
           "normalize_embedding", "add_final_layer_norm", "static_position_embeddings", "add_bias_logits",
           "attention_dropout", "activation_dropout"]
EDGES = st.sampled_from([0, 1, 2, 7, -1, 32, 199, 200, 2**31, 2**63, 10**400, 0.5, 1e308, True, "relu", "silu", [], [3],
                         None, "<long number>"])
HF_VALUES = st.one_of(EDGES, EDGES, st.integers(), st.floats(), JSON)


@st.composite
def marian_configs(draw) -> dict:
    config = {**MARIAN_CONFIG, "pad_token_id": 0, "eos_token_id": 1, "decoder_start_token_id": 0}
    for key in draw(st.lists(st.sampled_from(HF_KEYS), unique=True, min_size=1, max_size=3)):
        config[key] = draw(HF_VALUES)
    return config


@fuzz(800, 1000)
@given(text=json_texts(marian_configs()) | st.binary(max_size=40).map(lambda b: b.decode("latin-1")))
def test_any_config_json_is_read_or_one_line(tmp_path_factory, text):
    directory = tmp_path_factory.getbasetemp() / "fuzz-marian"
    directory.mkdir(exist_ok=True)
    (directory / "config.json").write_bytes(utf8(text))
    with pytest.raises(XfError) as e:  # the directory holds config.json alone: at best, vocab.json is missing
        read_marian(directory)
    one_line(e.value)
    assert str(e.value).startswith(str(directory))
    try:
        config = json.loads(text)
    except (ValueError, RecursionError):  # not JSON, or deeper than Python parses: read_marian refused it
        return
    if isinstance(config, dict):  # the ids, which read_marian checks once vocab.json is read
        try:
            where = directory / "config.json"
            special_ids(config, where, config_from_marian(config, where).vocab_size)
        except XfError as e:
            one_line(e)
