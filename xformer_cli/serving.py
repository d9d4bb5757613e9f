"""xf serve's HTTP side: LibreTranslate's API over the batching queue, on Starlette (ASGI).

Endpoints (the shape LibreTranslate's clients already speak):

- ``POST /translate`` ``{"q": "text" or ["t1", "t2"], "source": "en", "target": "de",
  "format": "text", "alternatives": 2, "api_key": "..."}`` (JSON, or the same fields
  form-encoded) -> ``{"translatedText": ..., "alternatives": [...]}`` (alternatives only when
  asked for). A text is split into sentences (``segment``; a sentence too long split to fit) and
  its translation joined with its own spacing and line breaks; with --no-split-sentences it is
  translated line by line, as ``xf translate`` reads a file, a line too long truncated and counted
  in the answer's ``truncated``. The fields may also come in the query string, form-encoded or
  multipart. ``source: "auto"`` detects the language (``language_id``). ``format: "html"``: the
  text of a document translated and its markup kept as written (``html_text``), inline tags placed
  by the word alignment of the best translation. ``glossary``: the request's own terms as
  [source, target] pairs, applied with the direction's --glossary (``server_glossary: false``:
  without it; ``glossary: false``: no glossary at all); the answer's ``glossaryTerms`` says which
  terms each item's text held and whether its translation has them.
- ``POST /detect`` ``{"q": ...}`` -> ``[{"language": "en", "confidence": 0.97}]`` (served languages only)
- ``POST /translate_file`` (multipart ``file``, .txt) -> ``{"translatedFileUrl": "data:..."}``
- ``GET /languages`` -> ``[{"code": "en", "name": "English", "targets": ["de"]}]``
- ``GET /frontend/settings`` -> what a client may offer (``Server.settings``: the limits, the most
  alternatives, detection, API keys, the default direction, the languages' names), as
  LibreTranslate's own page asks its server before it shows anything
- ``GET /health`` (ready: the models are loaded), ``GET /metrics`` (Prometheus), ``GET /`` (a page).

Every answer other than 200 is ``{"error": "..."}``: 400 (malformed or too deeply nested JSON,
wrong types, empty q, a direction not served, no language for auto, a format not text or html,
a bad glossary), 403 (API key), 404 and 405 (no such path or method), 413 (body, lines,
characters or glossary pairs over the limits; the body's size is checked before it is parsed), 503 with Retry-After (queue full), 503 at shutdown (unanswered when
--grace-seconds ran out), 504 (waited longer than --timeout). A client that disconnects is
logged as 499 and its lines not yet decoded leave the queue. Every request is one access-log
line on stderr and one outcome in the summary at exit; no traceback reaches a response or the log.

Shutdown (``Server.run``): SIGTERM or Ctrl-C stops accepting, the worker stops waiting for
batches to fill, the requests in flight are answered for up to --grace-seconds (a second Ctrl-C:
at once); then each one still unanswered gets a 503, its lines are dropped, and the worker ends
once the batch it decodes is done.
"""

from __future__ import annotations

import asyncio
import hmac
import signal
import socket
import sys
import threading
import time
from importlib import resources
from pathlib import Path
from typing import Optional

from . import html_text
from .confidence import Calibration, Scorer
from .console import warn
from .errors import ConfigError, XfError
from .glossary import Glossary, find_terms
from .options import ServeOptions, check_served, direction_and_path, model_spec
from .language_id import LanguageId, UnknownLanguage
from .languages import pair_names
from .model_facts import ModelFacts, from_export, read_facts
from .segment import Units, line_texts, split_texts
from .serve_queue import BatchQueue, Direction, Job, QueueFull
from .serve_log import ANSWER_SECONDS, CLIENT_GONE, AccessLog
from .serve_requests import HttpError, disconnected, request_fields, shown, text_lines
from .decoding_plan import Machine, plan_decoding
from .translation import (Stats, crowded_term, encode_constraints, encode_lines, encode_prefixes, open_engine,
                          over_constraint_limits, read_constraints, text_field, unfit_term)
from .vocab import encode_target

# ISO 639-1 names for /languages; a code not listed is shown as itself.
LANGUAGE_NAMES = {
    "ar": "Arabic", "cs": "Czech", "de": "German", "en": "English", "es": "Spanish", "fi": "Finnish",
    "fr": "French", "hi": "Hindi", "it": "Italian", "ja": "Japanese", "ko": "Korean", "nl": "Dutch",
    "pl": "Polish", "pt": "Portuguese", "ro": "Romanian", "ru": "Russian", "tr": "Turkish", "uk": "Ukrainian",
    "zh": "Chinese",
}
BACKSTOP_SECONDS = 5.0  # uvicorn cancels what is still running this long after the grace period


def language_name(code: str) -> str:
    return LANGUAGE_NAMES.get(code, code)


# -- start-up ------------------------------------------------------------------------------------
def load_glossaries(options: ServeOptions) -> dict[str, Glossary]:
    """Each --glossary DIRECTION=FILE read, by direction code; a bad file is a one-line error naming
    the direction, the file and its line (read before the port is bound and the models load)."""
    glossaries = {}
    for spec in options.glossary:
        source, target, path = direction_and_path(spec, "--glossary", "FILE", "en-de=terms.tsv")
        try:
            glossaries[f"{source}-{target}"] = Glossary.load(path)
        except ConfigError as e:
            raise XfError(f"--glossary {source}-{target}: {e}") from None
    return glossaries


