"""HTML documents to the texts a model translates, and the translations put back into the markup.

The document is tokenized by the standard library's ``html.parser`` (the HTML5 tokenizer's rules:
a ``<`` that opens no tag is text, unquoted attributes, ``<script>``/``<style>`` content raw),
and every token is kept as the bytes it was in the document: only the words of text change. A
document is ``parts``: verbatim markup (any tag but the inline ones, comments, the doctype, a
tag or comment left open at the end, and whole ``<script>``, ``<style>``, ``<code>``, ``<pre>``,
``<textarea>`` elements, and any with ``translate="no"`` or class ``notranslate``) and
``Block``s: the text between two such parts, with the inline tags inside it (``<b>``,
``<a href>``, ``<span>``, ...). Since the markup is the document's own, a browser builds the same
tree of the answer as of the question: broken HTML stays broken in the same way, and HTML
well-formed stays so (inline tags are put back balanced).

A block's text is translated as one line (its whitespace runs, which HTML renders as one space,
made one space); its inline tags go around the target words aligned with the source words they
wrapped (``place_tags``; how that was chosen against placeholders: docs/serve.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from html.parser import HTMLParser
from typing import Optional, Sequence, Union

INLINE = frozenset("a abbr b bdi bdo big cite data del dfn em font i ins label mark q s small span strike "
                   "strong sub sup time tt u".split())
POINT = frozenset("br img wbr".split())  # void inline elements: a point in the text, carried as a tag is
VERBATIM = frozenset("script style code pre textarea kbd samp var".split())  # kept whole, never translated
INLINE_VERBATIM = frozenset("code kbd samp var")  # those that sit in a sentence: a point in it
ENTITY_FREE = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;"})
# A tag, end tag, comment, doctype or processing instruction begun and never finished: to the end of
# the document, markup that a browser's tokenizer drops or reads as a comment, never text ("<" then
# a space, or "</" at the very end, is text).
OPEN_AT_END = re.compile(r"<([A-Za-z!?]|/.)", re.S)
MAX_DEPTH = 100  # inline tags nested deeper are points: the walks of a block's tree recurse once a level


@dataclass
class Tag:
    """An inline tag of a block: its markup, and where it is: before source word ``at`` (a point)
    or around source words [at, end) (a pair: ``close`` its end tag's markup)."""

    open: str
    at: int
    end: Optional[int] = None
    close: str = ""
    children: list["Tag"] = field(default_factory=list)
    # a point between two words: whether whitespace was written before it and after it (`a <img> b`,
    # `a<img> b`, `a <img>b`), which render_block keeps
    space_before: bool = True
    space_after: bool = False


@dataclass
class Block:
    """One run of text: its words (entities decoded), the whitespace around it as written, and
    its inline tags as a tree (pairs nest; a point is a leaf)."""

    words: list[str]
    lead: str = ""
    trail: str = ""
    tags: list[Tag] = field(default_factory=list)
    raw: str = ""  # the run as written (what a block without words renders as)

    @property
    def text(self) -> str:
        return " ".join(self.words)


@dataclass
class Document:
    parts: list[Union[str, Block]]

    @property
    def blocks(self) -> list[Block]:
        """The blocks that hold words: those translated."""
        return [p for p in self.parts if isinstance(p, Block) and p.words]

    def render(self, translated: Sequence[tuple[str, Optional[Sequence[tuple[int, int]]], Optional[dict[int, int]]]]) -> str:
        """The document with each block of ``blocks`` replaced by its (translation, word alignment
        (source, target) pairs or None, anchors or None: ``place_tags``) in order."""
        out, found = [], iter(translated)
        for part in self.parts:
            if isinstance(part, str):
                out.append(part)
            elif not part.words:
                out.append(part.raw)
            else:
                text, pairs, anchors = next(found)
                out.append(part.lead + render_block(part, text.split(), pairs, anchors) + part.trail)
        return "".join(out)


def attributes_say_no(attrs: list[tuple[str, Optional[str]]]) -> bool:
    for name, value in attrs:
        if name == "translate" and (value or "").strip().lower() == "no":
            return True
        if name == "class" and "notranslate" in (value or "").split():
            return True
    return False


class Tokens(HTMLParser):
    """(kind, start offset, name, attrs) of each token of a document; kind: start, end, startend,
    data, other (comment, doctype, processing instruction). A token's markup is the document from
    its start to the next token's."""

    def __init__(self, document: str):
        super().__init__(convert_charrefs=True)
        self.document, self.tokens = document, []
        self.line_starts = [0] + [m.end() for m in re.finditer("\n", document)]

    def _at(self) -> int:
        line, column = self.getpos()
        return self.line_starts[line - 1] + column

    def handle_starttag(self, tag, attrs):
        self.tokens.append(("start", self._at(), tag, attrs))

    def handle_startendtag(self, tag, attrs):
        self.tokens.append(("startend", self._at(), tag, attrs))

    def handle_endtag(self, tag):
        self.tokens.append(("end", self._at(), tag, []))

    def handle_data(self, data):
        self.tokens.append(("data", self._at(), data, []))

    def handle_comment(self, data):
        self.tokens.append(("other", self._at(), "", []))

    handle_decl = handle_pi = unknown_decl = handle_comment


def tokens(document: str) -> list[tuple[str, str, str, list, str]]:
    """(kind, markup, name, attrs, decoded text) of each token, the markups adding up to the document;
    kind ``open``: markup left open at the end (``OPEN_AT_END``)."""
    parser = Tokens(document)
    parser.feed(document)
    left = parser.rawdata  # what feed() could not finish; close() would give a tag or comment left open as text
    if OPEN_AT_END.match(left):
        parser.tokens.append(("open", len(document) - len(left), "", []))
    else:
        parser.close()
    found = parser.tokens
    starts = [t[1] for t in found] + [len(document)]
    if not found or starts[0] != 0:  # nothing is ever lost: what the parser skipped stays as written
        found.insert(0, ("other", 0, "", []))
        starts.insert(0, 0)
    out = []
    for (kind, start, name, attrs), end in zip(found, starts[1:]):
        raw = document[start:end]
        out.append((kind, raw, name if kind != "data" else "", attrs, name if kind == "data" else ""))
    return out


def parse(document: str) -> Document:
    """The document's parts: verbatim markup and blocks (see the module's docstring)."""
    parts: list[Union[str, Block]] = []
    run: list[tuple] = []  # the tokens of the block being read
    skip: Optional[tuple[str, int, bool]] = None  # inside a verbatim element: (its name, depth, inline)
    held: list[str] = []  # the markup of the verbatim element being read

    def flush():
        if run:
            parts.append(make_block(run))
            run.clear()

    for kind, raw, name, attrs, text in tokens(document):
        if skip is not None:
            held.append(raw)
            tag, depth, inline = skip
            if name == tag and kind == "start":
                skip = (tag, depth + 1, inline)
            elif name == tag and kind == "end":
                skip = (tag, depth - 1, inline) if depth > 1 else None
            if skip is None:
                (run.append(("point", "".join(held), "")) if inline else parts.append("".join(held)))
                held.clear()
            continue
        if kind == "start" and (name in VERBATIM or attributes_say_no(attrs)):
            inline = name in INLINE_VERBATIM or name in INLINE
            if not inline:
                flush()
            skip, held = (name, 1, inline), [raw]
            continue
        if kind == "data":
            run.append(("text", raw, text))
        elif kind == "other" or name in POINT or (kind == "startend" and name in INLINE):
            (run.append(("point", raw, name)) if run or kind != "other" else parts.append(raw))
        elif name in INLINE:
            run.append((kind, raw, name))
        else:
            flush()
            parts.append(raw)
    if held:  # a verbatim element never closed: the rest of the document as written
        flush()
        parts.append("".join(held))
    flush()
    return Document(parts)


def make_block(run: list[tuple]) -> Block:
    """A block of the run's tokens: its words, and its inline tags paired into a tree (an end tag
    closes the latest open tag of its name, the ones opened since becoming points; an end tag
    with none open, a tag never closed, and one opened deeper than ``MAX_DEPTH``, are points)."""
    raw = "".join(item[1] for item in run)
    plain = "".join(item[2] for item in run if item[0] == "text")
    if not plain.strip():
        return Block([], raw=raw)
    words, marks = [], []  # marks: (word index before which, kind, markup, name, spaces: (before, after) or None)
    glued = False  # the last text ended inside a word: a text starting without a space goes on with it
    for j, (kind, markup, value) in enumerate(run):
        if kind != "text":
            spaces = None
            if kind == "point":  # the whitespace written beside it, where text is beside it
                before = run[j - 1][2][-1:].isspace() if j and run[j - 1][0] == "text" else True
                after = run[j + 1][2][:1].isspace() if j + 1 < len(run) and run[j + 1][0] == "text" else False
                spaces = (before, after)
            marks.append((len(words), kind, markup, value, spaces))
            glued = glued and value != "br"  # a line break ends a word (`sleeps.<br>A` is two)
            continue
        split = value.split()
        if glued and split and not value[:1].isspace():
            # a tag inside a word (un<b>bel</b>ievable, link</a>.): the word is one, and a start
            # tag or point there goes before it, an end tag after it
            words[-1] += split.pop(0)
            marks = [(i - 1, k, m, n, None) if i == len(words) and k != "end" else (i, k, m, n, sp)
                     for i, k, m, n, sp in marks]  # moved before the word: spaced as any tag there
        words.extend(split)
        glued = bool(words) and not value[-1:].isspace()
    lead = plain[:len(plain) - len(plain.lstrip())]
    trail = plain[len(plain.rstrip()):]
    root = Tag("", 0, len(words))
    stack: list[tuple[Tag, str]] = [(root, "")]
    for index, kind, markup, name, spaces in marks:
        if kind == "start" and len(stack) <= MAX_DEPTH:
            tag = Tag(markup, index)
            stack[-1][0].children.append(tag)
            stack.append((tag, name))
        elif kind == "end" and any(n == name for _, n in stack[1:]):
            while stack[-1][1] != name:
                stack.pop()[0].end = None  # never closed: a point
            tag, _ = stack.pop()
            tag.end, tag.close = index, markup
        else:
            stack[-1][0].children.append(Tag(markup, index, **(dict(zip(("space_before", "space_after"), spaces))
                                                               if spaces else {})))
    for tag, _ in stack[1:]:
        tag.end = None
    flatten_points(root)
    return Block(words, lead, trail, root.children, raw)


def flatten_points(tag: Tag) -> None:
    """An open tag never closed is a point: its children move up to its parent, after it."""
    kids = []
    for child in tag.children:
        flatten_points(child)
        if child.end is None and child.children:
            kids.append(Tag(child.open, child.at))
            kids.extend(child.children)
        else:
            kids.append(child)
    tag.children = kids


def place_tags(tags: list[Tag], source_words: int, target_words: int,
               pairs: Optional[Sequence[tuple[int, int]]],
               anchors: Optional[dict[int, int]] = None) -> list[tuple[Tag, int, int]]:
    """Each tag of the tree with its target span [start, end) (a point: start == end): a pair
    around the target words aligned with its source words, a point before the target word aligned
    with the source word after it; without an alignment (or none for those words) the same
    relative position. ``anchors``: source boundaries whose target boundary is known (where one
    sentence ends and the next begins: a ``<br>`` between two sentences stays between their
    translations, whatever the alignment of the next sentence's first word). Children are kept
    inside their parent and siblings apart and in order, so the tags come out balanced."""
    to_target: dict[int, list[int]] = {}
    for s, t in pairs or ():
        to_target.setdefault(s, []).append(t)

    def proportional(s: int) -> int:
        return round(s * target_words / source_words) if source_words else 0

    def boundary(s: int) -> int:  # the target boundary of source boundary s (before source word s)
        if anchors and s in anchors:
            return anchors[s]
        for word in range(s, source_words):
            if word in to_target:
                return min(to_target[word])
        return target_words if pairs else proportional(s)

    def span(tag: Tag) -> tuple[int, int]:
        if tag.end is None:
            return boundary(tag.at), boundary(tag.at)
        aligned = [t for s in range(tag.at, tag.end) for t in to_target.get(s, ())]
        if aligned:
            return min(aligned), max(aligned) + 1
        return proportional(tag.at), max(proportional(tag.at), proportional(tag.end))

    placed: list[tuple[Tag, int, int]] = []

    def place(children: list[Tag], lo: int, hi: int) -> None:
        at = lo
        for child in children:
            start, end = span(child)
            start = min(max(start, at), hi)
            end = min(max(end, start), hi)
            placed.append((child, start, end))
            place(child.children, start, end)
            at = end
    place(tags, 0, target_words)
    return placed


def render_block(block: Block, target: list[str], pairs: Optional[Sequence[tuple[int, int]]],
                 anchors: Optional[dict[int, int]] = None) -> str:
    """The target words with the block's inline tags around them (``place_tags``), escaped: one
    space between two words, after the end tags that follow the first (tags hug their words); a
    point between two words has whitespace on the sides it was written with."""
    placed = place_tags(block.tags, len(block.words), len(target), pairs, anchors)
    spans = {id(tag): (start, end) for tag, start, end in placed}
    events: list[tuple[str, Union[str, Tag]]] = []  # (kind: word, open, close, point; text, or the point)

    def walk(children: list[Tag], lo: int, hi: int) -> None:
        at = lo
        for child in children:
            start, end = spans[id(child)]
            events.extend(("word", w) for w in target[at:start])
            if child.end is None:
                events.append(("point", child))
            else:
                events.append(("open", child.open))
                walk(child.children, start, end)
                events.append(("close", child.close))
            at = end
        events.extend(("word", w) for w in target[at:hi])
    walk(block.tags, 0, len(target))
    out, seen_word, pending = [], False, []
    for kind, text in events:
        if kind != "word":
            pending.append((kind, text))
            continue
        closes = 0
        while closes < len(pending) and pending[closes][0] == "close":
            closes += 1
        out.extend(t for _, t in pending[:closes])
        owed, spaced = seen_word, False  # owed: the space between two words; spaced: the last thing out is one
        for kind, item in pending[closes:]:
            if kind == "point" and seen_word:
                if item.space_before and not spaced:
                    out.append(" ")
                out.append(item.open)
                if item.space_after:
                    out.append(" ")
                owed, spaced = False, item.space_after  # it parts the words (`sleeps.<br>A`) or has its spaces
                continue
            if owed:
                out.append(" ")
            out.append(item.open if kind == "point" else item)
            owed = spaced = False
        if owed:
            out.append(" ")
        out.append(text.translate(ENTITY_FREE))
        seen_word, pending = True, []
    out.extend(item.open if kind == "point" else item for kind, item in pending)
    return "".join(out)
