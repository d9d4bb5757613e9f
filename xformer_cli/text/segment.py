"""Texts to the units a model translates, and the translations put back into the texts' shape.

A text (a ``q`` of xf serve, a line of ``xf translate --split-sentences``) is read line by line;
each line is split into sentences by sentencex (Wikimedia's rule-based segmenter: on newstest
paragraphs it found sentence boundaries as well as pysbd and some hundred times faster; the
figures are in docs/serve.md). What lies between the sentences (spaces, tabs, the line breaks)
is kept verbatim, so a translation has its text's paragraphs, blank lines and indentation.

A sentence longer than the model's ``max_source`` subwords is split to fit (``fit``): after
clause punctuation if there is one, else between words, else between subwords; its pieces are
translated as sentences and joined again. Without sentence splitting (``xf serve
--no-split-sentences``, ``xf translate`` without ``--split-sentences``) a line is one unit and a
line too long is truncated, as ``decode.translate.encode_lines`` does; either way each is counted.

A ``Layout`` is how one text is put back: verbatim strings and the indices of its units.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Union

# A cut after a piece ending in one of these is a clause boundary (the best place to split a
# sentence too long for the model, short of a sentence boundary).
CLAUSE_END = frozenset(",;:)]}»”“\"'—–-…")
WORD_START = "\u2581"  # sentencepiece's word-start mark


def sentence_spans(line: str, language: str) -> list[tuple[int, int]]:
    """(start, end) of each sentence of ``line``, its surrounding whitespace left out: sentencex's
    sentences, found again in the line in order. What lies between two spans is whitespace only;
    where sentencex's answer does not fit the line so (it never should), the line is one sentence,
    so no text is ever lost."""
    import sentencex

    if not line.strip():
        return []
    spans, at = [], 0
    for sentence in sentencex.segment(language, line):
        sentence = sentence.strip()
        if not sentence:
            continue
        start = line.find(sentence, at)
        if start < 0 or line[at:start].strip():
            break
        spans.append((start, start + len(sentence)))
        at = start + len(sentence)
    else:
        if not line[at:].strip():
            return spans
    stripped = line.strip()
    start = line.find(stripped)
    return [(start, start + len(stripped))]


def cut_rank(pieces: list[str], j: int) -> int:
    """How good a cut before piece j is: 2 after clause punctuation at a word start, 1 at a word
    start, 0 inside a word."""
    if not pieces[j].startswith(WORD_START):
        return 0
    return 2 if pieces[j - 1] and pieces[j - 1][-1] in CLAUSE_END else 1


def fit(ids: list[int], max_len: int, piece: Callable[[int], str]) -> list[list[int]]:
    """``ids`` in chunks of at most ``max_len``, each cut at the best place in the second half of
    its window (clause punctuation, then a word start, the latest of the best; so a chunk holds at
    least half of ``max_len``), or in the whole window when its second half has no word start,
    else at ``max_len`` itself. piece(id) -> the piece's text (sentencepiece's id_to_piece)."""
    if len(ids) <= max_len:
        return [ids]
    pieces = [piece(i) for i in ids]
    chunks, start = [], 0
    while len(ids) - start > max_len:
        end = start + max_len
        best = max(range(start + max(1, max_len // 2), end + 1), key=lambda j: (cut_rank(pieces, j), j))
        if cut_rank(pieces, best) == 0:
            best = max(range(start + 1, end + 1), key=lambda j: (cut_rank(pieces, j), j))
        chunks.append(ids[start:best])
        start = best
    chunks.append(ids[start:])
    return chunks


@dataclass
class Layout:
    """One text's translation: ``parts`` in order, each a verbatim string or the index of a unit
    whose translation goes there."""

    parts: list[Union[str, int]] = field(default_factory=list)

    def render(self, translation: Callable[[int], str]) -> str:
        return "".join(part if isinstance(part, str) else translation(part) for part in self.parts)


@dataclass
class Units:
    """The units of some texts (subword ids, one search each) and each text's ``Layout``.
    sentences: sentences (or lines) they hold; split_long: sentences over the model's positions,
    split to fit (``fit``)."""

    pieces: list[list[int]] = field(default_factory=list)
    layouts: list[Layout] = field(default_factory=list)
    sentences: int = 0
    split_long: int = 0


def leading_tags(sp) -> list[int]:
    """The tag ids a source vocabulary puts before every sentence, in order: each wrapper with a
    ``tag_id`` (``languages.TaggedVocabulary``, then ``formality_tags.FormalityVocabulary``)
    adds its own in front of what the vocabulary it wraps writes."""
    tags = []
    while hasattr(sp, "tag_id"):
        tags.append(sp.tag_id)
        sp = sp.sp
    return tags


def split_texts(texts: list[list[str]], language: str, sp, max_source: int) -> Units:
    """The sentences of each text (given as its lines) as units, a sentence too long in pieces that
    fit; each text's lines joined by LF, the whitespace around its sentences kept."""
    sentences: list[str] = []
    layouts = []
    for lines in texts:  # first the layouts, with the sentences' numbers where they go
        layout = Layout()
        for n, line in enumerate(lines):
            if n:
                layout.parts.append("\n")
            at = 0
            for start, end in sentence_spans(line, language):
                layout.parts.extend([line[at:start], len(sentences)])
                sentences.append(line[start:end])
                at = end
            layout.parts.append(line[at:])
        layouts.append(layout)
    # a vocabulary that puts tags first (a multilingual model's target tag, a formality tag): the
    # sentence's own ids are fitted, and every chunk starts with the tags (a position each)
    lead = leading_tags(sp)
    room = max_source - len(lead)
    chunks = [[lead + chunk for chunk in fit(ids[len(lead):], room, sp.id_to_piece)] if ids else [ids]
              for ids in sp.encode(sentences, out_type=int)]  # one call: fast
    units = Units(layouts=[Layout() for _ in layouts], sentences=len(sentences))
    for layout, put in zip(layouts, units.layouts):  # then each sentence's number becomes its units'
        for part in layout.parts:
            if isinstance(part, str):
                put.parts.append(part)
                continue
            units.split_long += len(chunks[part]) > 1
            for k, chunk in enumerate(chunks[part]):
                if k and sp.id_to_piece(chunk[len(lead)]).startswith(WORD_START):
                    put.parts.append(" ")  # the chunks of one sentence join as its words did
                put.parts.append(len(units.pieces))
                units.pieces.append(chunk)
    return units


def line_texts(texts: list[list[str]], encode: Callable[[list[str]], list[list[int]]]) -> Units:
    """Each line of each text as one unit (no sentence splitting); encode(lines) -> their ids
    (``decode.translate.encode_lines``, which truncates and counts what it cuts)."""
    units = Units(pieces=encode([line for lines in texts for line in lines]))
    at = 0
    for lines in texts:
        layout = Layout()
        for n in range(len(lines)):
            layout.parts.extend(["\n", at + n] if n else [at + n])
        at += len(lines)
        units.layouts.append(layout)
    units.sentences = at
    return units

