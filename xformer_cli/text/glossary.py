"""Glossaries (xf translate --glossary FILE): source terms whose target terms become a line's
lexical constraints (``decode/constraints.py``).

The file is UTF-8 TSV (a byte-order mark at its start skipped), one entry a line: the source
term, a tab, then the target term or its alternative forms separated by ``|`` (any one form
satisfies the constraint: ``cat<TAB>Katze|Katzen``). Blank lines are skipped; anything else
malformed is an error naming the file and line.

Matching: source terms are found in a line on word boundaries (not inside a longer word), case-
insensitive on the source (Python's re.IGNORECASE with str.lower: "Cat" and "CAT" match "cat"; the line
is lowercased too, as "İ" lowercases to two characters that IGNORECASE alone does not match); at a position the longest
term wins, and matches do not overlap (scanned left to right). The target forms are used as
given (case-sensitive), cut by the model's sentencepiece like any constraint. A term found twice
gives one constraint.

xf serve also takes a glossary in a request (``Glossary.from_pairs``: [source, target] pairs, read
by the file's rules) and applies it together with its direction's (``find_terms``: the two read as
one glossary, the request's entry winning on the same source term).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

from ..base.errors import ConfigError


@dataclass
class Glossary:
    entries: dict[str, list[str]]  # lowercased source term -> its target forms
    pattern: "re.Pattern"
    origins: dict[str, str]  # the same key -> where it was given ("terms.tsv: line 3"), for errors

    @classmethod
    def load(cls, path: str) -> "Glossary":
        try:
            with open(path, "rb") as f:
                raw = f.read()
        except OSError as e:
            raise ConfigError(f"{path}: cannot read the glossary: {e.strerror}") from None
        try:
            text = raw.decode("utf-8-sig")  # a byte-order mark (Notepad, a spreadsheet's export) is no term's
        except UnicodeDecodeError as e:
            line = e.object[: e.start].count(b"\n") + 1  # e.object: the bytes after the mark
            raise ConfigError(f"{path}: line {line}: not UTF-8 text") from None
        entries: dict[str, list[str]] = {}
        origins: dict[str, str] = {}
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            fields = line.split("\t")
            if len(fields) != 2:
                raise ConfigError(f"{path}: line {n}: expected two tab-separated fields (source term, target term or "
                                  f"forms separated by |), got {len(fields)}")
            add_entry(entries, origins, fields[0], fields[1].split("|"), f"{path}: line {n}")
        if not entries:
            raise ConfigError(f"{path}: the glossary has no entries")
        return cls(entries, term_pattern(entries), origins)

    @classmethod
    def from_pairs(cls, pairs: list, where: str) -> "Glossary":
        """A glossary from ``[source, target]`` pairs (xf serve's ``glossary`` field), by the file's
        rules: the target a string (its forms separated by ``|``, as in the file) or a list of
        alternative forms; a ConfigError naming ``where`` and the pair (counted from 1) otherwise.
        ``pairs`` holds at least one pair."""
        entries: dict[str, list[str]] = {}
        origins: dict[str, str] = {}
        for n, pair in enumerate(pairs, 1):
            at = f"{where} item {n}"
            if not isinstance(pair, list) or len(pair) != 2:
                raise ConfigError(f"{at}: expected a [source, target] pair (target: a string, or a list of "
                                  "alternative forms)")
            source, target = pair
            forms = target.split("|") if isinstance(target, str) else target
            if not isinstance(source, str) or not isinstance(forms, list) or not forms \
                    or not all(isinstance(form, str) for form in forms):
                raise ConfigError(f"{at}: the source term must be a string, the target a string or a non-empty list "
                                  "of strings")
            if any(not is_text(term) for term in [source, *forms]):
                raise ConfigError(f"{at}: a term holds a line break or a lone surrogate escape: one term, one line")
            add_entry(entries, origins, source, forms, at)
        return cls(entries, term_pattern(entries), origins)

    def constraints(self, line: str) -> list[list[str]]:
        """The target forms of every term found in ``line``, one constraint per term, in order."""
        found: list[str] = []
        for match in self.pattern.finditer(line.lower()):  # lowercased as the terms are (the module's docstring)
            key = match.group(1).lower()
            if key in self.entries and key not in found:
                found.append(key)
        return [self.entries[key] for key in found]


def term_pattern(entries) -> "re.Pattern":
    """One regex of every term, longest first (so the longest wins at a position), on word
    boundaries: no word character just before or after."""
    terms = sorted(entries, key=lambda t: (-len(t), t))
    return re.compile(r"(?<!\w)(" + "|".join(re.escape(t) for t in terms) + r")(?!\w)", re.IGNORECASE)


def is_text(term: str) -> bool:
    """No line break (a term is matched inside one line) and no lone surrogate (JSON, not text)."""
    if "\n" in term or "\r" in term:
        return False
    try:
        term.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def find_terms(line: str, glossaries: Sequence[Glossary]) -> list[tuple[str, list[str], int]]:
    """(source term, its target forms, which glossary) of every term found in ``line``, with
    ``glossaries`` read as one: at each position, left to right, the longest term of any of them
    (on the same source term the first glossary's entry wins), matches not overlapping, a term
    found twice given once. With one glossary: the terms of ``Glossary.constraints``, in order.
    Each glossary keeps its own compiled pattern (a large one compiles in a second: it is not
    compiled again to be merged with a small one)."""
    found: dict[str, tuple[list[str], int]] = {}
    at, line = 0, line.lower()  # lowercased as the terms are (the module's docstring)
    while True:
        # each glossary's next match (its longest term at its leftmost position: the regex's
        # alternation is longest first); the earliest of them, then the longest, then the first glossary
        best = None  # (start, -length, glossary index, match)
        for g, glossary in enumerate(glossaries):
            match = glossary.pattern.search(line, at)  # the lookbehind sees the text before ``at``
            if match and (best is None or (match.start(), -len(match.group(1))) < best[:2]):
                best = (match.start(), -len(match.group(1)), g, match)
        if best is None:
            break
        _, _, g, match = best
        key = match.group(1).lower()
        if key in glossaries[g].entries and key not in found:
            found[key] = (glossaries[g].entries[key], g)
        at = match.end()
    return [(key, forms, g) for key, (forms, g) in found.items()]


def add_entry(entries: dict[str, list[str]], origins: dict[str, str], source: str, forms: list[str], at: str) -> None:
    """Add one glossary entry (a file's line or a request's pair: the same rules), its terms
    stripped, keyed by the lowercased source term, and ``at`` as its origin; a ConfigError naming
    ``at`` for an empty term or a source term given twice (case-insensitive)."""
    source, forms = source.strip(), [form.strip() for form in forms]
    if not source:
        raise ConfigError(f"{at}: an empty source term")
    if not all(forms):
        raise ConfigError(f"{at}: an empty target term (a form between | is empty)")
    key = source.lower()
    if key in entries:
        raise ConfigError(f"{at}: the source term {source!r} is given twice (case-insensitive)")
    entries[key], origins[key] = forms, at
