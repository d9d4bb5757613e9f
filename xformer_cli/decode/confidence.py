"""A confidence in [0, 1] for each translation, from what the model knows.

The parts (``features``): ``forward``, the output's mean log-probability per subword (eos
included; the search's own positional scores, before any length penalty); ``reverse``, the
source's mean log-probability given the output under a reverse model (forced decoding,
``pair_scoring``; 0 without one); ``wrong_language``, 1 when the language identifier finds the
output unlikely to be in the target language; ``copy``, 1 when the output repeats the source.

How the two scores combine is a logistic regression fitted on validation data (``fit``: the
label is "this sentence's chrF is at least the validation median") and stored in a small
versioned JSON file (``Calibration``, written by ``xf calibrate``). The flags are rules, not
fitted: a flagged output's confidence is 0, since a validation set's own translations are
almost never copies or in the wrong language, so a fit could not learn their weight (on
Multi30k val neither fired once). Without a file, ``uncalibrated`` is used: exp(forward), the
geometric mean of the output's subword probabilities, and 0 when a flag fires.
"""

from __future__ import annotations

import difflib
import json
import math
import re
import statistics
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from ..base.errors import XfError
from ..base.json_input import read_json
from ..text.languages import two_letters

FEATURES = ("forward", "reverse", "wrong_language", "copy")  # a row's columns
SCORES = FEATURES[:2]  # what a calibration weighs; the rest are flags
FORMAT, VERSION = "xf-confidence", 1

# An output is a copy when it is this similar to its source (difflib's ratio, casefolded): a
# translation shares names and numbers with its source, a copy nearly all of it.
COPY_RATIO = 0.8


def is_copy(source: str, output: str) -> bool:
    a, b = " ".join(source.casefold().split()), " ".join(output.casefold().split())
    return bool(a) and difflib.SequenceMatcher(None, a, b, autojunk=False).ratio() >= COPY_RATIO


# An output is in the wrong language when py3langid finds the target language less likely than
# all the others together. Chosen on Multi30k val (EN-DE; docs/decoding.md#confidence has the
# table): it flags 2 of 1,014 German references, and 85% of outputs forced half into English by
# a prefix; 0.9 would flag 95% of those but 1.4% of clean output, a margin too thin for other text.
WRONG_LANGUAGE_P = 0.5
# ... and only on an output of at least this many letters: on two or three words the identifier
# is no evidence. Chosen on Multi30k val, the first words of each German reference standing for
# a short correct output (docs/decoding.md#short-outputs has the table): from this length on its
# false alarms fall to about their rate on whole outputs.
WRONG_LANGUAGE_LETTERS = 30


def is_wrong_language(probability, output: str, target: str) -> bool:
    """``probability(text, language)``: the identifier's (``LanguageId.probability``); an output
    of fewer than WRONG_LANGUAGE_LETTERS letters is never flagged (numbers, punctuation, two or
    three words: too little to tell its language by)."""
    return (sum(ch.isalpha() for ch in output) >= WRONG_LANGUAGE_LETTERS
            and probability(output, target) < WRONG_LANGUAGE_P)


def features(forward: float, reverse: Optional[float], wrong_language: bool, copy: bool) -> list[float]:
    """One row of FEATURES' values (reverse 0 without a reverse model)."""
    return [forward, reverse if reverse is not None else 0.0, float(wrong_language), float(copy)]


def uncalibrated(row: Sequence[float]) -> float:
    """The confidence without a calibration file: exp(mean log-probability), 0 when a flag fires."""
    forward, _, wrong_language, copy = row
    return 0.0 if wrong_language or copy else min(1.0, math.exp(forward))


