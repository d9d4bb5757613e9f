"""Which language a text is in, among the ones a server translates from: py3langid (langid.py's
maintained successor: a naive Bayes model over byte n-grams, 97 languages, no network, about a
second to load), its probabilities calibrated (``norm_probs``).

``rank`` answers among the served languages only (LibreTranslate's /detect does likewise: it knows
the languages it has loaded), each one's probability renormalized over them, which is what
py3langid's ``set_languages`` gives; it is computed from one full ranking so that the model is
never mutated under concurrent requests. ``choose`` is ``source: "auto"``: the best served
language, refused when the text has no letter to go by or when it clearly is in a language not
served (py3langid's own best, with probability >= CLEARLY_OTHER, is not a served one).
"""

from __future__ import annotations

from typing import Optional

# On newstest2013's 3,000 EN and 3,000 DE lines py3langid's best language was not EN or DE for 57
# lines, never with a probability over 0.9: at this bound no real sentence of those was refused.
CLEARLY_OTHER = 0.9


class UnknownLanguage(Exception):
    """The text's language cannot be chosen among the served ones (the message says why)."""


class LanguageId:
    """py3langid over the served source languages (those it knows; the others are never answered)."""

    def __init__(self, languages: list[str]):
        from py3langid.langid import MODEL_FILE, LanguageIdentifier

        self.model = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
        known = set(self.model.labels)
        self.languages = [code for code in languages if code in known]

    @classmethod
    def load(cls, languages: list[str]) -> Optional["LanguageId"]:
        """The identifier, or None when py3langid is not installed (the detect extra)."""
        try:
            import py3langid  # noqa: F401
        except ImportError:
            return None
        return cls(languages)

    def rank(self, text: str) -> tuple[list[tuple[str, float]], tuple[str, float]]:
        """(the served languages with their probabilities among them, best first; py3langid's own
        best language over all it knows, with its probability)."""
        ranking = self.model.rank(text)
        served = [(code, p) for code, p in ranking if code in self.languages]
        total = sum(p for _, p in served) or 1.0
        return [(code, p / total) for code, p in served], ranking[0]

    def probability(self, text: str, code: str) -> float:
        """py3langid's probability that ``text`` is in ``code``, over all the languages it knows."""
        return next((p for c, p in self.model.rank(text) if c == code), 0.0)

    def choose(self, text: str) -> str:
        """The served language of ``text`` (source "auto"); UnknownLanguage when there is none."""
        if not any(ch.isalpha() for ch in text):
            raise UnknownLanguage("the text has no letters to tell its language by")
        served, (best, p) = self.rank(text)
        if not served:
            raise UnknownLanguage("language detection knows none of the languages this server translates from")
        if best not in self.languages and p >= CLEARLY_OTHER:
            raise UnknownLanguage(f"the text looks like '{best}' (confidence {p:.2f}), which this server does not "
                                  "translate from")
        return served[0][0]
