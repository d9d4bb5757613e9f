"""xf preprocess: pairs per second and peak memory for 1 and 2 workers on 1M and 4M pairs.

The corpora repeat Multi30k's training data (29,000 pairs). The sentencepiece model is learned
once, on Multi30k itself (its own row), and the measured runs reuse it with --spm-model, so they
time the line check and the binarization. Each run is its own ``python -m xformer_cli`` process
and its peak memory is that of the whole process tree (main + workers, summed, polled from
/proc). The aims: 2 workers >= 1.7x one worker, and the 4M peak within 10% of the 1M peak.

XF_BENCH_PAIRS_SCALE shrinks the corpora (0.01: 10k and 40k pairs) to check that this runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MULTI30K = Path(os.environ.get("MULTI30K_DIR", REPO.parent / "shared" / "data" / "multi30k"))
SCALE = float(os.environ.get("XF_BENCH_PAIRS_SCALE", "1"))
SIZES = (1_000_000, 4_000_000)
WORKERS = (1, 2)
VOCAB = 8000


def make_corpus(prefix: Path, pairs: int) -> None:
    """``prefix.en/.de`` with ``pairs`` lines: Multi30k's training data repeated (and cut)."""
    for lang in ("en", "de"):
        lines = (MULTI30K / f"train.{lang}").read_bytes().splitlines(keepends=True)
        repeats, rest = divmod(pairs, len(lines))
        block = b"".join(lines)
        with open(f"{prefix}.{lang}", "wb") as f:
            for _ in range(repeats):
                f.write(block)
            f.write(b"".join(lines[:rest]))


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                stat = Path(entry.path, "stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])  # the name in (...) may hold spaces
            tree.setdefault(ppid, []).append(int(entry.name))
    return tree


def tree_rss_mib(pid: int) -> float:
    """Resident memory of ``pid`` and all its descendants, summed (MiB)."""
    tree, todo, kib = _children(), [pid], 0
    while todo:
        p = todo.pop()
        todo.extend(tree.get(p, []))
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    kib += int(line.split()[1])
        except OSError:
            pass  # exited meanwhile
    return kib / 1024


def run_preprocess(args: list[str]) -> tuple[float, float]:
    """Wall seconds and peak process-tree RSS (MiB) of one ``xf preprocess`` run."""
    with tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "xformer_cli", "preprocess", *args],
                                stdout=subprocess.DEVNULL, stderr=err, cwd=REPO)
        peak = 0.0
        while proc.poll() is None:
            peak = max(peak, tree_rss_mib(proc.pid))
            time.sleep(0.05)
        seconds = time.perf_counter() - start
        if proc.returncode:
            err.seek(0)
            raise RuntimeError(f"xf preprocess {' '.join(args)} failed:\n{err.read().decode()[-2000:]}")
    return seconds, peak


def rows() -> list[dict]:
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="xf-bench-preprocess-") as tmp:
        tmp = Path(tmp)
        seconds, peak = run_preprocess(["--trainpref", str(MULTI30K / "train"), "--destdir", str(tmp / "m30k"),
                                        "--bpe-vocab-size", str(VOCAB), "--workers", "2"])
        rows.append(dict(bench="preprocess", case=f"learn BPE {VOCAB} + binarize Multi30k train (29k pairs), 2 workers",
                         metric="time", value=seconds, unit="s", note=f"peak RSS {peak:.0f} MiB"))
        spm_model = str(tmp / "m30k" / "spm.model")
        throughput: dict[tuple[int, int], float] = {}
        peaks: dict[tuple[int, int], float] = {}
        for size in SIZES:
            pairs = max(1000, int(size * SCALE))
            make_corpus(tmp / "corpus", pairs)
            for workers in WORKERS:
                seconds, peak = run_preprocess(["--trainpref", str(tmp / "corpus"), "--destdir", str(tmp / "out"),
                                                "--spm-model", spm_model, "--workers", str(workers), "--overwrite"])
                meta = json.loads((tmp / "out" / "meta.json").read_text())
                assert meta["stats"]["train"]["pairs_in"] == pairs
                throughput[size, workers], peaks[size, workers] = pairs / seconds, peak
                case = f"{pairs / 1e6:g}M pairs, {workers} worker{'s' if workers > 1 else ''}"
                one = throughput[size, 1]
                rows.append(dict(bench="preprocess", case=case, metric="throughput", value=pairs / seconds,
                                 unit="pairs/s", ratio=throughput[size, workers] / one if workers > 1 else None,
                                 note=("vs 1 worker (target >= 1.7); " if workers > 1 else "")
                                 + f"{seconds:.1f}s wall, check + binarize"))
                first = peaks[SIZES[0], workers]
                rows.append(dict(bench="preprocess", case=case, metric="peak RSS", value=peak, unit="MiB",
                                 ratio=peak / first if size != SIZES[0] else None,
                                 note=f"process tree; vs {max(1000, int(SIZES[0] * SCALE)) / 1e6:g}M pairs (target <= 1.1)"
                                 if size != SIZES[0] else "process tree (main + workers)"))
    return rows


if __name__ == "__main__":
    for row in rows():
        print(row)