def model_directions(listed: Optional[list[tuple[str, str]]], facts: ModelFacts, spec: str) -> list[tuple[str, str, bool]]:
    """The directions one --model serves, each (source, target, trained on it), as the model's
    record (``model_facts``) says what it translates.

    Multilingual: ``listed``, or every pair when None. A direction it was not trained on is served
    zero-shot (trained False) when listed and its source is one of the model's sources and its
    target one of its targets; any other is refused, naming the model's pairs. Bilingual: its
    recorded direction, which a listed one may confirm but not contradict (a model that records
    none: the one direction listed, its codes the user's to choose). A direction is served under
    the model's own codes (``en-deu`` of a model that records en-de serves en-de)."""
    if listed is not None:
        listed = [facts.own(source, target) for source, target in listed]
    if not facts.multilingual:
        if listed is None:
            if not facts.pairs:
                raise XfError(f"--model {spec}: the checkpoint does not record its languages: name its direction, "
                              f"e.g. en-de={spec}")
            return [(*facts.pairs[0], True)]
        if len(listed) > 1:
            raise XfError(f"--model {spec}: a bilingual model translates one direction, not "
                          f"{', '.join(pair_names(listed))}")
        if not facts.translates(*listed[0]):
            raise XfError(f"--model {spec}: the model translates {facts.describe()}, not {pair_names(listed)[0]} "
                          "(its recorded languages)")
        return [(*listed[0], True)]
    if listed is None:
        return [(source, target, True) for source, target in facts.pairs]
    out = []
    for source, target in listed:
        if not facts.translates(source, target):
            raise XfError(f"--model {spec}: the model translates {facts.describe()}, not {source}-{target} "
                          f"(from {', '.join(facts.sources)} into {', '.join(facts.targets)})")
        out.append((source, target, (source, target) in facts.pairs))
    return out


def load_directions(options: ServeOptions, glossaries: Optional[dict[str, Glossary]] = None) -> list[Direction]:
    """The directions of every --model (``model_directions``), checked before any model loads
    (errors name the --model value), then one engine per checkpoint, loaded once and shared by
    its directions, each with its own vocabulary (``languages.vocabulary_for``), its glossary
    (``load_glossaries``), whose target terms must fit the model, and its confidence."""
    specs = [(spec, *model_spec(spec)) for spec in options.model]
    plan = plan_decoding(options.translate_options("check"), Machine.here())  # the one start-up plan: every --model's
    for code in glossaries or {}:  # refused by the plan before the models
        plan.refuse_steering(f"--glossary {code}=...")
    from .ctranslate2_format import read_exported_model

    facts: dict[str, ModelFacts] = {}  # each model's record, read without loading the model
    for spec, _, path in specs:
        if not Path(path).exists():
            raise XfError(f"--model {spec}: {path} does not exist")
        if path not in facts:
            facts[path] = (from_export(read_exported_model(Path(path)), path) if options.engine == "ctranslate2"
                           else read_facts(path))
    served = [(spec, path, source, target, trained) for spec, listed, path in specs
              for source, target, trained in model_directions(listed, facts[path], spec)]
    codes = [(source, target) for _, _, source, target, _ in served]
    for spec, _, source, target, _ in served:
        if codes.count((source, target)) > 1:
            raise XfError(f"--model {spec}: direction {source}-{target} is given more than once")
    try:
        check_served(options, codes)
    except ValueError as e:
        raise XfError(str(e)) from None
    for spec, path, source, target, trained in served:
        if not trained:
            warn(f"--model {spec}: the model was not trained on {source}-{target} "
                 f"(its pairs: {facts[path].describe()}): served zero-shot")
    engines: dict[str, tuple] = {}
    directions = []
    for spec, path, source, target, _ in served:
        if path not in engines:
            engines[path] = open_engine(options.translate_options(path), plan=plan)[:2]
        engine, sp = engines[path]
        vocab = facts[path].vocabulary(sp, target, f"--model {spec}") if facts[path].multilingual else sp
        direction = Direction(source, target, engine, vocab, options.translate_options(path),
                              (glossaries or {}).get(f"{source}-{target}"), confidence_scorer(options, source, target))
        unfit = direction.glossary is not None and (
            unfit_term(direction.glossary, direction.target_sp, engine.max_source)
            or crowded_term(direction.glossary, options.max_constraint_forms))
        if unfit:
            raise XfError(f"--glossary {source}-{target}: {unfit}")
        directions.append(direction)
    return directions


def confidence_scorer(options: ServeOptions, source: str, target: str) -> Scorer:
    """The direction's confidence: its --confidence file's calibration (no reverse model: xf serve
    runs none), or the default; the wrong_language flag where py3langid is installed and knows
    the target language."""
    specs = [direction_and_path(spec, "--confidence", "FILE") for spec in options.confidence]
    path = next((file for s, t, file in specs if (s, t) == (source, target)), None)
    calibration = Calibration.load(path) if path is not None else None
    known = LanguageId.load([target])
    flag = target if known is not None and target in known.languages else None
    return Scorer(calibration, None, flag, f"--confidence {source}-{target}={path}")


