"""Fill bench/gpu-data/ (git-ignored) for bench/gpu.sh, on a machine that has Multi30k.

The GPU machine may get the checkout and nothing beside it (no data, no network), so the quality
stage's Multi30k EN-DE travels inside it, in bench/gpu-data/. It is preprocessed on the machine
that has the data, not on the GPU machine, so that no GPU second goes to learning a BPE:

    python bench/gpu_data.py --multi30k DIR       # DIR: train/val/test2016 .en/.de (a few MiB out)
    python bench/gpu_data.py                      # the default DIR: ../shared/data/multi30k
    python bench/gpu_data.py --lines 2000 --test-lines 60 --bpe 1000 --dest DIR   # the dry run's

DEST/m30k-ende/ is ``xf preprocess`` of train and val (joint BPE 8000, length ratio 2.5, as
recipes/multi30k/cpu.yaml); DEST/test2016.en and .de are the raw test set; DEST/commit.txt names
the commit the checkout was at (the GPU machine has the files, not necessarily git).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def head(src: Path, dst: Path, lines: int | None) -> None:
    with open(src, encoding="utf-8") as f, open(dst, "w", encoding="utf-8") as out:
        for i, line in enumerate(f):
            if lines is not None and i >= lines:
                break
            out.write(line)


def fill(multi30k: Path, dest: Path, lines: int | None, test_lines: int | None, bpe: int) -> Path:
    from xf_command import xf

    missing = [f"{multi30k}/{s}.{lang}" for s in ("train", "val", "test2016") for lang in ("en", "de")
               if not (multi30k / f"{s}.{lang}").exists()]
    if missing:
        raise SystemExit(f"gpu_data: {missing[0]} is missing (--multi30k names the folder of Multi30k)")
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="xf-gpu-data-") as tmp:
        for split in ("train", "val"):
            for lang in ("en", "de"):
                head(multi30k / f"{split}.{lang}", Path(tmp) / f"{split}.{lang}", lines)
        xf("preprocess", "--destdir", dest / "m30k-ende", "--source-lang", "en", "--target-lang", "de",
           "--trainpref", f"{tmp}/train", "--validpref", f"{tmp}/val", "--bpe-vocab-size", bpe,
           "--max-len-ratio", 2.5, "--overwrite")
    for lang in ("en", "de"):
        head(multi30k / f"test2016.{lang}", dest / f"test2016.{lang}", test_lines)
    commit = subprocess.run(["git", "-C", str(REPO), "describe", "--always", "--dirty"], capture_output=True,
                            text=True).stdout.strip()
    (dest / "commit.txt").write_text((commit or "unknown") + "\n")
    return dest


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--multi30k", type=Path, default=REPO / ".." / "shared" / "data" / "multi30k")
    ap.add_argument("--dest", type=Path, default=REPO / "bench" / "gpu-data")
    ap.add_argument("--lines", type=int, default=None, help="training and validation lines (default: all)")
    ap.add_argument("--test-lines", type=int, default=None, help="test2016 lines (default: all 1000)")
    ap.add_argument("--bpe", type=int, default=8000, help="joint BPE vocabulary size")
    a = ap.parse_args(argv)
    dest = fill(a.multi30k.resolve(), a.dest, a.lines, a.test_lines, a.bpe)
    size = sum(p.stat().st_size for p in dest.rglob("*") if p.is_file())
    print(f"{dest}: {size / 2**20:.1f} MiB (carry it: bench/gpu-data)")


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    main(sys.argv[1:])
