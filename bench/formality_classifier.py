"""The formality classifier (xformer_cli/text/formality.py) against CoCoA-MT's references: precision
and recall of formal, informal and none.

    python bench/formality_classifier.py [--data ../shared/data/cocoa-mt] [--errors 10]

Each English segment of CoCoA-MT EN-DE (train split, telephony and topical_chat, 400 segments)
has a formal and an informal German reference. Where the two differ, the formal one should
classify ``formal`` and the informal one ``informal``; where they are the same (23 segments:
nothing to choose), that one sentence should classify ``none``. (A proxy: one of those 23
addresses the reader formally in both references, "für Sie kassiert", and counts as an error of
the classifier's.) Two runs: the German alone, and with the English source, which
``classify`` reads only where the German is ambiguous (Sie sind: you or they). Prints one table
per run: per class the gold and predicted counts, precision and recall, then the confusion
counts; ``--errors N`` also prints the first N misclassified sentences of each run.
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from xformer_cli.text.formality import LABELS, classify  # noqa: E402

DOMAINS = ("telephony", "topical_chat")


def read_lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def gold_items(data: Path) -> list[tuple[str, str, str]]:
    """(German sentence, English source, gold label) of every reference, as the docstring says."""
    items = []
    for domain in DOMAINS:
        stem = data / f"formality-control.train.{domain}.en-de"
        english = read_lines(Path(f"{stem}.en"))
        formal, informal = read_lines(Path(f"{stem}.formal.de")), read_lines(Path(f"{stem}.informal.de"))
        if not len(english) == len(formal) == len(informal):
            raise SystemExit(f"{stem}.*: the files have different line counts")
        for en, f, i in zip(english, formal, informal):
            items += [(f, en, "none")] if f == i else [(f, en, "formal"), (i, en, "informal")]
    return items


def measure(items: list[tuple[str, str, str]], with_source: bool) -> tuple[dict, list]:
    """{(gold, predicted): count} and the misclassified items (sentence, gold, predicted)."""
    counts: collections.Counter = collections.Counter()
    wrong = []
    for german, english, gold in items:
        predicted = classify(german, english if with_source else None)
        counts[gold, predicted] += 1
        if predicted != gold:
            wrong.append((german, gold, predicted))
    return counts, wrong


def table(counts: dict, title: str) -> str:
    rows = [title, f"{'class':<10}{'gold':>6}{'predicted':>11}{'correct':>9}{'precision':>11}{'recall':>8}"]
    for label in LABELS:
        gold = sum(n for (g, _), n in counts.items() if g == label)
        predicted = sum(n for (_, p), n in counts.items() if p == label)
        correct = counts.get((label, label), 0)
        precision = f"{correct / predicted:.3f}" if predicted else "-"
        recall = f"{correct / gold:.3f}" if gold else "-"
        rows.append(f"{label:<10}{gold:>6}{predicted:>11}{correct:>9}{precision:>11}{recall:>8}")
    total = sum(counts.values())
    accuracy = sum(counts.get((label, label), 0) for label in LABELS) / max(total, 1)
    rows.append(f"{'all':<10}{total:>6}{'':>11}{'':>9}{'':>11}{'':>8}  accuracy {accuracy:.3f}")
    rows.append("confusion (gold -> predicted): " + ", ".join(
        f"{g}->{p} {n}" for (g, p), n in sorted(counts.items()) if g != p) or "none")
    return "\n".join(rows)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data" / "cocoa-mt",
                        help="the CoCoA-MT EN-DE directory (default ../shared/data/cocoa-mt)")
    parser.add_argument("--errors", type=int, default=0, help="print the first N misclassified sentences of each run")
    args = parser.parse_args(argv)
    items = gold_items(args.data)
    for with_source, title in ((False, "German only"), (True, "with the English source (read where the German is "
                                                                 "ambiguous)")):
        counts, wrong = measure(items, with_source)
        print(table(counts, f"CoCoA-MT EN-DE train ({len(items)} references): {title}"))
        for german, gold, predicted in wrong[: args.errors]:
            print(f"  {gold} -> {predicted}: {german}")
        print()


if __name__ == "__main__":
    main()
