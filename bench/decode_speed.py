"""Beam-4 decoding speed of a `base` model on WMT-like sources (bench/gpu.sh; not part of make bench,
whose translate bench runs the whole xf translate pipeline on Multi30k).

A randomly initialised `base` model (vocabulary 37000) decodes synthetic sources with WMT-like
lengths (mean 27 subwords, bench_train.wmt_like_lengths) through xf's own search call
(``search.search`` with xf translate's defaults: beam 4, GNMT length penalty 0.6), batches of
XF_BENCH_DECODE_BATCH (128) sentences, longest first, as xf translate makes them. A random model never
chooses eos, so outputs are capped at the source length (max_len_a 1, max_len_b 0): about the
length of real translations. Sentences/s on the device in fp32 and bf16, and on the CPU in fp32
on a subset, measured in the same run (the ratio is device over CPU).

Environment: XF_BENCH_DECODE_SENTENCES (2000), XF_BENCH_DECODE_CPU_SENTENCES (100),
XF_BENCH_DRY_RUN=1 (tiny model, vocabulary 1000, 40 sentences, CPU only).
``python bench/decode_speed.py OUT.json`` writes the rows to OUT.json after every measurement.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_train import cpu_flags, wmt_like_lengths  # noqa: E402

from xformer_cli.batching import batch_by_size, collate_source  # noqa: E402
from xformer_cli.model import build_model  # noqa: E402
from xformer_cli.options import DecodingOptions  # noqa: E402
from xformer_cli.search import search  # noqa: E402

DRY = os.environ.get("XF_BENCH_DRY_RUN") == "1"
ARCH, VOCAB = ("tiny", 1000) if DRY else ("base", 37000)
SENTENCES = int(os.environ.get("XF_BENCH_DECODE_SENTENCES", "40" if DRY else "2000"))
CPU_SENTENCES = int(os.environ.get("XF_BENCH_DECODE_CPU_SENTENCES", "20" if DRY else "100"))
BATCH = int(os.environ.get("XF_BENCH_DECODE_BATCH", "128"))


def sources(n: int) -> list[list[int]]:
    rng = np.random.default_rng(1)
    lengths, _ = wmt_like_lengths(n, rng)
    return [rng.integers(4, VOCAB, int(k)).tolist() for k in lengths]


def sentences_per_second(model, sents: list[list[int]], device: torch.device) -> tuple[float, int]:
    options = DecodingOptions(beam_size=4, max_len_a=1.0, max_len_b=0)  # xf translate's defaults, capped
    # as xf translate batches: longest first, by source length
    batches = batch_by_size([len(s) for s in sents], max_sentences=BATCH, longest_first=True)
    # warm-up: one batch (kernels, allocator)
    search([model], collate_source([sents[i] for i in batches[0]]).to(device), options)
    if device.type == "cuda":
        torch.cuda.synchronize()
    start, out_tokens = time.perf_counter(), 0
    for batch in batches:
        hyps = search([model], collate_source([sents[i] for i in batch]).to(device), options)
        out_tokens += sum(len(h[0].tokens) for h in hyps)  # host lists: synchronized
    return len(sents) / (time.perf_counter() - start), out_tokens


def main(argv: list[str]) -> None:
    path = Path(argv[0]) if argv else None
    rows: list[dict] = []

    def emit(row):
        rows.append(row)
        print(json.dumps(row), flush=True)
        if path:
            path.write_text(json.dumps({"cpu_flags": cpu_flags(), "torch": torch.__version__, "rows": rows}, indent=1))

    torch.manual_seed(0)
    model = build_model(ARCH, vocab_size=VOCAB).eval()
    sents = sources(SENTENCES)
    cpu_speed, _ = sentences_per_second(model, sents[:CPU_SENTENCES], torch.device("cpu"))
    case = f"{ARCH} random, beam 4, batch {BATCH}, WMT-like sources"
    emit(dict(bench="decode", case=f"{case}, cpu fp32", metric="sentences/s", value=cpu_speed, unit="sent/s",
              note=f"{CPU_SENTENCES} sentences, {torch.get_num_threads()} threads; {cpu_flags()}"))
    if torch.cuda.is_available():
        for dtype in (torch.float32, torch.bfloat16):
            cuda_model = build_model(ARCH, vocab_size=VOCAB)
            cuda_model.load_state_dict(model.state_dict())
            cuda_model = cuda_model.to(device="cuda", dtype=dtype).eval()
            speed, tokens = sentences_per_second(cuda_model, sents, torch.device("cuda"))
            emit(dict(bench="decode", case=f"{case}, cuda {str(dtype).split('.')[-1]}", metric="sentences/s",
                      value=speed, unit="sent/s", ratio=speed / cpu_speed,
                      note=f"{SENTENCES} sentences, {tokens:,} output tokens; vs cpu fp32 of this run"))


if __name__ == "__main__":
    main(sys.argv[1:])
