"""xf translate --refill against batch-by-batch decoding on a length-mixed input, as one command.

    python bench/refill.py --path averaged.pt [--lines 200] [--threads 2] [--rounds 2] [--out DIR]

The input alternates Multi30k test2016 captions (short, about 13 subwords) with WMT newstest2013
EN-DE sentences (about 30): the mix where a batch sorted by length still holds sentences that
finish at very different steps, so batch by batch the late steps decode few rows. Beam 4, batch
64, fp32 and --quantize int8, each without and with --refill; the runs alternate for --rounds
rounds and each figure is its best round (wall time of the whole command, model loading
included, the same in every run). Identical outputs: the lines whose every token is the same as
without --refill in the same precision, and the largest score difference (jsonl output). Every
run goes through the CLI (``bench/xf_command.py``), as a user runs it. Writes DIR/refill.md
and prints it.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from xf_command import write_report, xf  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
CASES = {  # name -> the flags it adds to xf translate
    "fp32": [],
    "fp32 --refill": ["--refill"],
    "int8": ["--quantize", "int8"],
    "int8 --refill": ["--quantize", "int8", "--refill"],
}


def mixed_input(data: Path, lines: int) -> list[str]:
    """``lines`` lines, test2016 and newstest2013 taken in turn."""
    captions = (data / "multi30k" / "test2016.en").read_text(encoding="utf-8").splitlines()
    news = (data / "wmt14" / "newstest2013.en-de.en").read_text(encoding="utf-8").splitlines()
    return [(captions if i % 2 == 0 else news)[i // 2] for i in range(lines)]


def hypotheses(path: Path) -> list[tuple[list[str], float]]:
    return [(r["hypotheses"][0]["tokens"], r["hypotheses"][0]["score"])
            for r in map(json.loads, path.read_text(encoding="utf-8").splitlines())]


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--path", required=True, help="the checkpoint (EN-DE)")
    ap.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data",
                    help="a folder with multi30k/ and wmt14/ (default ../shared/data)")
    ap.add_argument("--lines", type=int, default=200)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--beam-size", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None, help="where refill.md goes (default: a temporary folder)")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="xf-refill-") as tmp:
        work = Path(tmp)
        source = work / "mixed.en"
        source.write_text("\n".join(mixed_input(a.data, a.lines)) + "\n", encoding="utf-8")
        best = {name: float("inf") for name in CASES}
        for _ in range(a.rounds):
            for name, flags in CASES.items():
                start = time.perf_counter()
                xf("translate", "--path", a.path, "--input", source, "--output", work / f"{name}.jsonl",
                   "--output-format", "jsonl", "--beam-size", a.beam_size, "--batch-size", a.batch_size,
                   "--threads", a.threads, "--quiet", *flags)
                best[name] = min(best[name], time.perf_counter() - start)
        found = {name: hypotheses(work / f"{name}.jsonl") for name in CASES}
    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    flags = " ".join(sorted(set(re.findall(r"\b(avx2|avx512f|avx512_vnni|avx512_bf16|amx_int8|amx_bf16)\b", cpuinfo))))
    rows = [f"# --refill: {a.path}, {a.lines} lines (test2016 and newstest2013 in turn), beam {a.beam_size}, "
            f"batch {a.batch_size}, {a.threads} thread(s), best of {a.rounds} rounds; CPU flags: {flags}", "",
            "| case | seconds | sentences/s | speed-up | identical tokens | largest score difference |",
            "|---|---|---|---|---|---|"]
    for name in CASES:
        base = name.replace(" --refill", "")
        same = sum(x[0] == y[0] for x, y in zip(found[name], found[base]))
        diff = max(abs(x[1] - y[1]) for x, y in zip(found[name], found[base]))
        rows.append(f"| {name} | {best[name]:.1f} | {a.lines / best[name]:.2f} | {best[base] / best[name]:.2f}x | "
                    f"{same}/{a.lines} | {diff:.1e} |")
    text = "\n".join(rows) + "\n"
    write_report(text, a.out, "refill.md")


if __name__ == "__main__":
    main(sys.argv[1:])
