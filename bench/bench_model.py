"""Model cost: one attention layer against sequence length (the paper's Table 1, O(n^2 d) per
layer), and forward+backward time of the small and base presets on a fixed batch."""

from __future__ import annotations

import time

import torch

from xformer_cli.model.transformer import MultiHeadAttention, build_model
from xformer_cli.train.log import peak_memory_mib


def _time(fn, repeat: int) -> float:
    fn()  # warm-up
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - start) / repeat


def _peak_rss_mb() -> float:
    return peak_memory_mib(torch.device("cpu"))  # VmHWM: this process's own peak, not its parent's


def _attention_case(n: int, d: int, heads: int, batch: int, queue) -> None:
    """In a fresh process: latency and the peak-RSS growth of one attention layer."""
    torch.manual_seed(0)
    attn = MultiHeadAttention(d, heads, 0.0).eval()
    x = torch.randn(batch, n, d)
    before = _peak_rss_mb()
    with torch.no_grad():
        seconds = _time(lambda: attn(x), repeat=5 if n <= 256 else 2)
    queue.put((seconds, _peak_rss_mb() - before))


def attention_rows() -> list[dict]:
    import multiprocessing as mp

    rows = []
    d, heads, batch = 512, 8, 8
    base = None
    ctx = mp.get_context("fork")
    for n in (32, 64, 128, 256, 512, 1024):
        queue = ctx.Queue()
        proc = ctx.Process(target=_attention_case, args=(n, d, heads, batch, queue))
        proc.start()
        seconds, peak_mb = queue.get()
        proc.join()
        # Table 1 cost of self-attention: O(n^2 d) for the scores plus O(n d^2) for projections.
        flops = 2 * batch * (4 * n * d * d + 2 * n * n * d)
        base = base or seconds
        rows.append(dict(bench="attention", case=f"n={n} d={d} h={heads} B={batch}", metric="latency",
                         value=seconds * 1e3, unit="ms", ratio=seconds / base,
                         note=f"{flops / seconds / 1e9:.0f} GFLOP/s; ratio vs n=32"))
        rows.append(dict(bench="attention", case=f"n={n} d={d} h={heads} B={batch}", metric="peak memory growth",
                         value=peak_mb, unit="MiB",
                         note=f"B*h*n^2 fp32 scores = {batch * heads * n * n * 4 / 2**20:.1f} MiB"))
    return rows


def train_step_rows() -> list[dict]:
    rows = []
    for arch, batch, length in (("small", 32, 32), ("base", 16, 32)):
        torch.manual_seed(0)
        model = build_model(arch, vocab_size=8000).train()
        src = torch.randint(4, 8000, (batch, length))
        tgt = torch.randint(4, 8000, (batch, length))

        def step():
            loss = model(src, tgt).float().logsumexp(-1).mean()
            loss.backward()

        seconds = _time(step, repeat=3)
        rows.append(dict(bench="model", case=f"{arch} fwd+bwd B={batch} T={length} V=8000", metric="step time",
                         value=seconds * 1e3, unit="ms", note=f"{batch * length / seconds:,.0f} target tok/s"))
    return rows


def rows() -> list[dict]:
    return attention_rows() + train_step_rows()
