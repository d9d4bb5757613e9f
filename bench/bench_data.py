"""Opening a split: the structure and token-id check of ``TokenArray.verify`` at WMT14 EN-FR size.

A synthetic split of 36M sentences (sizes 1..59 subwords, 30 on average: about 1.08G tokens,
uint16, a 2.2 GB .bin and a 430 MB .idx) is written once. Measured, alternately, three times
each: ``TokenArray(prefix).verify(vocab)`` (what ``DataDir.split`` does on every open) and a
plain sequential read of the same .bin and .idx (the floor any check that reads every byte has);
the ratio is verify / read. Both run from the page cache after the first pass.

XF_BENCH_DATA_SCALE shrinks it (0.01: 360k sentences) to check that this runs.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import numpy as np

from xformer_cli.data.dataset import TokenArray, TokenArrayWriter

SCALE = float(os.environ.get("XF_BENCH_DATA_SCALE", "1"))
SENTENCES = int(36_000_000 * SCALE)
VOCAB = 32000


def write_split(prefix: Path, chunk: int = 1 << 20) -> None:
    rng = np.random.default_rng(0)
    writer = TokenArrayWriter(prefix, np.uint16)
    for start in range(0, SENTENCES, chunk):
        sizes = rng.integers(1, 60, min(chunk, SENTENCES - start), dtype=np.int32)
        writer.add_flat(rng.integers(4, VOCAB, int(sizes.sum()), dtype=np.uint16), sizes)
    writer.close()


def read_all(prefix: Path, block: int = 1 << 23) -> None:
    buffer = bytearray(block)
    for suffix in (".idx", ".bin"):
        with open(f"{prefix}{suffix}", "rb", buffering=0) as f:
            while f.readinto(buffer):
                pass


def rows() -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="xf-bench-data-") as tmp:
        prefix = Path(tmp) / "train.fr"
        write_split(prefix)
        tokens = os.path.getsize(f"{prefix}.bin") // 2
        read_all(prefix)  # into the page cache
        verify, read = [], []
        for _ in range(3):
            t = time.perf_counter()
            TokenArray(prefix).verify(VOCAB)
            verify.append(time.perf_counter() - t)
            t = time.perf_counter()
            read_all(prefix)
            read.append(time.perf_counter() - t)
    v, r = min(verify), min(read)
    case = f"{SENTENCES / 1e6:.1f}M sentences, {tokens / 1e9:.2f}G tokens"
    return [
        dict(bench="data", case=case, metric="open + verify", value=v, unit="s", ratio=v / r,
             note="ratio: against reading the files once"),
        dict(bench="data", case=case, metric="read the files once", value=r, unit="s"),
    ]
