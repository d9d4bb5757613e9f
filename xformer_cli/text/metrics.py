"""Corpus metrics: sacreBLEU, chrF and TER, the paper's tokenized BLEU, paired bootstrap tests.

All the metric arithmetic is sacrebleu's; this module builds its metric objects, describes their
results as plain data, and rewrites text for the paper's BLEU (``compound_split``,
``moses_tokenize``). The paper (like tensor2tensor and fairseq at the time) reported BLEU on
Moses-tokenized text after splitting hyphenated compounds ("tokenized, compound-split BLEU"),
which is higher than detokenized sacreBLEU by about 1 to 1.5 points on WMT14 EN-DE;
``tokenized_bleu`` reproduces that procedure so our numbers can stand next to the paper's
27.3 / 28.4. ``xf score`` reads the files and prints what these functions return.
"""

from __future__ import annotations

import re
from typing import Any, Optional, Sequence

from ..base.errors import XfError

METRICS = ("bleu", "chrf", "ter")

# tensor2tensor's get_ende_bleu.sh and fairseq's compound_split_bleu.sh:
#   perl -ple 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g'
# Matches do not overlap, so "a-b-c" becomes "a ##AT##-##AT## b-c", as the original does.
_COMPOUND = re.compile(r"(\S)-(\S)")


def compound_split(line: str) -> str:
    """Rewrite every intra-word hyphen ``a-b`` as ``a ##AT##-##AT## b`` (the paper's BLEU)."""
    return _COMPOUND.sub(r"\1 ##AT##-##AT## \2", line)


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


def metric(name: str, lowercase: bool, references: Optional[list[list[str]]] = None):
    """sacrebleu's metric object of ``name`` (one of METRICS), caching ``references`` if given."""
    from sacrebleu.metrics import BLEU, CHRF, TER

    if name == "bleu":
        return BLEU(lowercase=lowercase, references=references)
    if name == "chrf":
        return CHRF(lowercase=lowercase, references=references)
    # sacreBLEU's TER is case-insensitive by default (signature case:lc), in its library and its
    # command alike; we keep that default so our TER is everyone's TER.
    return TER(references=references)


def describe(score: Any, signature: str) -> dict[str, Any]:
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
    out = describe(score, signature)
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
        m = metric(name, lowercase)
        score = m.corpus_score(list(hyps), refs)
        results[name] = describe(score, str(m.get_signature()))
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
        {name: metric(name, lowercase, refs) for name in metrics},
        references=None,  # each metric caches the references given at construction
        test_type="bs",
    )
    signatures, results = test()
    keys = [k for k in results if k != "System"]  # sacrebleu's metric names, in our order
    number = lambda x: None if x is None else float(x)  # noqa: E731 - numpy float32 -> JSON-safe
    rows = []
    for i, (name, _hyps) in enumerate(systems):
        row: dict[str, Any] = {"system": name, "baseline": i == 0}
        for m, key in zip(metrics, keys):
            r = results[key][i]
            row[m] = {
                "score": number(r.score),
                "mean": number(r.mean),
                "ci": number(r.ci),
                "p_value": number(r.p_value),
            }
        rows.append(row)
    return {
        "signatures": {m: str(signatures[key]) for m, key in zip(metrics, keys)},
        "systems": rows,
    }


def sentence_chrf(hypotheses: Sequence[str], references: Sequence[str]) -> list[float]:
    """sacreBLEU's chrF of each hypothesis against its one reference (its defaults: chrF2, n=6)."""
    from sacrebleu.metrics import CHRF

    scorer = CHRF()
    return [scorer.sentence_score(h, [r]).score for h, r in zip(hypotheses, references)]
