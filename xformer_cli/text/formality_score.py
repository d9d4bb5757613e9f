"""Reference-based formality accuracy (Nadejde et al., 2022, "CoCoA-MT"; the IWSLT 2022
formality task's scorer): did a translation use the form of address it was asked for?

CoCoA-MT gives each source a formal and an informal reference whose formality-bearing phrases
are marked ``[F]...[/F]`` (``Wie [F]schätzen Sie[/F] das ein``). A translation is labelled by
the phrases it contains:

- ``formal``: at least one phrase of the formal reference and none of the informal one's;
- ``informal``: the other way round;
- ``neutral``: none of either (it rephrased, or dropped the address);
- ``other``: phrases of both.

The accuracy of a system asked for formality X is the share of ``X`` among the translations
labelled formal or informal (neutral and other are not counted, as in the official scorer), so
formal and informal accuracy of one output file add up to 1.

As the official scorer (github.com/amazon-science/contrastive-controlled-mt,
IWSLT2022/scorer.py): the lines are stripped, a phrase and a translation are split into tokens at
single spaces, and a phrase is contained when all its tokens are among the translation's (a set:
order and adjacency do not count); the match is case-sensitive (Sie is not sie) and a token keeps
its punctuation, so the phrase ``Sie wissen`` is not found in "Sie wissen, was ich meine"
(``wissen,``): a reference does not always match its own phrases. Kept so that figures compare
with published ones. Torch-free.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Sequence

from ..base.errors import XfError

MARKED = re.compile(r"\[F\](.*?)\[/F\]")  # shortest: two marked phrases on a line stay two
LABELS = ("formal", "informal", "neutral", "other")


def phrases(annotated: str) -> list[str]:
    """The marked phrases of an annotated reference, in order (``[F]Sie[/F]`` -> ``Sie``)."""
    return MARKED.findall(annotated)


def plain(annotated: str) -> str:
    """An annotated reference as text: the marks removed (what BLEU is computed against)."""
    return MARKED.sub(r"\1", annotated)


def contains(translation: str, phrase: str) -> bool:
    """Whether every token of ``phrase`` is a token of ``translation`` (tokens: split at single
    spaces, punctuation kept, case-sensitive; module docstring)."""
    return set(phrase.split(" ")) <= set(translation.strip().split(" "))


def label(translation: str, formal_annotated: str, informal_annotated: str) -> str:
    """``formal``, ``informal``, ``neutral`` or ``other`` (module docstring)."""
    formal = any(contains(translation, p) for p in phrases(formal_annotated.strip()))
    informal = any(contains(translation, p) for p in phrases(informal_annotated.strip()))
    if formal != informal:
        return "formal" if formal else "informal"
    return "other" if formal else "neutral"


@dataclass
class FormalityScore:
    counts: dict = field(default_factory=lambda: dict.fromkeys(LABELS, 0))

    @property
    def matched(self) -> int:
        """Translations labelled formal or informal: the accuracy's denominator."""
        return self.counts["formal"] + self.counts["informal"]

    def accuracy(self, requested: str) -> float:
        """The share of ``requested`` (formal or informal) among the matched translations; 0
        when none matched (as the official scorer)."""
        if requested not in ("formal", "informal"):
            raise XfError(f"formality accuracy is of formal or informal, not {requested!r}")
        return self.counts[requested] / self.matched if self.matched else 0.0


def score(translations: Sequence[str], formal_annotated: Sequence[str],
          informal_annotated: Sequence[str]) -> FormalityScore:
    """The labels of ``translations`` (one per source) against the annotated references of the
    same sources, counted."""
    if not len(translations) == len(formal_annotated) == len(informal_annotated) > 0:
        raise XfError(f"formality score: {len(translations)} translations, {len(formal_annotated)} formal and "
                      f"{len(informal_annotated)} informal references: expected one of each per source, and some")
    result = FormalityScore()
    for hyp, formal, informal in zip(translations, formal_annotated, informal_annotated):
        result.counts[label(hyp, formal, informal)] += 1
    return result