def read_api_keys(path: Optional[str]) -> list[str]:
    """The keys of --api-keys FILE (one a line; blank lines and '#' comments skipped), or [] without it."""
    if path is None:
        return []
    try:
        text = Path(path).read_text(encoding="utf-8-sig")  # a BOM (Notepad) is not part of the first key
    except FileNotFoundError:
        raise XfError(f"--api-keys {path}: file not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise XfError(f"--api-keys {path}: cannot read it: {e}") from None
    keys = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    if not keys:
        raise XfError(f"--api-keys {path}: holds no key (one key a line)")
    return keys


def bind(host: str, port: int) -> socket.socket:
    """A socket bound to host:port (port 0: a free one), before any model loads, so that a host that
    does not resolve or a port taken is a one-line error at once. Not listening yet: ``listen()``
    once the models are loaded, so that a connection before is refused, not left waiting."""
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
    except OSError as e:  # socket.gaierror: the host does not resolve
        raise XfError(f"--host {host} --port {port}: cannot listen on {where}: {e.strerror or e}") from None
    except ValueError as e:  # UnicodeError (an empty label: 'a..b'), a NUL
        raise XfError(f"--host {host} --port {port}: cannot listen on {where}: not a host name ({e})") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a port in TIME_WAIT, not one in use
        sock.bind(address)
    except OSError as e:
        sock.close()
        raise XfError(f"--host {host} --port {port}: cannot listen on {where}: {e.strerror or e}") from None
    return sock


class Metrics:
    """The Prometheus series of /metrics, in a registry of their own."""

    def __init__(self):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        self.requests = Counter("xf_serve_requests", "HTTP requests by path and status", ["path", "status"],
                                registry=self.registry)
        self.latency = Histogram("xf_serve_translate_seconds", "time to answer POST /translate",
                                 buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
                                 registry=self.registry)
        self.batch = Histogram("xf_serve_batch_sentences", "sentences per decoded batch",
                               buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512), registry=self.registry)
        self.queue = Gauge("xf_serve_queue_lines", "lines waiting to be decoded", registry=self.registry)
        self.lines = Counter("xf_serve_lines", "lines translated, by direction", ["direction"], registry=self.registry)

    def render(self) -> tuple[bytes, str]:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST


def check_api_key(server: "Server", fields: dict) -> None:
    """A 403 unless the server needs no key or ``api_key`` (body or query string) is one of its keys."""
    if server.api_keys:
        key = fields.get("api_key")
        if not isinstance(key, str) or not any(hmac.compare_digest(key.encode(), k.encode()) for k in server.api_keys):
            raise HttpError(403, "Invalid API key" if key else "an API key is needed: send it as 'api_key'")


def steering_fields(payload: dict, count: int, as_list: bool, fmt: str, engine) -> Optional[tuple[list, list]]:
    """The request's ``prefix`` and ``constraints`` as (prefix text, constraints) per q item
    (``read_constraints``'s form), or None when it has neither: beside a q string, a string and
    a list; beside a q list, a list of as many of each (one per item). A 400 otherwise, with
    format html, and with constraints where the plan of the direction's ``engine`` cannot meet them."""
    if "prefix" not in payload and "constraints" not in payload:
        return None
    if fmt != "text":
        raise HttpError(400, "'prefix' and 'constraints' take format 'text' only")
    prefix, constraints = payload.get("prefix", [""] * count if as_list else ""), payload.get("constraints")
    if constraints is None:
        constraints = [[]] * count if as_list else []
    prefixes, per_item = (prefix, constraints) if as_list else ([prefix], [constraints])
    if not isinstance(prefixes, list) or len(prefixes) != count or not isinstance(per_item, list) or len(per_item) != count:
        raise HttpError(400, "beside a list 'q', 'prefix' and 'constraints' are lists with one entry per item")
    try:
        items = [(text_field(p, "prefix", i + 1, "q item"), read_constraints(c, i + 1, "q item"))
                 for i, (p, c) in enumerate(zip(prefixes, per_item))]
    except ConfigError as e:
        raise HttpError(400, str(e).replace("q item: line", "q item")) from None
    if any(c for _, c in items):
        try:
            engine.plan.refuse_steering("'constraints'")
        except ConfigError as e:
            raise HttpError(400, str(e)) from None
    return items


def request_glossaries(value, use_server, direction: Direction, most: int) -> tuple[list[Glossary], bool]:
    """(the glossaries a request's sentences are matched against, the one that wins first; whether
    the first is the request's own): its ``glossary`` field ([source, target] pairs, read as a
    glossary file's lines) over its direction's --glossary unless ``server_glossary`` is false;
    ``glossary: false``: none at all; absent, null or true: the direction's alone. A 400 naming the
    field for a bad value, a 413 over ``most`` pairs."""
    if use_server is None:
        use_server = True
    if not isinstance(use_server, bool):
        raise HttpError(400, f"'server_glossary' must be true or false, got {shown(use_server)}")
    server = [direction.glossary] if direction.glossary is not None and use_server else []
    if value is False:
        return [], False
    if value is None or value is True or value == []:
        return server, False
    if not isinstance(value, list):
        raise HttpError(400, f"'glossary' must be a list of [source, target] pairs (target: a string, or a list of "
                        f"alternative forms), or false for none; got {shown(value)}")
    if len(value) > most:
        raise HttpError(413, f"'glossary' has {len(value):,} pairs, over the limit of {most:,} a request "
                        "(--max-glossary-terms)")
    try:
        direction.engine.plan.refuse_steering("'glossary'")
    except ConfigError as e:
        raise HttpError(400, str(e)) from None
    try:
        own = Glossary.from_pairs(value, "'glossary'")
    except ConfigError as e:
        raise HttpError(400, str(e)) from None
    unfit = unfit_term(own, direction.target_sp, direction.engine.max_source)
    if unfit:
        raise HttpError(400, unfit)
    crowded = crowded_term(own, direction.options.max_constraint_forms)
    if crowded:
        raise HttpError(413, crowded)
    return [own, *server], True