@dataclass(frozen=True)
class Calibration:
    """A logistic regression over SCORES, sigmoid(bias + weights . scores), 0 when a flag fires."""

    weights: tuple[float, ...]
    bias: float
    reverse: bool  # fitted with a reverse model's scores (its weight is 0 otherwise)
    note: str = ""  # what it was fitted on (for the reader of the file)

    def confidence(self, row: Sequence[float]) -> float:
        if any(row[len(SCORES):]):
            return 0.0
        z = self.bias + float(np.dot(self.weights, row[:len(SCORES)]))
        return 1.0 / (1.0 + math.exp(-z)) if z >= 0 else math.exp(z) / (1.0 + math.exp(z))

    def to_json(self) -> str:
        return json.dumps({"format": FORMAT, "version": VERSION, "scores": list(SCORES),
                           "weights": list(self.weights), "bias": self.bias, "reverse": self.reverse,
                           "note": self.note}, indent=2) + "\n"

    @classmethod
    def load(cls, path: str) -> "Calibration":
        """The file ``xf calibrate`` wrote (read by the one JSON reader: no NaN, no number past a
        double); an XfError of one line naming the file (and the line of a JSON error) otherwise."""
        return cls.from_dict(read_json(path, hint="not a calibration file of xf calibrate"), path)

    @classmethod
    def from_dict(cls, data, path: str) -> "Calibration":
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise XfError(f"{path}: not a calibration file of xf calibrate (no \"format\": \"{FORMAT}\")")
        version = data.get("version")
        if version != VERSION or isinstance(version, bool):
            shown = json.dumps(version) if isinstance(version, (str, bool, int, float, type(None))) else "not a number"
            raise XfError(f"{path}: \"version\" is {shown}; this xf reads calibration version {VERSION} "
                          "(run xf calibrate again)")
        if data.get("scores") != list(SCORES):
            raise XfError(f"{path}: scores {data.get('scores')!r}, expected {list(SCORES)}")
        weights, bias = data.get("weights"), data.get("bias")
        numbers = weights + [bias] if isinstance(weights, list) else []
        if len(numbers) != len(SCORES) + 1 or not all(_finite(x) for x in numbers):
            raise XfError(f"{path}: \"weights\" must be {len(SCORES)} finite numbers and \"bias\" one")
        if not isinstance(data.get("reverse"), bool):
            raise XfError(f"{path}: \"reverse\" must be true or false")
        return cls(tuple(float(w) for w in weights), float(bias), data["reverse"], str(data.get("note", "")))


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def median_labels(chrf: Sequence[float]) -> tuple[list[int], float]:
    """(labels, median) of the translations' sentence chrF: 1 at or above the median, 0 below. Ties
    at the median are broken the other way (1 only above it) where at-or-above would leave no 0 (a
    weak model's many empty outputs at chrF 0, the median: the rest still tell good from bad);
    chrF all equal is refused in one line, as nothing tells good from bad."""
    median = statistics.median(chrf)
    for labels in ([int(c >= median) for c in chrf], [int(c > median) for c in chrf]):
        if 0 < sum(labels) < len(labels):
            return labels, median
    raise ValueError(f"the {len(chrf):,} translations' sentence chrF are all {median:.2f}: nothing tells a good "
                     "translation from a bad one (a model this weak, or a validation set this uniform, cannot "
                     "be calibrated)")


def fit(rows: Sequence[Sequence[float]], labels: Sequence[int], l2: float = 1e-3, steps: int = 50) -> tuple[np.ndarray, float]:
    """(weights, bias) of a logistic regression of ``labels`` (0/1) on ``rows`` by Newton's
    method, with a small L2 penalty on the weights (a flag that never fires on the data, or
    perfectly separates it, keeps a finite weight). Uses only the rows and labels it is given."""
    x = np.asarray(rows, dtype=np.float64)
    y = np.asarray(labels, dtype=np.float64)
    if x.ndim != 2 or len(x) != len(y) or len(x) == 0:
        raise ValueError(f"{len(x)} rows but {len(y)} labels")
    xb = np.hstack([x, np.ones((len(x), 1))])  # the last column: the bias
    w = np.zeros(xb.shape[1])
    penalty = np.full(xb.shape[1], l2 * len(x))
    penalty[-1] = 0.0  # the bias is not shrunk
    for _ in range(steps):
        p = 1.0 / (1.0 + np.exp(-(xb @ w)))
        grad = xb.T @ (p - y) + penalty * w
        hess = (xb * (p * (1 - p))[:, None]).T @ xb + np.diag(penalty) + 1e-9 * np.eye(len(w))
        step = np.linalg.solve(hess, grad)
        w -= step
        if np.max(np.abs(step)) < 1e-10:
            break
    return w[:-1], float(w[-1])


