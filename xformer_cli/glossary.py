"""Glossaries (xf translate --glossary FILE): source terms whose target terms become a line's
lexical constraints (``constraints.py``).

The file is UTF-8 TSV, one entry a line: the source term, a tab, then the target term or its
alternative forms separated by ``|`` (any one form satisfies the constraint: ``cat<TAB>Katze|Katzen``).
Blank lines are skipped; anything else malformed is an error naming the file and line.

Matching: source terms are found in a line on word boundaries (not inside a longer word), case-
insensitive on the source (Python's re.IGNORECASE with str.lower: "Cat" and "CAT" match "cat"); at a position the longest
term wins, and matches do not overlap (scanned left to right). The target forms are used as
given (case-sensitive), cut by the model's sentencepiece like any constraint. A term found twice
gives one constraint.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import ConfigError


@dataclass
class Glossary:
    entries: dict[str, list[str]]  # lowercased source term -> its target forms
    pattern: "re.Pattern"

    @classmethod
    def load(cls, path: str) -> "Glossary":
        try:
            with open(path, "rb") as f:
                raw = f.read()
        except OSError as e:
            raise ConfigError(f"{path}: cannot read the glossary: {e.strerror}") from None
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            line = raw[: e.start].count(b"\n") + 1
            raise ConfigError(f"{path}: line {line}: not UTF-8 text") from None
        entries: dict[str, list[str]] = {}
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            fields = line.split("\t")
            if len(fields) != 2:
                raise ConfigError(f"{path}: line {n}: expected two tab-separated fields (source term, target term or "
                                  f"forms separated by |), got {len(fields)}")
            source, forms = fields[0].strip(), [form.strip() for form in fields[1].split("|")]
            if not source:
                raise ConfigError(f"{path}: line {n}: an empty source term")
            if not all(forms):
                raise ConfigError(f"{path}: line {n}: an empty target term (a form between | is empty)")
            key = source.lower()
            if key in entries:
                raise ConfigError(f"{path}: line {n}: the source term {source!r} is given twice (case-insensitive)")
            entries[key] = forms
        if not entries:
            raise ConfigError(f"{path}: the glossary has no entries")
        return cls(entries, term_pattern(entries))

    def constraints(self, line: str) -> list[list[str]]:
        """The target forms of every term found in ``line``, one constraint per term, in order."""
        found: list[str] = []
        for match in self.pattern.finditer(line):
            key = match.group(1).lower()
            if key in self.entries and key not in found:
                found.append(key)
        return [self.entries[key] for key in found]


def term_pattern(entries) -> "re.Pattern":
    """One regex of every term, longest first (so the longest wins at a position), on word
    boundaries: no word character just before or after."""
    terms = sorted(entries, key=lambda t: (-len(t), t))
    return re.compile(r"(?<!\w)(" + "|".join(re.escape(t) for t in terms) + r")(?!\w)", re.IGNORECASE)
