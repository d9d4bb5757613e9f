"""xf calibrate: fit how the confidence of ``xf translate --output-format jsonl`` combines its
two scores (``confidence.SCORES``; its flags are rules), on a validation set, and write the calibration file that
``xf translate --confidence`` reads.

The validation source is translated with the given decoding options, each translation scored
with sacreBLEU's sentence chrF against its reference, and a logistic regression fitted to tell
the translations at or above the median chrF from those below (``confidence.fit``; ties at the
median broken, chrF all equal refused: ``confidence.median_labels``). Only the
validation set is read: the test set stays unseen, so the figures measured on it are honest.
"""

from __future__ import annotations

import dataclasses
import time

from ..base.console import print_summary, stderr_console
from ..base.errors import XfError
from ..base.fileio import atomic_write_text, read_lines
from ..decode.confidence import SCORES, Calibration, fit, median_labels, roc_auc
from ..decode.steering import source_vocabulary
from ..decode.translate import open_engine, open_scorer, translate_with_features
from ..settings.options import CalibrateOptions, TranslateOptions
from ..text.metrics import sentence_chrf


def calibrate(options: CalibrateOptions) -> None:
    sources, references = read_lines(options.source), read_lines(options.reference)
    if len(sources) != len(references):
        raise XfError(f"{options.reference}: {len(references):,} lines, but {options.source} has {len(sources):,}")
    if len(sources) < 20:
        raise XfError(f"{options.source}: {len(sources)} lines; a calibration needs a validation set (hundreds)")
    shared = {f.name for f in dataclasses.fields(TranslateOptions)} & {f.name for f in dataclasses.fields(options)}
    translate_options = TranslateOptions(**{name: getattr(options, name) for name in shared}, output_format="jsonl")
    start = time.perf_counter()
    engine, sp, _ = open_engine(translate_options)
    try:
        vocab = source_vocabulary(engine, sp, options.target_lang, options.path[0])  # a multilingual model's tag
        scorer = open_scorer(translate_options, engine.plan, facts=engine.facts)
        outputs, rows = translate_with_features(engine, vocab, sources, translate_options, scorer)
    finally:
        engine.close()
    chrf = sentence_chrf(outputs, references)
    try:  # before anything is written: labels that tell nothing are refused
        labels, median = median_labels(chrf)
    except ValueError as e:
        raise XfError(f"xf calibrate: {options.source}: {e}") from None
    weights, bias = fit([row[:len(SCORES)] for row in rows], labels)
    calibration = Calibration(tuple(float(w) for w in weights), bias, scorer.reverse is not None,
                              f"fitted on {options.source} ({len(sources):,} lines), median sentence chrF {median:.2f}")
    atomic_write_text(options.output, calibration.to_json())
    fitted = [calibration.confidence(row) for row in rows]
    low = [not label for label in labels]
    print_summary(stderr_console(), "xf calibrate", [
        ("validation lines", f"{len(sources):,}"),
        ("median sentence chrF", f"{median:.2f}"),
        *[(f"weight: {name}", f"{w:+.4f}") for name, w in zip(SCORES, weights)],
        ("bias", f"{bias:+.4f}"),
        ("ROC area, chrF below the median (on the fit's own data)", f"{roc_auc([-c for c in fitted], low):.3f}"),
        ("flags: wrong_language / copy", f"{sum(r[2] for r in rows):.0f} / {sum(r[3] for r in rows):.0f}"),
        ("time", f"{time.perf_counter() - start:.1f} s"),
        ("written", options.output),
    ], values="right")