def roc_auc(scores: Sequence[float], positives: Sequence[bool]) -> float:
    """The area under the ROC curve of ``scores`` for predicting ``positives`` (ties count half):
    the probability that a random positive scores higher than a random negative."""
    s = np.asarray(scores, dtype=np.float64)
    pos = np.asarray(positives, dtype=bool)
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    if not n_pos or not n_neg:
        raise ValueError("the ROC area needs positives and negatives")
    order = np.argsort(s, kind="mergesort")
    ranks = np.empty(len(s))
    sorted_s = s[order]
    i = 0
    while i < len(s):  # average ranks over ties
        j = i
        while j + 1 < len(s) and sorted_s[j + 1] == sorted_s[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


class Scorer:
    """The confidence of translations: their FEATURES (the reverse model's score by forced
    decoding where one is given, the flags where the languages are known) combined by a
    calibration, or by ``uncalibrated`` without one."""

    def __init__(self, calibration: Optional[Calibration] = None, reverse=None, target_lang: Optional[str] = None,
                 where: str = "the calibration", languages: Sequence[str] = ()):
        if calibration is not None and calibration.reverse != (reverse is not None):
            given = "with" if calibration.reverse else "without"
            raise XfError(f"{where}: fitted {given} a reverse model's scores: "
                          f"{'give' if calibration.reverse else 'drop'} --reverse-path")
        self.calibration, self.reverse, self.target_lang = calibration, reverse, target_lang
        self.probability = None
        # languages: the targets lines may name besides target_lang (a multilingual model's); py3langid
        # names languages by ISO 639-1: --target-lang deu is its de
        self.target_lang = target_lang = two_letters(target_lang) if target_lang is not None else None
        languages = [two_letters(lang) for lang in languages]
        wanted = list(dict.fromkeys(([target_lang] if target_lang is not None else []) + list(languages)))
        if wanted:
            from ..text.language_id import LanguageId

            language_id = LanguageId.load(wanted)
            for lang in wanted:
                if language_id is None or lang not in language_id.languages:
                    raise XfError(f"the wrong_language flag needs py3langid knowing '{lang}' (the detect extra)")
            self.probability = language_id.probability

    def rows(self, sources: Sequence[str], outputs: Sequence[str], forward: Sequence[float],
             targets: Optional[Sequence[Optional[str]]] = None) -> list[list[float]]:
        """FEATURES of each (source, output) pair; ``forward``: each output's mean log-probability;
        ``targets``: each output's language (None: target_lang; no language: no wrong_language flag)."""
        reverse = self._reverse(sources, outputs) if self.reverse is not None else [None] * len(sources)
        targets = [two_letters(t) if t else self.target_lang for t in targets] if targets is not None \
            else [self.target_lang] * len(sources)
        return [features(f, r, self.probability is not None and lang is not None
                         and is_wrong_language(self.probability, out, lang), is_copy(src, out))
                for src, out, f, r, lang in zip(sources, outputs, forward, reverse, targets)]

    def confidences(self, sources: Sequence[str], outputs: Sequence[str], forward: Sequence[float],
                    targets: Optional[Sequence[Optional[str]]] = None) -> list[float]:
        """Each output's confidence; 1 for a source with nothing to translate (blank), calibrated
        or not (a calibration's sigmoid of a zero score gave it 0.992)."""
        rows = self.rows(sources, outputs, forward, targets)
        combine = self.calibration.confidence if self.calibration is not None else uncalibrated
        return [1.0 if not source.strip() else combine(row) for source, row in zip(sources, rows)]

    def _reverse(self, sources: Sequence[str], outputs: Sequence[str]) -> list[float]:
        """The mean log-probability of each source given its output under the reverse model
        (each side cut to the model's positions: a confidence, not a pair's exact score)."""
        from .pair_scoring import max_length, score_pairs
        from ..text.vocab import encode_target

        engine, sp = self.reverse
        limit = max_length(engine.models)
        xs = [ids[:limit] for ids in sp.encode(list(outputs), out_type=int)]
        ys = [ids[:limit] for ids in encode_target(sp, list(sources), out_type=int)]  # its target side
        return [p.mean for p in score_pairs(engine.models, xs, ys)]


def mean_log_probability(positional_scores: Sequence[float]) -> float:
    """The output's log-probability per subword, eos included (0 for an empty search result)."""
    return sum(positional_scores) / len(positional_scores) if positional_scores else 0.0
