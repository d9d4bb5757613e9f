"""Training throughput: the small preset (3+3 layers, d_model 256) on Multi30k EN-DE with
--max-tokens 4096, in fp32 and bf16 on CPU (and CUDA where present).

Each configuration runs ``xf train`` in its own process (so peak memory is its own) for
XF_BENCH_TRAIN_UPDATES updates, or until XF_BENCH_TRAIN_SECONDS have passed, when it is stopped
with SIGTERM and reports what it did (xf train's graceful stop). XF_BENCH_TRAIN_PRECISIONS picks
the precisions (default fp32,bf16). Speeds exclude start-up (the
first update) and validation: they are xf train's own summary. MFU divides the model FLOPs of
the tokens trained (forward + backward, counted by torch's FlopCounterMode on real batches) by a
matrix-multiply peak measured in this run, in the same dtype and with the same threads.

Reference (issue 4): fairseq trained this shape in fp32 at about 2,400 target tokens/s on a
2-core CPU of this class; xf should match it in fp32 and reach 1.5x that in bf16.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
MULTI30K = Path(os.environ.get("MULTI30K_DIR", REPO / ".." / "shared" / "data" / "multi30k")).resolve()
UPDATES = int(os.environ.get("XF_BENCH_TRAIN_UPDATES", "60"))
SECONDS = float(os.environ.get("XF_BENCH_TRAIN_SECONDS", "600"))
PRECISIONS = os.environ.get("XF_BENCH_TRAIN_PRECISIONS", "fp32,bf16").split(",")
ARCH, MAX_TOKENS = "small", 4096
FAIRSEQ_FP32_TGT_TOK_S = 2400.0  # issue 4's reference


def prepare_data(root: Path) -> Path:
    from xformer_cli.options import PreprocessOptions
    from xformer_cli.preprocess import preprocess

    dest = root / "m30k-ende"
    preprocess(PreprocessOptions(destdir=str(dest), source_lang="en", target_lang="de",
                                 trainpref=str(MULTI30K / "train"), validpref=str(MULTI30K / "val"),
                                 bpe_vocab_size=8000))
    return dest


def matmul_peak(dtype: torch.dtype, device: torch.device, n: int = 2048) -> float:
    """FLOP/s of the best of a few n x n x n products through F.linear, the op the model's
    layers use (on CPUs without bf16 instructions, a bare bf16 ``a @ b`` takes a far slower
    path than F.linear does, which would make the peak meaningless)."""
    x = torch.randn(n, n, device=device).to(dtype)
    w = torch.randn(n, n, device=device).to(dtype)
    best = float("inf")
    for _ in range(4):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        torch.nn.functional.linear(x, w)
        if device.type == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


def flops_per_target_token(data: Path, batches: int = 4) -> float:
    """Forward+backward model FLOPs per target token, counted on real training batches."""
    from torch.utils.flop_counter import FlopCounterMode

    from xformer_cli.data import DataDir, batch_by_size, collate
    from xformer_cli.loss import label_smoothed_loss
    from xformer_cli.model import build_model

    dd = DataDir.open(data)
    ds = dd.split("train")
    all_batches = batch_by_size(ds.src_sizes, ds.tgt_sizes, MAX_TOKENS)
    model = build_model(ARCH, dd.vocab_size)
    flops = tokens = 0
    step = max(1, len(all_batches) // batches)
    for idx in all_batches[::step][:batches]:
        batch = collate([ds[i] for i in idx])
        with FlopCounterMode(display=False) as counter:
            loss, _ = label_smoothed_loss(model(batch["src"], batch["prev_output"]), batch["target"], 0.1)
            loss.backward()
        flops += counter.get_total_flops()
        tokens += batch["ntokens"]
        model.zero_grad(set_to_none=True)
    return flops / tokens


def run_train(data: Path, save_dir: Path, precision: str, device: str) -> dict:
    """xf train in a child process; its summary record from train_log.jsonl."""
    args = [sys.executable, "-m", "xformer_cli", "train", str(data), "--arch", ARCH, "--save-dir", str(save_dir),
            "--max-tokens", str(MAX_TOKENS), "--max-update", str(UPDATES), "--precision", precision,
            "--device", device, "--log-interval", "10", "--save-interval-minutes", "0"]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        proc.wait(timeout=SECONDS)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)  # xf train finishes the update and writes its summary
        proc.wait()
    summaries = [json.loads(line) for line in (save_dir / "train_log.jsonl").read_text().splitlines()
                 if '"type": "summary"' in line]
    if not summaries:
        raise RuntimeError(f"xf train {precision} on {device} wrote no summary (exit {proc.returncode})")
    return summaries[-1]


def rows() -> list[dict]:
    out = []
    threads = torch.get_num_threads()
    with tempfile.TemporaryDirectory() as tmp:
        data = prepare_data(Path(tmp))
        per_token = flops_per_target_token(data)
        devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
        configs = [(device, precision) for device in devices for precision in PRECISIONS]
        fp32_speed = {}
        for device, precision in configs:
            dtype = torch.float32 if precision == "fp32" else torch.bfloat16
            peak = matmul_peak(dtype, torch.device(device))
            s = run_train(data, Path(tmp) / f"ck-{device}-{precision}", precision, device)
            case = f"{ARCH} m30k en-de max_tokens {MAX_TOKENS} {device} {precision}"
            tgt = s["tgt_tok_s"] or 0.0
            if precision == "fp32":
                fp32_speed[device] = tgt
                ratio, note = tgt / FAIRSEQ_FP32_TGT_TOK_S, "ratio vs fairseq's ~2,400 (issue 4)"
            else:
                ratio, note = (tgt / fp32_speed[device] if fp32_speed.get(device) else None), "ratio vs fp32 of this run"
            timed = f"{s['num_updates']} updates ({s['stop_reason']})"
            out += [
                dict(bench="train", case=case, metric="target tokens/s", value=tgt, unit="tok/s", ratio=ratio,
                     note=f"{note}; {timed}"),
                dict(bench="train", case=case, metric="source tokens/s", value=s["src_tok_s"] or 0.0, unit="tok/s"),
                dict(bench="train", case=case, metric="updates/s", value=s["ups"] or 0.0, unit="upd/s"),
                dict(bench="train", case=case, metric="peak memory", value=s["peak_memory_mib"], unit="MiB",
                     note="CUDA allocated" if device == "cuda" else "process RSS"),
                dict(bench="train", case=case, metric="MFU", value=100 * tgt * per_token / peak, unit="%",
                     note=f"{per_token / 1e6:.1f} MFLOP/target token; {precision} matmul peak "
                          f"{peak / 1e9:.0f} GFLOP/s measured here ({threads} threads)"),
            ]
    return out


if __name__ == "__main__":
    for row in rows():
        print(row)
