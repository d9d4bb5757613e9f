"""The table of recipes/formality/run.sh: for each model and requested address, the formality
accuracy on CoCoA-MT and sacreBLEU against the requested and the other reference.

    python table.py WORK_DIR

Reads WORK_DIR/raw/test.* (split.py) and each model's translations, WORK_DIR/MODEL/test.ASKED.de:
``plain`` (no tags) translated once, untagged (``none``), which stands for both requests; ``tagged``
with --formality formal, informal, and untagged. A row per (model, request): the accuracy of the
request (formality_score: the share of formal, or informal, among the outputs labelled formal or
informal), the label counts, and BLEU against the requested reference and against the other one
(a model that follows the request scores higher against the first). The untagged rows of the
tagged model show its own mix. Also each model's updates, and the tagged training pairs. Prints the
table and writes WORK_DIR/results.md.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from xformer_cli.base.fileio import atomic_write_text
from xformer_cli.model.checkpoint import load_checkpoint
from xformer_cli.text.formality_score import score
from xformer_cli.text.metrics import compute_scores

# (model, the tag it was given, the request it stands for)
ROWS = [("plain", "none", "formal"), ("plain", "none", "informal"), ("tagged", "formal", "formal"),
        ("tagged", "informal", "informal"), ("tagged", "none", "formal"), ("tagged", "none", "informal")]


def read(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def word_distance(a: str, b: str) -> int:
    """Word-level edit distance (insertions, deletions, substitutions) of two sentences."""
    x, y = a.split(), b.split()
    row = list(range(len(y) + 1))
    for i, u in enumerate(x, 1):
        prev, row[0] = row[0], i
        for j, v in enumerate(y, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (u != v))
    return row[-1]


def mean_distance(first: list[str], second: list[str]) -> float:
    return sum(map(word_distance, first, second)) / max(len(first), 1)


def domain_rows(work: Path, split: dict, annotated: dict) -> list[str]:
    """The tagged model's accuracy for each request in each CoCoA-MT domain."""
    domains = split.get("test_domains") or {}
    rows, start = [], 0
    for domain, n in domains.items():
        cells = []
        for requested in ("formal", "informal"):
            path = work / "tagged" / f"test.{requested}.de"
            if not path.exists():
                return []
            hyps = read(path)[start:start + n]
            result = score(hyps, annotated["formal"][start:start + n], annotated["informal"][start:start + n])
            cells.append(f"{result.accuracy(requested):.3f}")
        rows.append(f"| {domain} | {n} | {' | '.join(cells)} |")
        start += n
    return ["| domain | segments | accuracy formal | accuracy informal |", "|---|---|---|---|"] + rows if rows else []


def valid_rows(work: Path) -> list[str]:
    """sacreBLEU on Tatoeba's validation split: both models untagged, the tagged one also with each
    line's reference's own formality (oracle.py)."""
    ref_path = work / "raw" / "valid.de"
    rows = []
    for model, asked in (("plain", "none"), ("tagged", "none"), ("tagged", "oracle")):
        path = work / model / f"valid.{asked}.de"
        if path.exists() and ref_path.exists():
            bleu = compute_scores(read(path), [read(ref_path)], ["bleu"])["bleu"]["score"]
            given = "each line its reference's formality" if asked == "oracle" else "untagged"
            rows.append(f"| {model} | {given} | {bleu:.2f} |")
    return ["| model | tags given | BLEU |", "|---|---|---|"] + rows if rows else []


def table(work: Path) -> str:
    raw = work / "raw"
    refs = {f: read(raw / f"test.{f}.de") for f in ("formal", "informal")}
    annotated = {f: read(raw / f"test.{f}.annotated.de") for f in ("formal", "informal")}
    lines = ["| model | tag given | requested | accuracy | formal / informal / neutral / other | BLEU requested ref "
             "| BLEU other ref |", "|---|---|---|---|---|---|---|"]
    for model, tag, requested in ROWS:
        hyp_path = work / model / f"test.{tag}.de"
        if not hyp_path.exists():
            continue
        hyps = read(hyp_path)
        result = score(hyps, annotated["formal"], annotated["informal"])
        other = "informal" if requested == "formal" else "formal"
        bleu = {f: compute_scores(hyps, [refs[f]], ["bleu"])["bleu"]["score"] for f in (requested, other)}
        counts = " / ".join(str(result.counts[k]) for k in ("formal", "informal", "neutral", "other"))
        lines.append(f"| {model} | {tag} | {requested} | {result.accuracy(requested):.3f} | {counts} | "
                     f"{bleu[requested]:.2f} | {bleu[other]:.2f} |")
    notes = []
    for model in ("plain", "tagged"):
        ckpt = work / model / "averaged.pt"
        if ckpt.exists():
            notes.append(f"{model}: {load_checkpoint(ckpt, mmap=True)['meta'].get('num_updates', '?')} updates")
    meta_path = work / "tagged" / "data-bin" / "meta.json"
    if meta_path.exists():
        tagged = json.loads(meta_path.read_text(encoding="utf-8"))["stats"]["train"]["formality"]
        notes.append(f"tagged training pairs: {tagged['formal']:,} formal, {tagged['informal']:,} informal, "
                     f"{tagged['untagged']:,} untagged")
    split = json.loads((raw / "split.json").read_text(encoding="utf-8"))
    head = (f"CoCoA-MT EN-DE (train split, {split['test']} segments) translated by models trained on Tatoeba "
            f"({split['train']:,} training pairs, {split['valid']:,} validation); " + "; ".join(notes))
    text = head + "\n\n" + "\n".join(lines) + "\n"
    domains = domain_rows(work, split, annotated)
    if domains:
        text += "\nBy CoCoA-MT domain (the tagged model):\n\n" + "\n".join(domains) + "\n"
    formal, informal = work / "tagged" / "test.formal.de", work / "tagged" / "test.informal.de"
    if formal.exists() and informal.exists():
        text += (f"\nWords changed between one source's formal and informal outputs (word edit distance, mean): "
                 f"{mean_distance(read(formal), read(informal)):.2f}; between its two references: "
                 f"{mean_distance(refs['formal'], refs['informal']):.2f}\n")
    valid = valid_rows(work)
    if valid:
        text += f"\nTatoeba validation split ({split['valid']:,} pairs), sacreBLEU:\n\n" + "\n".join(valid) + "\n"
    return text


def main(argv=None) -> None:
    work = Path((argv or sys.argv[1:])[0])
    text = table(work)
    atomic_write_text(work / "results.md", text)
    print(text, end="")


if __name__ == "__main__":
    main()
