"""The WMT-sized dry run: xf preprocess and xf train on corpora of WMT14's size, on the CPU.

Run it by name (``BENCH=scale make bench``); plain ``make bench`` skips it (the full sizes take
tens of minutes and gigabytes of disk). The sentences are real: Multi30k EN-FR train (29,000
pairs) and News Commentary EN-FR (5,000) from ../shared/data, each repetition in another seeded
order; validation is newstest2013 EN-FR. The sentencepiece model (8000) is learned once on them.

- preprocess (part ``preprocess``): for each size in XF_BENCH_SCALE_PREPROCESS_PAIRS (default:
  the training sizes), ``xf preprocess`` with XF_BENCH_SCALE_PREPROCESS_WORKERS workers (default
  2) and the learned model (so the time is the line check and binarization): pairs/s and peak memory of the process tree, and their ratio to
  the smallest size (flat: about 1);
- train (part ``train``): for each size in XF_BENCH_SCALE_PAIRS (default 4500000,36000000: WMT14
  EN-DE and EN-FR) a data directory of the binarized sentences repeated the same way (what xf
  preprocess writes for the repeated text, without encoding the same sentences again), then
  ``xf train`` with a `tiny` model (this measures the data path, not the model) for a few updates:
  the time from the process's start to its first update and its peak memory (VmHWM), as ratios to
  the smallest size; on the largest, stopped and resumed mid-epoch: the time to the first update
  after the resume;
- epoch (part ``epoch``): a subset (XF_BENCH_SCALE_SUBSET pairs, default 5000) trained for two
  epochs in one process: the first update of epoch 2 against the median update (nothing is
  reloaded at the boundary, so the ratio stays near 1).

- memory (part ``memory``): the subset trained for XF_BENCH_SCALE_MEMORY_UPDATES updates (2000) at
  --max-tokens XF_BENCH_SCALE_MEMORY_MAX_TOKENS (1024: many distinct batch shapes) in each of
  XF_BENCH_SCALE_MEMORY_PRECISIONS (fp32, and bf16 where the CPU has bf16 instructions), RSS sampled each second: growth per 1,000 updates
  (a least-squares slope after update 100), the peak, and the bf16/fp32 peak ratio.

XF_BENCH_SCALE_PARTS picks the parts (default all four). XF_BENCH_SCALE_DATA names a directory
that keeps the binarized base and the repeated training directories between runs (built when
missing, reused after: a 36M-pair directory takes minutes to write); by default they live in a
temporary directory and go with it.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_preprocess import run_preprocess, tree_rss_mib  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("XF_SHARED_DATA", REPO.parent / "shared" / "data"))
SIZES = [int(float(s)) for s in os.environ.get("XF_BENCH_SCALE_PAIRS", "4500000,36000000").split(",")]
PREPROCESS_SIZES = [int(float(s)) for s in os.environ.get("XF_BENCH_SCALE_PREPROCESS_PAIRS", ",".join(map(str, SIZES))).split(",")]
PREPROCESS_WORKERS = os.environ.get("XF_BENCH_SCALE_PREPROCESS_WORKERS", "2")
SUBSET = int(os.environ.get("XF_BENCH_SCALE_SUBSET", "5000"))
# XF_BENCH_SCALE_PARTS picks parts: preprocess, train (start-up, memory, resume), epoch (the boundary),
# memory (RSS over a long run with many batch shapes, fp32 and bf16)
PARTS = set(os.environ.get("XF_BENCH_SCALE_PARTS", "preprocess,train,epoch,memory").split(","))
KEEP = os.environ.get("XF_BENCH_SCALE_DATA")  # keeps the binarized directories between runs
UPDATES = 3
# the long-run memory check (part ``memory``): updates, precisions, --max-tokens (small: more shapes)
MEMORY_UPDATES = int(os.environ.get("XF_BENCH_SCALE_MEMORY_UPDATES", "2000"))
# bf16 by default only where the CPU multiplies it natively (elsewhere emulated: about 0.03x fp32)
MEMORY_PRECISIONS = os.environ.get("XF_BENCH_SCALE_MEMORY_PRECISIONS", "").split(",") if os.environ.get(
    "XF_BENCH_SCALE_MEMORY_PRECISIONS") else None
MEMORY_MAX_TOKENS = int(os.environ.get("XF_BENCH_SCALE_MEMORY_MAX_TOKENS", "1024"))
MEMORY_WARMUP = 100
TRAIN = ["--arch", "tiny", "--max-tokens", "4096", "--log-interval", "1", "--save-interval-minutes", "0",
         "--device", "cpu", "--warmup-updates", "100"]


def base_pairs() -> tuple[list[bytes], list[bytes]]:
    """Real EN-FR sentence pairs: Multi30k train and News Commentary (pairs with an empty side dropped)."""
    en, fr = [], []
    for src, tgt in ((SHARED / "multi30k" / "train.en", SHARED / "multi30k" / "train.fr"),
                     (SHARED / "wmt_sample" / "news-commentary.en-fr.en", SHARED / "wmt_sample" / "news-commentary.en-fr.fr")):
        for a, b in zip(src.read_bytes().splitlines(), tgt.read_bytes().splitlines()):
            if a.strip() and b.strip():
                en.append(a)
                fr.append(b)
    return en, fr


def make_corpus(prefix: Path, pairs: int, en: list[bytes], fr: list[bytes]) -> None:
    """``prefix.en/.fr`` with ``pairs`` lines: the base pairs repeated, each round in a new order."""
    rng = np.random.default_rng(1)
    with open(f"{prefix}.en", "wb") as out_en, open(f"{prefix}.fr", "wb") as out_fr:
        written = 0
        while written < pairs:
            order = rng.permutation(len(en))[: pairs - written]
            out_en.write(b"\n".join(en[i] for i in order) + b"\n")
            out_fr.write(b"\n".join(fr[i] for i in order) + b"\n")
            written += len(order)


def run_train(data: Path, save: Path, extra: list[str]) -> dict:
    """xf train in its own process: seconds from the start to its first update, its summary."""
    args = [sys.executable, "-m", "xformer_cli", "train", str(data), "--save-dir", str(save), *TRAIN, *extra]
    log = save / "train_log.jsonl"
    seen = log.read_text().count("\n") if log.exists() else 0
    with tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=err, cwd=REPO)
        first, peak_tree, samples, sampled = None, 0.0, [], 0.0
        while proc.poll() is None:
            rss = tree_rss_mib(proc.pid)
            peak_tree = max(peak_tree, rss)
            if first is None and log.exists() and '"type": "train"' in "".join(log.read_text().splitlines(True)[seen:]):
                first = time.perf_counter() - start
            if first is not None and time.perf_counter() - sampled >= 1.0:  # (updates logged, RSS MiB)
                samples.append((log.read_text().count('"type": "train"'), rss))
                sampled = time.perf_counter()
            time.sleep(0.05)
        if proc.returncode:
            err.seek(0)
            raise RuntimeError(f"xf train {' '.join(extra)} failed:\n{err.read().decode()[-2000:]}")
    records = [json.loads(line) for line in log.read_text().splitlines()[seen:]]
    kinds = {r["type"]: r for r in records}
    return dict(first_update_s=first, summary=kinds["summary"], start=kinds["start"],
                train=[r for r in records if r["type"] == "train"], seconds=time.perf_counter() - start,
                samples=samples)


class Rows(list):
    """The rows, each also printed to stderr as it is measured (the full sizes take an hour)."""

    def append(self, row: dict) -> None:
        value = f"{row['value']:,.3g}" if isinstance(row["value"], (int, float)) else row["value"]
        print(f"  scale: {row['case']}: {row['metric']} {value} {row.get('unit', '')}"
              + (f" ({row['ratio']:.2f}x)" if row.get("ratio") else ""), file=sys.stderr, flush=True)
        super().append(row)

    def __iadd__(self, rows):
        for row in rows:
            self.append(row)
        return self


def repeat_data_dir(base: Path, dest: Path, pairs: int) -> None:
    """A data directory like ``base`` whose training split holds ``pairs`` pairs: base's binarized
    sentences repeated, each round in another seeded order (what xf preprocess would write for the
    repeated text, without encoding the same sentences again)."""
    from xformer_cli.data.dataset import TokenArray, TokenArrayWriter

    dest.mkdir()
    for f in base.iterdir():
        if not f.name.startswith("train."):
            shutil.copy(f, dest / f.name)
    meta = json.loads((base / "meta.json").read_text())
    rng = np.random.default_rng(1)
    orders = []
    while sum(map(len, orders)) < pairs:
        orders.append(rng.permutation(len(TokenArray(base / f"train.{meta['source_lang']}")))[: pairs - sum(map(len, orders))])
    for lang in (meta["source_lang"], meta["target_lang"]):
        arr = TokenArray(base / f"train.{lang}")
        offsets, sizes, tokens = np.asarray(arr.offsets), np.asarray(arr.sizes), np.asarray(arr.tokens)
        writer = TokenArrayWriter(dest / f"train.{lang}", arr.dtype)
        for order in orders:
            lens = sizes[order].astype(np.int64)
            ends = np.cumsum(lens)
            # token j of the output comes from offsets[sentence] + (j - start of that sentence)
            gather = np.arange(int(ends[-1])) - np.repeat(ends - lens - offsets[order], lens)
            writer.add_flat(tokens[gather], sizes[order])
        writer.close()
    meta["stats"]["train"] = {"pairs": pairs, "repeated_from": str(base)}
    (dest / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")


def growth_per_1000(samples: list[tuple[int, float]], skip: int = MEMORY_WARMUP) -> float | None:
    """RSS growth in MiB per 1,000 updates: a least-squares line through the (updates, RSS)
    samples after the first ``skip`` updates (allocation, the first shapes); None with fewer than
    two samples there."""
    kept = [(n, r) for n, r in samples if n > skip]
    if len(kept) < 2 or len({n for n, _ in kept}) < 2:
        return None
    slope = np.polyfit([n for n, _ in kept], [r for _, r in kept], 1)[0]
    return float(slope * 1000)


def memory_rows(kept: Path, tmp: Path) -> list[dict]:
    """The long-run memory check: xf train (tiny, Multi30k-like data with many distinct batch
    shapes) for MEMORY_UPDATES updates in each of MEMORY_PRECISIONS, RSS sampled each second:
    growth per 1,000 updates and the peak, and the bf16/fp32 peak ratio (the aim: within 1.3)."""
    data = tmp / "subset-bin"  # the epoch part's subset
    if not data.exists():
        repeat_data_dir(kept / "base-bin", data, SUBSET)
    from xformer_cli.data.batching import batch_by_size
    from xformer_cli.data.dataset import DataDir

    split = DataDir.open(data).split("train")
    shapes = {(len(b), int(split.src_sizes[b].max()), int(split.tgt_sizes[b].max()))
              for b in batch_by_size(split.src_sizes, split.tgt_sizes, MEMORY_MAX_TOKENS)}
    case = f"{SUBSET:,}-pair subset, {len(shapes)} distinct batch shapes"
    from xformer_cli.base.precision import cpu_bf16_instructions

    out, peaks = [], {}
    precisions = MEMORY_PRECISIONS or (["fp32", "bf16"] if cpu_bf16_instructions() else ["fp32"])
    if "bf16" not in precisions:
        out.append(dict(bench="scale", case=case, metric="bf16 memory", value="-",
                        note="not run: this CPU has no bf16 instructions (XF_BENCH_SCALE_MEMORY_PRECISIONS=fp32,bf16 runs it)"))
    for precision in precisions:
        m = run_train(data, tmp / f"ck-memory-{precision}",
                      ["--max-update", str(MEMORY_UPDATES), "--precision", precision,
                       "--max-tokens", str(MEMORY_MAX_TOKENS), "--log-interval", "10"])
        peaks[precision] = m["summary"]["peak_memory_mib"]
        growth = growth_per_1000(m["samples"])
        out += [dict(bench="scale", case=f"{case}, {precision}", metric="train RSS growth per 1,000 updates",
                     value=growth if growth is not None else float("nan"), unit="MiB",
                     note=f"{m['summary']['num_updates']} updates, {len(m['samples'])} samples after update "
                          f"{MEMORY_WARMUP}; least-squares slope"),
                dict(bench="scale", case=f"{case}, {precision}", metric="train peak memory", value=peaks[precision],
                     unit="MiB", note="VmHWM of xf train")]
    if {"fp32", "bf16"} <= peaks.keys():
        out.append(dict(bench="scale", case=case, metric="train peak memory bf16/fp32", value=peaks["bf16"] / peaks["fp32"],
                        unit="x", note="the aim: at most 1.3x; on a CPU without bf16 instructions bf16 is emulated"))
    return out


def rows() -> list[dict]:
    if "scale" not in os.environ.get("BENCH", "").split(",") and __name__ != "__main__":
        return [dict(bench="scale", case="WMT-sized dry run", metric="skipped", value="-",
                     note="run it by name: BENCH=scale make bench (XF_BENCH_SCALE_PAIRS picks the sizes)")]
    out = Rows()
    en, fr = base_pairs()
    with tempfile.TemporaryDirectory(prefix="xf-bench-scale-") as tmp:
        tmp = Path(tmp)
        kept = Path(KEEP) if KEEP else tmp
        kept.mkdir(parents=True, exist_ok=True)
        valid = SHARED / "wmt14" / "newstest2013.en-fr"
        (tmp / "base.en").write_bytes(b"\n".join(en) + b"\n")
        (tmp / "base.fr").write_bytes(b"\n".join(fr) + b"\n")
        if not (kept / "base-bin" / "meta.json").exists():
            run_preprocess(["--trainpref", str(tmp / "base"), "--destdir", str(kept / "base-bin"), "--source-lang", "en",
                            "--target-lang", "fr", "--bpe-vocab-size", "8000", "--workers", "2", "--validpref",
                            str(valid), "--overwrite"])
        spm_model = str(kept / "base-bin" / "spm.model")
        common = ["--source-lang", "en", "--target-lang", "fr", "--spm-model", spm_model, "--workers", PREPROCESS_WORKERS,
                  "--validpref", str(valid)]
        smallest = f"vs {min(PREPROCESS_SIZES) / 1e6:g}M pairs"
        first: dict = {}
        for pairs in sorted(PREPROCESS_SIZES) if "preprocess" in PARTS else []:
            case = f"{pairs / 1e6:g}M pairs EN-FR"
            make_corpus(tmp / "corpus", pairs, en, fr)
            seconds, peak = run_preprocess(["--trainpref", str(tmp / "corpus"), "--destdir", str(tmp / "pp"),
                                            "--overwrite", *common])
            first = first or dict(rate=pairs / seconds, peak=peak)
            out += [
                dict(bench="scale", case=case, metric="preprocess", value=pairs / seconds, unit="pairs/s",
                     ratio=pairs / seconds / first["rate"] if pairs != min(PREPROCESS_SIZES) else None,
                     note=f"{PREPROCESS_WORKERS} worker(s), {seconds:.0f}s; {smallest}"),
                dict(bench="scale", case=case, metric="preprocess peak memory", value=peak, unit="MiB",
                     ratio=peak / first["peak"] if pairs != min(PREPROCESS_SIZES) else None,
                     note=f"process tree; {smallest}"),
            ]
        for lang in ("en", "fr"):
            Path(f"{tmp / 'corpus'}.{lang}").unlink(missing_ok=True)

        smallest = f"vs {min(SIZES) / 1e6:g}M pairs"
        first = {}
        for pairs in sorted(SIZES) if "train" in PARTS else []:
            case = f"{pairs / 1e6:g}M pairs EN-FR"
            data = kept / f"bin-{pairs}"
            if not (data / "meta.json").exists():
                shutil.rmtree(data, ignore_errors=True)  # a build that was interrupted
                repeat_data_dir(kept / "base-bin", data, pairs)
            t = run_train(data, tmp / f"ck-{pairs}", ["--max-update", str(UPDATES)])
            figures = dict(startup=t["first_update_s"], peak=t["summary"]["peak_memory_mib"])
            first = first or figures
            out += [
                dict(bench="scale", case=case, metric="train start to first update", value=figures["startup"],
                     unit="s", ratio=figures["startup"] / first["startup"] if first is not figures else None,
                     note=f"tiny model, includes the first update; {smallest}"),
                dict(bench="scale", case=case, metric="train peak memory", value=figures["peak"], unit="MiB",
                     ratio=figures["peak"] / first["peak"] if first is not figures else None,
                     note=f"VmHWM of xf train; {smallest}"),
            ]
            if pairs == max(SIZES):
                r = run_train(data, tmp / f"ck-{pairs}", ["--max-update", str(UPDATES + 2)])
                out.append(dict(bench="scale", case=case, metric="resume to first update", value=r["first_update_s"],
                                unit="s", ratio=r["first_update_s"] / t["first_update_s"],
                                note=f"resumed at update {r['start']['update']} (epoch {r['start']['epoch']}, "
                                     "mid-epoch); vs the fresh start"))
            if not KEEP:
                shutil.rmtree(data)
        if "memory" in PARTS:
            out += memory_rows(kept, tmp)
        if "epoch" not in PARTS:
            return out
        # the epoch boundary, on a subset small enough to reach it
        if not (tmp / "subset-bin").exists():  # the memory part made it
            repeat_data_dir(kept / "base-bin", tmp / "subset-bin", SUBSET)
        e = run_train(tmp / "subset-bin", tmp / "ck-subset", ["--max-epoch", "2"])
        per_update = [1.0 / r["ups"] for r in e["train"] if r.get("ups")]
        boundary = next(i for i, r in enumerate(e["train"]) if r["epoch"] == 2)
        boundary_s = 1.0 / e["train"][boundary]["ups"]
        out.append(dict(bench="scale", case=f"{SUBSET:,}-pair subset, 2 epochs", metric="first update of epoch 2",
                        value=boundary_s, unit="s", ratio=boundary_s / statistics.median(per_update),
                        note=f"vs the median of {len(per_update)} updates; one process, nothing reloaded"))
    return out


if __name__ == "__main__":
    for row in rows():
        print(json.dumps(row))
