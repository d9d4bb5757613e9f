"""Terminology through lexical constraints: term-hit rate, BLEU and speed, as one command.

    python bench/terminology.py --path averaged.pt [--data ../shared/data] [--threads 1] [--out DIR]

1. The Wiktionary set of Dinu et al. (2019) (``terminology/``: 727 newstest2017 EN-DE sentences,
   884 term pairs): the term-hit rate (the share of term pairs whose target term occurs in the
   output, as a whole word) and sacreBLEU on those sentences, beam 4, for three runs: no
   constraints, each sentence's own target terms as hard constraints (``--input-format jsonl``),
   and the 884 pairs as one glossary (``--glossary``: every source term found in any sentence
   becomes a constraint).
2. The speed of constrained search against unconstrained on Multi30k val (the first 500 lines):
   beam 4 with 0, 1, 2 and 4 constraints per sentence, each a word of the sentence's reference
   (the longest not yet taken), the runs alternated for ``--rounds`` rounds, each figure its
   best round, wall time of the whole command (model loading included, the same in every run).

Writes DIR/terminology.md (the tables) and prints it; every run goes through the CLI
(``xf translate``), as a user runs it. The figures are only as good as the model: a Multi30k
caption model translates news poorly, so compare the rows with each other, not with the paper.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def xf(*args, threads: int) -> float:
    """Run ``xf ARGS`` in its own process; its wall time in seconds."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "xformer_cli", *map(str, args)], check=True, env=env)
    return time.perf_counter() - start


def term_hits(hyps: list[str], terms: list[list[tuple[str, str]]]) -> tuple[int, int]:
    hit = total = 0
    for hyp, pairs in zip(hyps, terms):
        for _, target in pairs:
            total += 1
            hit += re.search(rf"(?<!\w){re.escape(target)}(?!\w)", hyp) is not None
    return hit, total


def bleu(hyps: list[str], refs: list[str]) -> float:
    import sacrebleu

    return sacrebleu.corpus_bleu(hyps, [refs]).score


def wiktionary(root: Path) -> tuple[list[str], list[str], list[list[tuple[str, str]]]]:
    """The Wiktionary set in ``root`` (terminology/): its sources, references and, per sentence,
    its (source term, target term) pairs."""
    src = (root / "newstest2017.en-de.en").read_text(encoding="utf-8").splitlines()
    ref = (root / "newstest2017.en-de.de").read_text(encoding="utf-8").splitlines()
    lines, terms = [], []
    for row in (root / "wikt.727.terminology.tsv").read_text(encoding="utf-8").splitlines():
        cells = [c for c in row.split("\t")]
        number = int(cells[1])
        pairs = [(cells[i], cells[i + 1]) for i in range(2, len(cells) - 1, 2) if cells[i] and cells[i + 1]]
        lines.append(number - 1)
        terms.append(pairs)
    return [src[i] for i in lines], [ref[i] for i in lines], terms


def glossary_text(terms: list[list[tuple[str, str]]]) -> str:
    """Every pair as one glossary file (xf translate --glossary): a source term's targets its forms."""
    glossary = {}
    for pairs in terms:
        for s, t in pairs:
            glossary.setdefault(s.lower(), (s, set()))[1].add(t)
    return "".join(f"{s}\t{'|'.join(sorted(ts))}\n" for s, ts in glossary.values())


