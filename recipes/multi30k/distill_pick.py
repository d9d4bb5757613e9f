"""The n-best pick of recipes/multi30k/distill.sh (DISTILL_NBEST): of the teacher's N best
translations of each training source, keep the one closest to the reference (sentence chrF), as
Kim and Rush's Seq-Inter does with sentence BLEU, and the Bergamot students' data with chrF.

    python distill_pick.py NBEST REFERENCE OUT

NBEST is `xf translate --nbest N --output-format jsonl`: one record a source line, in order, its
"hypotheses" best first. REFERENCE has one line a record. OUT gets the text of the hypothesis of
highest chrF against its reference (ties: the teacher's better one), one line a record, written
atomically; a bad record is a one-line error naming the file and line, and nothing is written.
"""

import sys

import sacrebleu

from xformer_cli.base.errors import XfError
from xformer_cli.base.fileio import atomic_write_text
from xformer_cli.base.json_input import parse_json

from distill_filter import read_lines


def hypotheses(path: str) -> list[list[str]]:
    """The hypotheses' texts of each record of ``path`` (xf translate's jsonl), best first."""
    texts = []
    for number, line in enumerate(read_lines(path), 1):
        record = parse_json(line, f"{path}:{number}", hint="not a record of xf translate --output-format jsonl")
        hyps = record.get("hypotheses") if isinstance(record, dict) else None
        if not isinstance(hyps, list) or not hyps or not all(
                isinstance(h, dict) and isinstance(h.get("text"), str) for h in hyps):
            raise XfError(f"{path}:{number}: no 'hypotheses' with texts (not a record of xf translate "
                          "--output-format jsonl)")
        texts.append([h["text"] for h in hyps])
    return texts


def pick(nbest: list[str], reference: str) -> str:
    """The hypothesis of highest sentence chrF against ``reference``; the first of equals."""
    scores = [sacrebleu.sentence_chrf(h, [reference]).score for h in nbest]
    return nbest[scores.index(max(scores))]


def main(nbest: str, reference: str, out: str) -> None:
    texts, refs = hypotheses(nbest), read_lines(reference)
    if len(texts) != len(refs):
        raise XfError(f"{nbest} has {len(texts)} records but {reference} has {len(refs)} lines")
    chosen = [pick(hyps, ref) for hyps, ref in zip(texts, refs)]
    atomic_write_text(out, "".join(line + "\n" for line in chosen))
    moved = sum(c != hyps[0] for c, hyps in zip(chosen, texts))
    print(f"{out}: {len(chosen)} lines, {moved} not the teacher's best", file=sys.stderr)


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    try:
        main(*sys.argv[1:])
    except XfError as e:  # one line, as xf's own errors, and nothing written
        sys.exit(f"error: {e}")
