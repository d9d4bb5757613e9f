"""One ``/translate`` request's work: its fields read into steering (prefix, constraints,
glossaries: ``steering_fields``, ``request_glossaries``), its text split into units, batched
through the queue and joined back (``Translation``), and an HTML document's inline tags placed by
the word alignment (``block_pairs``).
"""

from __future__ import annotations

import asyncio
import hmac
import time
from typing import Optional

from ..base.errors import ConfigError
from ..decode.steering import crowded_term, encode_constraints, encode_prefixes, over_constraint_limits, read_constraints, text_field, unfit_term
from ..decode.translate import Stats, encode_lines
from ..text import html_text
from ..text.formality import FORMALITIES
from ..text.glossary import Glossary, find_terms
from ..text.segment import Units, line_texts, split_texts
from ..text.vocab import encode_target
from .access_log import CLIENT_GONE
from .batch_queue import Direction, Job, QueueFull
from .fields import HttpError, disconnected, shown, text_lines


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


def check_api_key(server, fields: dict) -> None:
    """A 403 unless ``server`` (the ``Server``) needs no key or ``api_key`` (body or query string) is one of its keys."""
    if server.api_keys:
        key = fields.get("api_key")
        if not isinstance(key, str) or not any(hmac.compare_digest(key.encode(), k.encode()) for k in server.api_keys):
            raise HttpError(403, "Invalid API key" if key else "an API key is needed: send it as 'api_key'")


class Translation:
    """One POST /translate for ``server`` (the ``Server``): its checked fields (``parse``), then its lines
    translated (``run``)."""

    def __init__(self, server, payload: dict, info: dict):
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
        self.direction = self._formality(payload.get("formality"), fmt)
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

    def _formality(self, formality, fmt: str) -> Direction:
        """The direction with the address ``formality`` asks for (an xf extension of LibreTranslate's
        body: formal or informal; absent or null: the model's own choice); a 400 where the
        direction's model has no formality tags, and with format html (an inline tag is placed by
        word alignment, which counts one tag at most before a sentence)."""
        if formality is None:
            return self.direction
        if formality not in FORMALITIES:
            raise HttpError(400, f"'formality' must be formal or informal, got {shown(formality)}")
        variant = self.direction.variants.get(formality)
        if variant is None:
            raise HttpError(400, f"{self.direction.code} does not take 'formality': its model has no formality tags "
                            "for this target (see /frontend/settings' formality)")
        if fmt != "text":
            raise HttpError(400, "'formality' takes format 'text' only")
        return variant

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
