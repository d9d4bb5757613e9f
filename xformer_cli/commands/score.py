"""``xf score``: sacreBLEU, chrF and TER, the paper's tokenized BLEU, and paired bootstrap tests.

Detokenized sacreBLEU is the headline number: it scores plain text with a fixed tokenizer and
prints a signature, so two papers' numbers are comparable. The paper (like tensor2tensor and
fairseq at the time) reported a different number: BLEU on Moses-tokenized text after splitting
hyphenated compounds ("tokenized, compound-split BLEU"), which is higher than sacreBLEU by about
1 to 1.5 points on WMT14 EN-DE. ``--tokenized-bleu`` reproduces that procedure so our numbers can
stand next to the paper's 27.3 / 28.4.

All the metric arithmetic is sacrebleu's; this module only reads files, checks them, and
rewrites text for the tokenized BLEU (``compound_split``, ``moses_tokenize``).
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Optional, Sequence

from ..errors import XfError
from ..fileio import read_lines
from ..options import ScoreOptions

METRICS = ("bleu", "chrf", "ter")

# tensor2tensor's get_ende_bleu.sh and fairseq's compound_split_bleu.sh:
#   perl -ple 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g'
# Matches do not overlap, so "a-b-c" becomes "a ##AT##-##AT## b-c", as the original does.
_COMPOUND = re.compile(r"(\S)-(\S)")


def compound_split(line: str) -> str:
    """Rewrite every intra-word hyphen ``a-b`` as ``a ##AT##-##AT## b`` (the paper's BLEU)."""
    return _COMPOUND.sub(r"\1 ##AT##-##AT## \2", line)


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


def moses_tokenize(lines: Sequence[str], lang: str) -> list[str]:
    """Moses tokenization (``tokenizer.perl -l LANG``, default escaping) through sacremoses."""
    try:
        from sacremoses import MosesTokenizer
    except ImportError:
        raise XfError(
            "--tokenized-bleu needs sacremoses: pip install sacremoses  (or: pip install 'xformer-cli[moses]')"
        ) from None
    tok = MosesTokenizer(lang=lang)
    return [tok.tokenize(line, return_str=True) for line in lines]


def _metric(name: str, lowercase: bool, references: Optional[list[list[str]]] = None):
    from sacrebleu.metrics import BLEU, CHRF, TER

    if name == "bleu":
        return BLEU(lowercase=lowercase, references=references)
    if name == "chrf":
        return CHRF(lowercase=lowercase, references=references)
    # sacreBLEU's TER is case-insensitive by default (signature case:lc), in its library and its
    # command alike; we keep that default so our TER is everyone's TER.
    return TER(references=references)


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


def _describe(score: Any, signature: str) -> dict[str, Any]:
    """One metric's result as plain data: its score, signature and sacrebleu's own summary line."""
    out: dict[str, Any] = {"name": score.name, "score": score.score, "signature": signature}
    if hasattr(score, "precisions"):  # BLEU: the details needed to judge a score
        out.update(
            precisions=list(score.precisions),
            bp=score.bp,
            sys_len=score.sys_len,
            ref_len=score.ref_len,
        )
    out["text"] = score.format(width=2)
    return out


def check_lengths(hyps: Sequence[str], hyp_name: str, refs: Sequence[Sequence[str]], ref_names: Sequence[str]) -> None:
    if not hyps:
        raise XfError(f"{hyp_name}: no lines to score")
    for ref, ref_name in zip(refs, ref_names):
        if len(ref) != len(hyps):
            raise XfError(
                f"line counts differ: {hyp_name} has {len(hyps)} lines, {ref_name} has {len(ref)}"
            )


def tokenized_bleu(hyps: Sequence[str], refs: Sequence[Sequence[str]], lang: str, lowercase: bool = False) -> dict[str, Any]:
    """The paper's BLEU: Moses-tokenize, split compounds, then BLEU on the tokens as they are.

    BLEU with ``tokenize="none"`` on pre-tokenized text is multi-bleu.perl's BLEU (sacrebleu's
    default exp smoothing only differs when some n-gram order has no match in the whole corpus).
    """
    from sacrebleu import __version__ as sacrebleu_version
    from sacrebleu.metrics import BLEU

    def prepare(lines: Sequence[str]) -> list[str]:
        return [compound_split(line) for line in moses_tokenize(lines, lang)]

    hyps, refs = prepare(hyps), [prepare(ref) for ref in refs]  # moses_tokenize checks the import
    from sacremoses import __version__ as sacremoses_version

    score = BLEU(lowercase=lowercase, tokenize="none", force=True).corpus_score(hyps, refs)
    signature = (
        f"nrefs:{len(refs)}|case:{'lc' if lowercase else 'mixed'}|tok:moses-{lang}"
        f"|split:compound|smooth:exp|version:{sacrebleu_version}+sacremoses-{sacremoses_version}"
    )
    out = _describe(score, signature)
    out["name"] = "BLEU-tok-split"
    out["text"] = out["text"].replace("BLEU", out["name"], 1)
    return out


def compute_scores(
    hyps: Sequence[str],
    refs: Sequence[Sequence[str]],
    metrics: Sequence[str],
    lowercase: bool = False,
    tokenized: bool = False,
    lang: str = "en",
) -> dict[str, dict[str, Any]]:
    """Corpus scores of one system: ``{"bleu": {...}, "chrf": {...}, "ter": {...}, "tokenized_bleu": {...}}``."""
    results: dict[str, dict[str, Any]] = {}
    refs = [list(r) for r in refs]
    for name in metrics:
        metric = _metric(name, lowercase)
        score = metric.corpus_score(list(hyps), refs)
        results[name] = _describe(score, str(metric.get_signature()))
    if tokenized:
        results["tokenized_bleu"] = tokenized_bleu(hyps, refs, lang, lowercase)
    return results


def paired_bootstrap(
    systems: Sequence[tuple[str, Sequence[str]]],
    refs: Sequence[Sequence[str]],
    metrics: Sequence[str],
    lowercase: bool = False,
) -> dict[str, Any]:
    """Paired bootstrap resampling (sacrebleu: 1000 samples, seed 12345) against ``systems[0]``.

    Returns ``{"signatures": {metric: str}, "systems": [row, ...]}`` with one row per system:
    for each metric its score, the bootstrap mean, the 95% confidence half-width, and (except
    for the baseline) the p-value of the difference to the baseline.
    """
    from sacrebleu.significance import PairedTest

    refs = [list(r) for r in refs]
    test = PairedTest(
        [(name, list(h)) for name, h in systems],
        {name: _metric(name, lowercase, refs) for name in metrics},
        references=None,  # each metric caches the references given at construction
        test_type="bs",
    )
    signatures, results = test()
    keys = [k for k in results if k != "System"]  # sacrebleu's metric names, in our order
    number = lambda x: None if x is None else float(x)  # noqa: E731 - numpy float32 -> JSON-safe
    rows = []
    for i, (name, _hyps) in enumerate(systems):
        row: dict[str, Any] = {"system": name, "baseline": i == 0}
        for metric, key in zip(metrics, keys):
            r = results[key][i]
            row[metric] = {
                "score": number(r.score),
                "mean": number(r.mean),
                "ci": number(r.ci),
                "p_value": number(r.p_value),
            }
        rows.append(row)
    return {
        "signatures": {metric: str(signatures[key]) for metric, key in zip(metrics, keys)},
        "systems": rows,
    }


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