def unit_steering(items: list, units, direction) -> tuple[list, list]:
    """Each unit's target prefix and constraints (ids): a text's prefix goes to its first unit
    (its first sentence), its constraints to its only unit; a 400 for constraints on a text that
    is more than one unit (sentences or lines: a constraint belongs to one search)."""
    prefixes, constraints = [[] for _ in units.pieces], [[] for _ in units.pieces]
    for i, ((prefix, wanted), layout) in enumerate(zip(items, units.layouts)):
        parts = [p for p in layout.parts if isinstance(p, int)]
        if not parts:
            continue
        if wanted and len(parts) > 1:
            raise HttpError(400, f"q item {i + 1}: constraints apply to one sentence, and this text is {len(parts)} "
                            "(sentences or lines): send each in its own q item")
        try:
            prefixes[parts[0]] = encode_prefixes(direction.target_sp, [prefix], direction.engine.max_source, "q item",
                                                 i)[0]
            constraints[parts[0]] = encode_constraints(direction.target_sp, [wanted], direction.engine.max_source,
                                                       "q item", i)[0]
        except ConfigError as e:
            raise HttpError(400, str(e).replace("q item: line", "q item")) from None
    return prefixes, constraints


class Translation:
    """One POST /translate: its checked fields (``parse``), then its lines translated (``run``)."""

    def __init__(self, server: "Server", payload: dict, info: dict):
        self.server, self.info = server, info
        check_api_key(server, payload)
        q = payload.get("q")
        self.as_list = isinstance(q, list)
        texts = q if self.as_list else [q]
        if q is None or q == "" or q == []:
            raise HttpError(400, "'q' is empty: send the text to translate (a string or a list of strings)")
        if not all(isinstance(t, str) for t in texts):
            raise HttpError(400, "'q' must be a string or a list of strings")
        self.detected = None  # source "auto": the language chosen, LibreTranslate's detectedLanguage
        self.direction = self._direction(payload.get("source"), payload.get("target"), texts)
        info["direction"] = self.direction.code
        fmt = payload.get("format", "text")
        if fmt not in ("text", "html"):
            raise HttpError(400, f"'format' must be 'text' or 'html', got {shown(fmt)}")
        alternatives = payload.get("alternatives", 0)
        most = self.direction.options.nbest - 1
        if not isinstance(alternatives, int) or isinstance(alternatives, bool) or alternatives < 0:
            raise HttpError(400, f"'alternatives' must be a number from 0 to {most}, got {shown(alternatives)}")
        if alternatives > most:
            raise HttpError(400, f"'alternatives' {alternatives}: this server gives at most {most} "
                            f"(it runs with --nbest {most + 1})")
        self.alternatives = alternatives
        self.steer = steering_fields(payload, len(texts), self.as_list, fmt, self.direction.engine)
        self.glossaries, self.own_glossary = request_glossaries(payload.get("glossary"), payload.get("server_glossary"),
                                                                self.direction, server.options.max_glossary_terms)
        self.terms: list = []  # per unit: its glossary terms (find_terms), once the units are known
        self.stats = Stats()
        # lines: a final newline ends the last line, it starts none (a 100-line file was "101 lines")
        count, chars = sum(t.count("\n") + 1 - t.endswith("\n") for t in texts), sum(map(len, texts))
        self.documents = None  # format html: each text's Document; its blocks are the texts translated
        if fmt == "html" and chars <= server.options.max_chars:
            self.documents = [html_text.parse(t) for t in texts]
            self.lines = [text_lines(block.text, self.stats) for d in self.documents for block in d.blocks]
        else:
            self.lines = [text_lines(t, self.stats) for t in texts]  # per text, its lines
        info.update(lines=count, characters=chars)
        options = server.options
        if count > options.max_lines:
            raise HttpError(413, f"{count} lines are over the limit of {options.max_lines} a request (--max-lines)")
        if chars > options.max_chars:
            raise HttpError(413, f"{chars:,} characters are over the limit of {options.max_chars:,} a request (--max-chars)")

    def _direction(self, source, target, texts: list[str]) -> Direction:
        served = ", ".join(self.server.directions)
        if not isinstance(source, str) or not isinstance(target, str):
            raise HttpError(400, f"'source' and 'target' must be language codes; served: {served}")
        if source == "auto":
            source, confidence = self.server.detect("\n".join(texts))
            self.detected = {"language": source, "confidence": round(confidence, 4)}
        direction = self.server.directions.get(f"{source}-{target}")
        if direction is None:
            asked = f"{source}-{target}"  # a line break in it would break the one-line error
            raise HttpError(400, f"{asked if asked.isprintable() else shown(asked)} is not served; served: {served}")
        return direction

    async def run(self, arrived: float, receive) -> dict:
        """The answer, once the worker has decoded every line; a 504 past --timeout, a 499 when the
        client disconnects. Whatever ends the wait (those, or a cancel at shutdown), the lines not
        yet decoded leave the queue."""
        self.units = self._units()
        job = Job(self.direction, self.units.pieces, align=self.documents is not None)
        if self.steer is not None:
            job.prefixes, job.constraints = unit_steering(self.steer, self.units, self.direction)
        if self.glossaries:
            job.constraints = self._glossary_constraints(job.constraints)
        self._refuse_over_limits(job.constraints)
        if not any(self.units.pieces):  # whitespace only, a page without text: nothing to search, nothing queued
            return self._answer([[""] for _ in self.units.pieces], [None for _ in self.units.pieces],
                                [0.0 for _ in self.units.pieces])
        try:
            self.server.queue.submit(job)
        except QueueFull as e:
            raise HttpError(503, f"busy: {e}", {"Retry-After": str(e.retry_after)}) from None
        timeout = self.server.options.timeout
        answer, gone = asyncio.wrap_future(job.future), asyncio.ensure_future(disconnected(receive))
        try:
            done, _ = await asyncio.wait({answer, gone}, timeout=timeout - (time.perf_counter() - arrived),
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            dropped = self.server.queue.drop(job)
            self.info.update(queue_ms=job.queue_wait * 1000, decode_ms=job.decode_time * 1000)
            if dropped:
                self.info["dropped_lines"] = dropped
        if answer in done:
            self.server.metrics.lines.labels(self.direction.code).inc(len(self.units.pieces))
            return self._answer(answer.result(), job.alignments, job.means)
        answer.cancel()
        if gone in done:
            raise HttpError(CLIENT_GONE, "the client closed the connection")
        raise HttpError(504, f"no translation within {timeout:g} s (--timeout)")

    def _units(self) -> Units:
        """The units to search: each text's sentences (a sentence too long split to fit), or with
        --no-split-sentences its lines (a line too long truncated); a 413 past the queue's size."""
        sp, max_source = self.direction.sp, self.direction.engine.max_source
        if self.server.options.split_sentences:
            units = split_texts(self.lines, self.direction.source, sp, max_source)
        else:
            units = line_texts(self.lines, lambda lines: encode_lines(sp, lines, max_source, self.stats))
        self.info["sentences"] = len(units.pieces)
        most = self.server.options.max_queue_lines
        if len(units.pieces) > most:
            raise HttpError(413, f"the text splits into {len(units.pieces):,} sentences (pieces of the model's "
                            f"length), over the {most:,} the queue holds (--max-queue-lines)")
        return units

    def _refuse_over_limits(self, constraints: Optional[list]) -> None:
        """A 413 when a sentence's constraints (its own and its glossary terms) ask more than the
        direction's limits (--max-constraints ...), naming the q item whose text it is."""
        for unit, wanted in enumerate(constraints or []):
            problem = over_constraint_limits(wanted, self.direction.options)
            if problem:
                item = next(i for i, layout in enumerate(self.units.layouts) if unit in layout.parts) + 1
                raise HttpError(413, f"q item {item}: {problem}")

    def _glossary_constraints(self, own: Optional[list]) -> Optional[list]:
        """Each unit's constraints (ids) with its glossary terms' added after its own; the terms are
        found in each unit as the model reads it (its subwords decoded: sentencepiece's
        normalization applied, a line's truncated end gone), so a sentence of a paragraph gets
        the terms of that sentence only."""
        sp, pieces = self.direction.sp, self.units.pieces
        self.terms = [find_terms(sp.decode(ids), self.glossaries) if ids else [] for ids in pieces]
        if not any(self.terms):
            return own
        wanted = encode_constraints(self.direction.target_sp, [[forms for _, forms, _ in terms] for terms in self.terms],
                                    self.direction.engine.max_source, "glossary", 0)  # checked: every form fits
        return [mine + theirs for mine, theirs in zip(own or [[] for _ in pieces], wanted)]

    def _glossary_report(self, found: list[list[str]]) -> list[list[dict]]:
        """Per q item, the glossary terms found in its text (first found first): {"source": the term
        lowercased, "target": its forms, "from": "request" or "server", "inTranslation": whether
        every sentence it was found in has one of its forms in its best translation, as the model
        writes the form}. A sentence whose constraints no hypothesis met has its unconstrained
        translation (no error): there the term is usually not in it."""
        sp, layouts = self.direction.target_sp, self.units.layouts
        if self.documents is None:
            items = [[layout] for layout in layouts]
        else:  # a document's blocks are consecutive layouts
            sizes = [len(document.blocks) for document in self.documents]
            items = [layouts[sum(sizes[:k]):sum(sizes[:k + 1])] for k in range(len(sizes))]
        written: dict[str, list[str]] = {}
        report = []
        for item in items:
            terms: dict[str, dict] = {}
            for unit in (part for layout in item for part in layout.parts if isinstance(part, int)):
                for source, forms, g in self.terms[unit]:
                    if source not in written:
                        written[source] = [sp.decode(ids) for ids in encode_target(sp, forms, out_type=int)]
                    hit = any(form in found[unit][0] for form in written[source])
                    entry = terms.setdefault(source, {"source": source, "target": forms, "from": "request"
                                                      if self.own_glossary and g == 0 else "server",
                                                      "inTranslation": True})
                    entry["inTranslation"] = entry["inTranslation"] and hit
            report.append(list(terms.values()))
        return report

    def _answer(self, found: list[list[str]], alignments: list, means: list[float]) -> dict:
        def text(layout, k):  # the k-th hypothesis of each unit (its last where it has fewer)
            return layout.render(lambda i: found[i][min(k, len(found[i]) - 1)])

        def alternatives(layout):
            most = max((len(found[i]) for i in layout.parts if isinstance(i, int)), default=1) - 1
            return [text(layout, k) for k in range(1, 1 + min(self.alternatives, most))]

        layouts = self.units.layouts
        translated = [text(layout, 0) for layout in layouts]
        alts = [alternatives(layout) for layout in layouts] if self.alternatives else None
        confidence = self._confidence(translated, means)
        if self.documents is not None:
            translated, alts = self._documents(translated, alts, found, alignments)
        answer: dict = {"translatedText": translated if self.as_list else translated[0],
                        "confidence": confidence if self.as_list else confidence[0]}
        if self.alternatives:
            answer["alternatives"] = alts if self.as_list else alts[0]
        if self.detected is not None:
            answer["detectedLanguage"] = self.detected
        if self.glossaries:
            report = self._glossary_report(found)
            answer["glossaryTerms"] = report if self.as_list else report[0]
        truncated, split_long = self.stats.truncated, self.units.split_long
        if truncated:  # never silent: the answer says how many lines lost their end
            answer["truncated"] = truncated
        self.server.count_text(truncated, split_long)
        self.info.update(invalid_utf8=self.stats.invalid_utf8, truncated=truncated, split_long=split_long)
        return answer


    def _confidence(self, translated: list[str], means: list[float]) -> list[float]:
        """Each q item's confidence (an extra field: LibreTranslate's clients ignore it): that of
        its text (html: of its blocks, the lowest) with its weakest sentence's log-probability."""
        sources = ["\n".join(lines) for lines in self.lines]
        weakest = [min((means[i] for i in layout.parts if isinstance(i, int)), default=0.0)
                   for layout in self.units.layouts]
        values = self.direction.scorer.confidences(sources, translated, weakest)
        if self.documents is None:
            return [round(v, 6) for v in values]
        per_document, at = [], 0
        for document in self.documents:
            per_document.append(round(min(values[at:at + len(document.blocks)], default=1.0), 6))
            at += len(document.blocks)
        return per_document

    def _documents(self, translated: list[str], alts: Optional[list[list[str]]], found: list[list[str]],
                   alignments: list):
        """Format html: each document with its blocks' translations in place (``html_text``), the
        inline tags where the best hypothesis's word alignment puts them, a point between two
        sentences between their translations; an alternative, which has no alignment here, gets
        them at the same relative places."""
        sp = self.direction.sp
        pairs = [block_pairs(layout, self.units.pieces, found, alignments, sp) for layout in self.units.layouts]
        documents, alternatives, at = [], [], 0
        for document in self.documents:
            n = len(document.blocks)
            documents.append(document.render([(t, *p) for t, p in zip(translated[at:at + n], pairs[at:at + n])]))
            if alts is not None:
                mine = alts[at:at + n]
                alternatives.append([document.render([(a[min(k, len(a) - 1)] if a else t, None, None)
                                                      for a, t in zip(mine, translated[at:at + n])])
                                     for k in range(max(map(len, mine), default=0))])
            at += n
        return documents, alternatives if alts is not None else None


def block_pairs(layout, pieces: list[list[int]], found: list[list[str]], alignments: list, sp):
    """A block's (source word, target word) pairs over its whole text: each unit's alignment moved
    by the words of the units before it (source: its subwords' word starts; target: its best
    translation's words), or None where a unit has none; and its anchors, the unit boundaries
    {source word: target word} (``html_text.place_tags``)."""
    pairs, anchors, source_at, target_at = [], {0: 0}, 0, 0
    for part in layout.parts:
        if not isinstance(part, int):
            continue
        if pairs is not None and (part >= len(alignments) or alignments[part] is None):
            pairs = None
        if pairs is not None:
            pairs.extend((s + source_at, t + target_at) for s, t in alignments[part])
        source_at += sum(sp.id_to_piece(i).startswith("\u2581") for i in pieces[part])
        target_at += len(found[part][0].split())
        anchors[source_at] = target_at
    return pairs, anchors


class Server:
    """What the handlers share: the directions, the queue, the options, the keys and the metrics."""

    def __init__(self, directions: list[Direction], options: ServeOptions, api_keys: list[str]):
        self.directions = {d.code: d for d in directions}
        self.options, self.api_keys = options, api_keys
        self.metrics = Metrics()
        self.queue = BatchQueue(options.max_batch_tokens, options.max_wait_ms, options.max_queue_lines,
                                on_batch=lambda n, _s: self.metrics.batch.observe(n), on_depth=self.metrics.queue.set)
        self.statuses: dict[int, int] = {}  # for the summary at exit
        self.outcomes: dict[str, int] = {}  # how each request ended (``outcome``), for the summary
        self.past_grace = asyncio.Event()  # shutdown: --grace-seconds are over, answer 503 now
        self.in_flight: set[asyncio.Task] = set()  # the requests being handled (AccessLog)
        self.page = resources.files("xformer_cli").joinpath("serve_page.html").read_bytes()
        self.language_id = LanguageId.load(sorted({d.source for d in directions}))  # None without py3langid
        self.truncated = self.split_long = 0  # over the model's positions: lines cut, sentences split (summary)

    def count_text(self, truncated: int, split_long: int) -> None:
        self.truncated += truncated
        self.split_long += split_long

    def detect(self, text: str) -> tuple[str, float]:
        """(language, confidence) of ``text`` among the served source languages; a 400 naming why
        when there is none (a 400 too without the detect extra)."""
        if self.language_id is None:
            raise HttpError(400, "language detection needs py3langid on the server (pip install 'xformer-cli[detect]'): "
                            "name the source language")
        sources = ", ".join(self.language_id.languages) or "none"
        try:
            language = self.language_id.choose(text)
        except UnknownLanguage as e:
            raise HttpError(400, f"source 'auto': {e}; this server translates from: {sources}") from None
        served, _ = self.language_id.rank(text)
        return language, dict(served)[language]

    def app(self):
        """The ASGI application: the routes inside the access log; Starlette's own answers (404,
        405, 500) as JSON like every other."""
        from starlette.applications import Starlette
        from starlette.exceptions import HTTPException
        from starlette.responses import JSONResponse
        from starlette.routing import Route

        def http_error(request, e: HTTPException):
            return JSONResponse({"error": e.detail}, status_code=e.status_code, headers=e.headers)

        def internal_error(request, e: Exception):  # the cause goes to the log (AccessLog), not to the client
            return JSONResponse({"error": "internal error"}, status_code=500)

        routes = [
            Route("/", self.index, methods=["GET"]),
            Route("/translate", self.translate, methods=["POST"]),
            Route("/translate_file", self.translate_file, methods=["POST"]),
            Route("/detect", self.detect_page, methods=["POST"]),
            Route("/languages", self.languages, methods=["GET"]),
            Route("/frontend/settings", self.settings, methods=["GET"]),
            Route("/health", self.health, methods=["GET"]),
            Route("/metrics", self.metrics_page, methods=["GET"]),
        ]
        handlers = {HTTPException: http_error, Exception: internal_error}
        return AccessLog(Starlette(routes=routes, exception_handlers=handlers), self)

    def run(self, sock: socket.socket) -> None:
        """Serve on ``sock`` (listening) until SIGTERM or Ctrl-C, then shut down (the module's
        docstring): every request answered, the worker ended between batches."""
        import uvicorn

        config = uvicorn.Config(self.app(), log_config=None, log_level="warning", access_log=False, lifespan="off",
                                timeout_graceful_shutdown=self.options.grace_seconds + BACKSTOP_SECONDS)
        # uvicorn takes SIGTERM and SIGINT while it serves and raises them again once it has shut down.
        # Before (a signal on the way in) they are kept and passed on to it; after, they are the end of
        # a clean shutdown (exit 0, not the CLI's "stopped by SIGTERM"), ignored while the worker ends
        # its batch: a search is never cut short.
        early: list[int] = []
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGTERM, signal.SIGINT):
                signal.signal(signum, lambda signum, _frame: early.append(signum))
        self.queue.start()
        try:
            asyncio.run(self._serve(uvicorn.Server(config), sock, early))
        finally:
            self.queue.stop()

    async def _serve(self, uvi, sock: socket.socket, early: list[int]) -> None:
        grace = asyncio.ensure_future(self._grace(uvi))
        serving = asyncio.ensure_future(uvi.serve(sockets=[sock]))
        await asyncio.sleep(0)  # its first step has taken the signals over
        for signum in early:
            uvi.handle_exit(signum, None)
        try:
            await serving
        finally:
            # uvicorn returns once the connections are closed, or at once on a second Ctrl-C: the
            # requests left are answered (503) before the loop ends, which would cancel them
            self.past_grace.set()
            if self.in_flight:
                await asyncio.wait(set(self.in_flight), timeout=ANSWER_SECONDS)
            grace.cancel()

    async def _grace(self, uvi) -> None:
        """Once uvicorn is asked to exit: the queue drains, and after --grace-seconds (a second
        Ctrl-C: at once) the requests still unanswered get their 503."""
        while not uvi.should_exit:
            await asyncio.sleep(0.05)
        self.queue.drain()
        seconds = self.options.grace_seconds
        print(f"xf serve | shutting down | requests in flight {len(self.in_flight)} | "
              f"answered for at most {seconds:g} s (--grace-seconds)", file=sys.stderr, flush=True)
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline and not uvi.force_exit:
            await asyncio.sleep(0.05)
        self.past_grace.set()

    async def _translated(self, request, payload_of):
        """The answer of a translation request, or the JSON error response: the fields of the
        request, ``payload_of(fields, info)`` the translation's fields, the latency observed."""
        from starlette.responses import JSONResponse

        info = request.scope.setdefault("xf", {})
        arrived = time.perf_counter()
        try:
            fields = await request_fields(request, self.options.max_body_bytes, info)
            return await Translation(self, payload_of(fields, info), info).run(arrived, request.receive)
        except HttpError as e:
            info["error"] = str(e)
            return JSONResponse({"error": str(e)}, status_code=e.status, headers=e.headers)
        finally:
            self.metrics.latency.observe(time.perf_counter() - arrived)

    async def translate(self, request):
        from starlette.responses import JSONResponse

        answer = await self._translated(request, lambda fields, info: fields)
        return answer if not isinstance(answer, dict) else JSONResponse(answer)

    async def translate_file(self, request):
        """LibreTranslate's POST /translate_file: a multipart ``file`` (.txt, UTF-8) translated as one
        ``q``; the answer's ``translatedFileUrl`` is a data: URL holding the translated file (xf keeps
        no files to download later)."""
        import base64

        from starlette.responses import JSONResponse

        def payload_of(fields: dict, info: dict) -> dict:
            upload = fields.get("file")
            if not isinstance(upload, dict):
                raise HttpError(400, "send the file as the multipart field 'file' (a .txt file)")
            name = upload["filename"]
            if not name.lower().endswith(".txt"):
                raise HttpError(400, f"file {shown(name)}: only .txt files are translated")
            text = upload["data"].decode("utf-8", errors="replace")
            if upload["data"] and text.encode("utf-8") != upload["data"]:
                info["invalid_utf8_body"] = True
            return {**{k: v for k, v in fields.items() if k != "file"}, "q": text, "format": "text"}

        answer = await self._translated(request, payload_of)
        if not isinstance(answer, dict):
            return answer
        data = base64.b64encode(answer["translatedText"].encode("utf-8")).decode("ascii")
        result = {"translatedFileUrl": f"data:text/plain;charset=utf-8;base64,{data}"}
        return JSONResponse({**result, **{k: v for k, v in answer.items() if k in ("truncated", "detectedLanguage")}})

    async def detect_page(self, request):
        """LibreTranslate's POST /detect: ``[{"language": "en", "confidence": 0.97}, ...]``, the served
        source languages best first."""
        from starlette.responses import JSONResponse

        info = request.scope.setdefault("xf", {})
        try:
            fields = await request_fields(request, self.options.max_body_bytes, info)
            check_api_key(self, fields)
            q = fields.get("q")
            if not isinstance(q, str) or not q.strip():
                raise HttpError(400, "'q' is empty: send the text whose language to detect (a string)")
            if len(q) > self.options.max_chars:
                raise HttpError(413, f"{len(q):,} characters are over the limit of {self.options.max_chars:,} a request "
                                "(--max-chars)")
            if self.language_id is None:
                self.detect(q)  # the 400 that names the extra
            served, _ = self.language_id.rank(q)
        except HttpError as e:
            info["error"] = str(e)
            return JSONResponse({"error": str(e)}, status_code=e.status, headers=e.headers)
        return JSONResponse([{"language": code, "confidence": round(p, 4)} for code, p in served])

    async def languages(self, request):
        from starlette.responses import JSONResponse

        targets: dict[str, list[str]] = {}
        for d in self.directions.values():
            targets.setdefault(d.source, []).append(d.target)
        return JSONResponse([{"code": code, "name": language_name(code), "targets": sorted(t)}
                             for code, t in sorted(targets.items())])

    async def settings(self, request):
        """What a client may offer, in the shape of LibreTranslate's ``/frontend/settings`` where it
        fits (charLimit, apiKeys, keyRequired, language, suggestions, filesTranslation) and xf's own
        keys beside: lineLimit, alternativesLimit (the most ``alternatives`` a request may ask for),
        detection (whether source ``auto`` is taken), names (every served code's name), glossaries
        (the directions with a --glossary) and glossaryLimit (the most pairs of a request's own)."""
        from starlette.responses import JSONResponse

        first = next(iter(self.directions.values()))
        codes = sorted({code for d in self.directions.values() for code in (d.source, d.target)})
        return JSONResponse({
            "charLimit": self.options.max_chars, "lineLimit": self.options.max_lines,
            "alternativesLimit": self.options.nbest - 1, "detection": bool(self.language_id and self.language_id.languages),
            "apiKeys": bool(self.api_keys), "keyRequired": bool(self.api_keys),
            "language": {"source": {"code": first.source, "name": language_name(first.source)},
                         "target": {"code": first.target, "name": language_name(first.target)}},
            "names": {code: language_name(code) for code in codes},
            "glossaries": [code for code, d in self.directions.items() if d.glossary is not None],
            "glossaryLimit": self.options.max_glossary_terms,
            "suggestions": False, "filesTranslation": True, "supportedFilesFormat": [".txt"],
        })

    async def health(self, request):
        from starlette.responses import JSONResponse

        return JSONResponse({"status": "ready", "directions": list(self.directions),
                             "queue_lines": self.queue.lines})

    async def metrics_page(self, request):
        from starlette.responses import Response

        body, content_type = self.metrics.render()
        return Response(body, media_type=content_type)

    async def index(self, request):
        from starlette.responses import Response

        return Response(self.page, media_type="text/html; charset=utf-8")
