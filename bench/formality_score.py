"""Formality accuracy of translations against CoCoA-MT's annotated references
(xformer_cli/text/formality_score.py: the paper's, and the official scorer's, rules).

    python bench/formality_score.py --hyp out.de --formal-refs F.formal.annotated.de \
        --informal-refs F.informal.annotated.de [--requested formal] [--json]

Several files of each (comma-separated, in the same order) are read as one: CoCoA-MT's domains.
Prints the count of each label (formal, informal, neutral, other) and the formal and informal
accuracy; with --requested, the accuracy of that formality first.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from xformer_cli.text.formality_score import LABELS, score  # noqa: E402


def read(paths: str) -> list[str]:
    return [line for path in paths.split(",") for line in Path(path).read_text(encoding="utf-8").splitlines()]


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hyp", required=True, help="translations, one a line (comma-separated files: read as one)")
    parser.add_argument("--formal-refs", required=True, help="the formal references marked [F]...[/F]")
    parser.add_argument("--informal-refs", required=True, help="the informal references marked [F]...[/F]")
    parser.add_argument("--requested", choices=("formal", "informal"), help="the formality the system was asked for")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    args = parser.parse_args(argv)
    result = score(read(args.hyp), read(args.formal_refs), read(args.informal_refs))
    report = {**result.counts, "matched": result.matched,
              "formal_accuracy": result.accuracy("formal"), "informal_accuracy": result.accuracy("informal")}
    if args.requested:
        report = {"requested": args.requested, "accuracy": result.accuracy(args.requested), **report}
    if args.json:
        print(json.dumps(report))
    else:
        if args.requested:
            print(f"{args.requested} accuracy {report['accuracy']:.3f}")
        print(" ".join(f"{name} {result.counts[name]}" for name in LABELS)
              + f"; formal accuracy {report['formal_accuracy']:.3f}, informal accuracy {report['informal_accuracy']:.3f}")
    return report


if __name__ == "__main__":
    main()
