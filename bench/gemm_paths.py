"""Which library multiplies each of a decoder step's matrices on this CPU, and how fast: one command.

    python bench/gemm_paths.py [--rows 256] [--d-model 256] [--ffn 1024] [--vocab 8000] [--threads 1]
                               [--rounds 5] [--json OUT]

A beam step of a `small` model multiplies (rows = beam x sentences) x d_model activations by its
linear layers' weights. torch runs an fp32 linear through MKL's SGEMM (a CPU build links MKL),
bf16 through oneDNN, int8 through fbgemm or oneDNN (torch.ao's engines) and ``torch._int_mm``
through oneDNN. MKL picks its kernels by the CPU's vendor as well as its flags (its banner, which
``MKL_VERBOSE`` prints, names the path it took), so on a CPU that is not Intel's its fp32 products
can run far below what the same instructions give under oneDNN, which picks by flags alone. The
table: each library's GFLOP/s on each layer's shape, one after another in this process, best of
--rounds, with the MKL banner and the CPU flags above it: the number that says whether xf's fp32
(and the fp32 products around int8: attention) lose to the library on this CPU rather than to xf.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

BANNER_PROBE = "import torch; torch.nn.functional.linear(torch.ones(64, 64), torch.ones(64, 64))"


def mkl_banner() -> str:
    """MKL's own description of the code path it chose here (the first MKL_VERBOSE line)."""
    proc = subprocess.run([sys.executable, "-c", BANNER_PROBE], env={**os.environ, "MKL_VERBOSE": "1"},
                          capture_output=True, text=True, timeout=120)
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.startswith("MKL_VERBOSE") and
             "GEMM" not in line]
    return lines[0].removeprefix("MKL_VERBOSE ").strip() if lines else "no MKL_VERBOSE output (no MKL in this torch?)"


def shapes(d_model: int, ffn: int, vocab: int) -> dict[str, tuple[int, int]]:
    """A step's linear layers: name -> (in, out)."""
    return {"self-attention q/k/v": (d_model, 3 * d_model), "attention output": (d_model, d_model),
            "feed-forward in": (d_model, ffn), "feed-forward out": (ffn, d_model), "output projection": (d_model, vocab)}


def paths(x, weight):
    """name -> a call computing x @ weight.T by that library (None where this torch lacks it)."""
    import torch
    import torch.nn.functional as F

    from xformer_cli.model.quantization import Int8MatmulLinear, quantize_int8

    out = {"fp32, MKL (F.linear)": lambda: F.linear(x, weight)}
    if hasattr(torch.ops.mkldnn, "_linear_pointwise"):
        out["fp32, oneDNN (mkldnn._linear_pointwise)"] = lambda: torch.ops.mkldnn._linear_pointwise(
            x, weight, None, "none", [], "")
    xb, wb = x.bfloat16(), weight.bfloat16()
    out["bf16, oneDNN (F.linear)"] = lambda: F.linear(xb, wb)
    for engine in ("fbgemm", "onednn"):
        layer = torch.nn.Sequential(torch.nn.Linear(weight.size(1), weight.size(0), bias=False))
        layer[0].weight.data.copy_(weight)
        try:
            quantize_int8(layer, engine)
        except RuntimeError:  # an engine this torch lacks
            continue
        out[f"int8, torch.ao {engine}"] = lambda layer=layer: layer(x)
    linear = torch.nn.Linear(weight.size(1), weight.size(0), bias=False)
    linear.weight.data.copy_(weight)
    matmul = Int8MatmulLinear(linear)
    out["int8, torch._int_mm (oneDNN; --compile's)"] = lambda: matmul(x)
    return out


def measure(args) -> list[dict]:
    import torch

    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    rows = []
    for name, (d_in, d_out) in shapes(args.d_model, args.ffn, args.vocab).items():
        x, weight = torch.randn(args.rows, d_in), torch.randn(d_out, d_in) / d_in ** 0.5
        flops = 2 * args.rows * d_in * d_out
        with torch.inference_mode():
            calls = paths(x, weight)
            best = {path: float("inf") for path in calls}
            for _ in range(args.rounds):
                for path, call in calls.items():  # interleaved: a busy moment slows every path alike
                    call()
                    start, n = time.perf_counter(), 0
                    while n < 3 or time.perf_counter() - start < 0.05:
                        call()
                        n += 1
                    best[path] = min(best[path], (time.perf_counter() - start) / n)
        for path, seconds in best.items():
            rows.append(dict(layer=name, shape=f"{args.rows}x{d_in} @ {d_in}x{d_out}", path=path,
                             microseconds=1e6 * seconds, gflops=flops / seconds / 1e9))
    return rows


def table(rows: list[dict]) -> str:
    order = list(dict.fromkeys(r["path"] for r in rows))
    layers = list(dict.fromkeys(r["layer"] for r in rows))
    cell = {(r["layer"], r["path"]): r["gflops"] for r in rows}
    out = ["| layer (GFLOP/s) | " + " | ".join(order) + " |", "|---|" + "---|" * len(order)]
    for layer in layers:
        out.append(f"| {layer} | " + " | ".join(f"{cell[(layer, p)]:.1f}" if (layer, p) in cell else "" for p in order)
                   + " |")
    return "\n".join(out)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=256, help="beam x sentences (64 sentences of beam 4)")
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--ffn", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=8000)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    import torch

    from xformer_cli.base.precision import cpu_flags, cpu_vendor

    flags = " ".join(f for f in sorted(cpu_flags()) if f.startswith(("avx", "amx", "fma")))
    header = dict(cpu_vendor=cpu_vendor(), cpu_flags=flags, torch=torch.__version__, threads=args.threads,
                  mkl=mkl_banner())
    rows = measure(args)
    print(f"{header['cpu_vendor']}; flags: {flags}; torch {header['torch']}; {args.threads} thread(s)")
    print(f"MKL: {header['mkl']}\n")
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(dict(header, rows=rows), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
