"""``xf score``: sacreBLEU, chrF and TER, the paper's tokenized BLEU, and paired bootstrap tests.

Detokenized sacreBLEU is the headline number: it scores plain text with a fixed tokenizer and
prints a signature, so two papers' numbers are comparable. ``--tokenized-bleu`` adds the paper's
number (Moses-tokenized, compound-split BLEU), so ours can stand next to its 27.3 / 28.4.

The metrics are the library's (``text/metrics.py``, over sacrebleu); this module reads the files,
checks them, and prints the report.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Optional, Sequence

from ..base.errors import XfError
from ..base.fileio import read_lines
from ..settings.options import ScoreOptions
from ..text.metrics import METRICS, compute_scores, paired_bootstrap


def parse_metrics(text: str) -> list[str]:
    """``"bleu,chrf"`` -> ``["bleu", "chrf"]``, rejecting unknown names."""
    names = [m.strip().lower() for m in text.split(",") if m.strip()]
    for name in names:
        if name not in METRICS:
            raise XfError(f"--metrics: unknown metric '{name}' (choose from {', '.join(METRICS)})")
    return list(dict.fromkeys(names))


def _lang_of(path: str) -> str:
    """``newstest2014.de`` -> ``de``; ``en`` where the suffix is not a language code."""
    suffix = Path(path).suffix.lstrip(".").lower()
    return suffix if re.fullmatch(r"[a-z]{2,3}", suffix) else "en"


@dataclass
class Scores:
    """Everything ``xf score`` reports; ``as_dict`` is its ``--json`` output."""

    hyp: str
    refs: list[str]
    lines: int
    metrics: dict[str, dict[str, Any]] = field(default_factory=dict)
    paired_bs: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"hyp": self.hyp, "refs": self.refs, "lines": self.lines, **self.metrics}
        if self.paired_bs:
            out["paired_bs"] = self.paired_bs
        return out


def check_lengths(hyps: Sequence[str], hyp_name: str, refs: Sequence[Sequence[str]], ref_names: Sequence[str]) -> None:
    if not hyps:
        raise XfError(f"{hyp_name}: no lines to score")
    for ref, ref_name in zip(refs, ref_names):
        if len(ref) != len(hyps):
            raise XfError(
                f"line counts differ: {hyp_name} has {len(hyps)} lines, {ref_name} has {len(ref)}"
            )


def format_scores(scores: Scores) -> str:
    """The plain-text report: one line per metric with its signature, then any paired test."""
    lines = [f"{scores.hyp}: {scores.lines} lines, {len(scores.refs)} reference(s)"]
    for result in scores.metrics.values():
        lines.append(f"{result['text']}")
        lines.append(f"    {result['signature']}")
    if scores.paired_bs:
        rows, signatures = scores.paired_bs["systems"], scores.paired_bs["signatures"]
        lines.append("paired bootstrap resampling: score (bootstrap mean ± 95% CI); p < 0.05: significantly different from the baseline")
        width = max(len(r["system"]) for r in rows) + len("baseline: ")
        for row in rows:
            label = ("baseline: " if row["baseline"] else "") + row["system"]
            cells = []
            for metric in signatures:
                r = row[metric]
                p = "" if r["p_value"] is None else f" p={r['p_value']:.4f}{'*' if r['p_value'] < 0.05 else ''}"
                cells.append(f"{metric} {r['score']:.2f} ({r['mean']:.2f} ± {r['ci']:.2f}){p}")
            lines.append(f"  {label:<{width}}  " + "   ".join(cells))
        for metric, signature in signatures.items():
            lines.append(f"    {metric}: {signature}")
    return "\n".join(lines)


def score(options: ScoreOptions, stdin: Optional[IO[bytes]] = None, stdout: Optional[IO[str]] = None) -> Scores:
    """Score ``options.hyp`` (or stdin) against ``options.ref``; print the report to stdout."""
    stdout = stdout or sys.stdout
    metrics = parse_metrics(options.metrics)
    if not metrics and not options.tokenized_bleu:
        raise XfError("--metrics: nothing to compute (choose from bleu, chrf, ter, or add --tokenized-bleu)")
    if not options.ref:
        raise XfError("give at least one --ref FILE")
    if options.paired_bs and not metrics:
        raise XfError("--paired-bs tests the --metrics (bleu, chrf, ter); none were selected")

    refs = [read_lines(path) for path in options.ref]
    hyp_name = options.hyp if options.hyp is not None else "<stdin>"
    if options.hyp is None and stdin is None:
        if sys.stdin is None or sys.stdin.isatty():
            raise XfError("no hypotheses: give --hyp FILE or pipe them on stdin")
        stdin = sys.stdin.buffer
    hyps = read_lines(options.hyp, stdin)
    check_lengths(hyps, hyp_name, refs, options.ref)

    lang = options.target_lang or _lang_of(options.ref[0])
    result = Scores(hyp=hyp_name, refs=list(options.ref), lines=len(hyps))
    result.metrics = compute_scores(hyps, refs, metrics, options.lowercase, options.tokenized_bleu, lang)
    if options.paired_bs:
        systems = [(hyp_name, hyps)]
        for path in options.paired_bs:
            other = read_lines(path)
            check_lengths(other, path, refs, options.ref)
            systems.append((path, other))
        result.paired_bs = paired_bootstrap(systems, refs, metrics, options.lowercase)

    if options.json:
        stdout.write(json.dumps(result.as_dict(), indent=2, ensure_ascii=False) + "\n")
    else:
        stdout.write(format_scores(result) + "\n")
    stdout.flush()
    return result