def terminology(a, work: Path) -> list[str]:
    sources, refs, terms = wiktionary(a.data / "terminology")
    (work / "t.en").write_text("\n".join(sources) + "\n", encoding="utf-8")
    with open(work / "t.jsonl", "w", encoding="utf-8") as f:
        for s, pairs in zip(sources, terms):
            f.write(json.dumps({"source": s, "constraints": sorted({t for _, t in pairs})}, ensure_ascii=False) + "\n")
    (work / "glossary.tsv").write_text(glossary_text(terms), encoding="utf-8")
    common = ["translate", "--path", a.path, "--beam-size", 4, "--threads", a.threads, "--quiet"]
    runs = {
        "no constraints": [*common, "--input", work / "t.en", "--output", work / "plain.de"],
        "each sentence's terms as constraints": [*common, "--input", work / "t.jsonl", "--input-format", "jsonl",
                                                 "--output", work / "constrained.de"],
        "the 884 pairs as a glossary": [*common, "--input", work / "t.en", "--glossary", work / "glossary.tsv",
                                        "--output", work / "glossary.de"],
    }
    out = ["| run | term-hit rate | sacreBLEU | seconds |", "|---|---|---|---|"]
    for name, args in runs.items():
        seconds = xf(*args, threads=a.threads)
        hyps = Path(args[args.index("--output") + 1]).read_text(encoding="utf-8").splitlines()
        hit, total = term_hits(hyps, terms)
        out.append(f"| {name} | {hit}/{total} ({100 * hit / total:.1f}%) | {bleu(hyps, refs):.2f} | {seconds:.1f} |")
    return out


def speed(a, work: Path) -> list[str]:
    m30k = a.data / "multi30k"
    src = (m30k / "val.en").read_text(encoding="utf-8").splitlines()[: a.lines]
    ref = (m30k / "val.de").read_text(encoding="utf-8").splitlines()[: a.lines]
    files = {}
    for k in (0, 1, 2, 4):
        path = work / f"c{k}.jsonl"
        with open(path, "w", encoding="utf-8") as f:
            for s, r in zip(src, ref):
                words = sorted({w.strip(".,;:!?\"'") for w in r.split()}, key=lambda w: (-len(w), w))[:k]
                f.write(json.dumps({"source": s, "constraints": [w for w in words if w]}, ensure_ascii=False) + "\n")
        files[k] = path
    best = {k: float("inf") for k in files}
    for _ in range(a.rounds):
        for k, path in files.items():
            best[k] = min(best[k], xf("translate", "--path", a.path, "--beam-size", 4, "--threads", a.threads,
                                      "--quiet", "--input", path, "--input-format", "jsonl",
                                      "--output", work / f"c{k}.de", threads=a.threads))
    out = ["| constraints per sentence | seconds (best of rounds) | ratio to none | BLEU |", "|---|---|---|---|"]
    for k in files:
        hyps = (work / f"c{k}.de").read_text(encoding="utf-8").splitlines()
        out.append(f"| {k} | {best[k]:.1f} | {best[k] / best[0]:.2f}x | {bleu(hyps, ref):.2f} |")
    return out


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--path", required=True, help="the checkpoint (EN-DE)")
    ap.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data",
                    help="a folder with terminology/ and multi30k/ (default ../shared/data)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--lines", type=int, default=500, help="Multi30k val lines of the speed runs")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None, help="where terminology.md goes (default: a temporary folder)")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="xf-terms-") as tmp:
        work = Path(tmp)
        flags = " ".join(sorted(set(re.findall(r"\b(avx2|avx512f|avx512_vnni|avx512_bf16|amx_int8|amx_bf16)\b",
                                              Path("/proc/cpuinfo").read_text())))) if Path("/proc/cpuinfo").exists() else "?"
        text = "\n".join([f"# Terminology: {a.path}, beam 4, {a.threads} thread(s); CPU flags: {flags}", "",
                          "## The Wiktionary set (Dinu et al. 2019), 727 sentences", "", *terminology(a, work), "",
                          f"## Speed: Multi30k val, {a.lines} lines, {a.rounds} rounds", "", *speed(a, work), ""])
    out = a.out or Path(tempfile.mkdtemp(prefix="xf-terms-out-"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "terminology.md").write_text(text, encoding="utf-8")
    print(text)
    print(f"written: {out / 'terminology.md'}")


if __name__ == "__main__":
    main(sys.argv[1:])
