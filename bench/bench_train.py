"""Training throughput of xf's update against a plain PyTorch reference of the same shape,
measured in the same run, with MFU against the GPU's datasheet peak (a measured matmul peak beside it).

Default (``make bench``): the small preset (3+3 layers, d_model 256) on Multi30k EN-DE (joint
BPE 8000) with --max-tokens 4096 on the CPU, fp32, and bf16 where the CPU has native bf16 matrix
instructions (elsewhere a row says why it was not run). On a GPU, and from ``bench/gpu.sh``:
``base``/``big`` at --max-tokens 25000 on a WMT-like corpus (below).

Each run is a process of its own (its peak memory is its own), set up by xf train's set-up
(``train.setup.set_up``: data, batches, model, optimizer, autocast; nothing is written: no
checkpoint, no log) and fed by xf train's ``Prefetch`` (on CUDA the next update is collated in a
background thread and pinned). xf runs ``train_step``, the update of xf train; the reference is
``torch.nn.Transformer`` (batch_first, the same width, depth, heads, FFN, dropout and post-/pre-LN)
with scaled tied embeddings plus sinusoidal positions, fed by the same Prefetch with the same
batches in the same order, with fused AdamW, the same learning-rate schedule, gradients normalized
by the update's target tokens and the label-smoothed loss written the plain way
(``F.cross_entropy(..., label_smoothing=0.1)`` on full logits). Compiled runs compile both the same
way (``compiling.compile_forward``: dynamic shapes, inputs marked dynamic).

Timing, the same for both: update 1 (allocation, compilation) is timed alone; then the timed
window is the updates that follow, with the device synchronised at its two ends only, so the
device's catch-up is inside the window and nothing in it waits for the device. A run ends after
XF_BENCH_TRAIN_UPDATES updates, when its time is up, or at SIGTERM (bench/gpu.sh's stage timeout),
and each row says which. MFU divides the model FLOPs of every pair in the timed window, counted
from its own lengths without padding (``flops.training_flops``: 6 N tokens plus attention), by the
window's seconds and by the GPU's datasheet dense peak where ``gpu_peaks`` knows it (H100 SXM,
H200: 989 TFLOP/s bf16), else by a matmul peak measured in this run through F.linear, in the run's
dtype, device and threads; the measured peak is a row of its own either way. Compiled rows give the graphs made and those made during the timed window
(recompilations: 0 when one graph serves every shape). Rows are written the moment they are
measured: xf's before the reference starts.

Environment (all optional):
  XF_BENCH_TRAIN_ARCH (small), XF_BENCH_TRAIN_MAX_TOKENS (4096),
  XF_BENCH_TRAIN_DATA: multi30k | wmt-like (multi30k; wmt-like: synthetic ids, vocabulary 37000,
    lengths log-normal with a mean of 27 subwords as WMT14 EN-DE with a 37k joint BPE),
  XF_BENCH_TRAIN_PAIRS (wmt-like corpus size, 100000), XF_BENCH_TRAIN_DATA_DIR (keep the data
  there for the next run; default: a temporary directory), XF_BENCH_TRAIN_DEVICES (cpu, plus cuda
  when present), XF_BENCH_TRAIN_PRECISIONS (fp32 and bf16 on CPU; bf16 on CUDA),
  XF_BENCH_TRAIN_COMPILE (0; "0,1" adds compiled runs), XF_BENCH_COMPILE_BACKEND (inductor;
  the dry run: aot_eager), XF_BENCH_TRAIN_REFERENCE (1; 0: xf alone), XF_BENCH_TRAIN_ENGINES
  (xf,reference; "reference": the reference alone), XF_BENCH_TRAIN_ROUNDS (2),
  XF_BENCH_TRAIN_UPDATES (40, the first included), XF_BENCH_TRAIN_SECONDS (600: the most a timed
  window lasts), XF_BENCH_DEADLINE (a Unix time by which every run has ended: bench/gpu.sh's
  stage end; each run gets its share of what is left, is sent SIGTERM at its end and killed 8 s
  later), XF_BENCH_DRY_RUN=1: tiny model of one layer a side, tiny wmt-like corpus, 4 updates, CPU
  (proves it runs).
``python bench/bench_train.py OUT.json`` writes the rows to OUT.json after every measurement.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from gpu_peaks import mfu_peak  # bench/ is on sys.path: the benchmarks import each other

REPO = Path(__file__).resolve().parents[1]
MULTI30K = Path(os.environ.get("MULTI30K_DIR", REPO / ".." / "shared" / "data" / "multi30k")).resolve()
DRY = os.environ.get("XF_BENCH_DRY_RUN") == "1"
ENV = os.environ.get
ARCH = ENV("XF_BENCH_TRAIN_ARCH", "tiny" if DRY else "small")
MAX_TOKENS = int(ENV("XF_BENCH_TRAIN_MAX_TOKENS", "600" if DRY else "4096"))
DATA = ENV("XF_BENCH_TRAIN_DATA", "wmt-like" if DRY else "multi30k")
PAIRS = int(ENV("XF_BENCH_TRAIN_PAIRS", "3000" if DRY else "100000"))
VOCAB = 1000 if DRY else 37000  # wmt-like: the paper's EN-DE joint BPE vocabulary
UPDATES = int(ENV("XF_BENCH_TRAIN_UPDATES", "4" if DRY else "40"))
SECONDS = float(ENV("XF_BENCH_TRAIN_SECONDS", "600"))
DEADLINE = float(ENV("XF_BENCH_DEADLINE", "inf"))
ROUNDS = int(ENV("XF_BENCH_TRAIN_ROUNDS", "1" if DRY else "2"))
REFERENCE = ENV("XF_BENCH_TRAIN_REFERENCE", "1") == "1"
ENGINES = ENV("XF_BENCH_TRAIN_ENGINES", "xf,reference" if REFERENCE else "xf").split(",")
COMPILE = [c == "1" for c in ENV("XF_BENCH_TRAIN_COMPILE", "0").split(",")]
BACKEND = ENV("XF_BENCH_COMPILE_BACKEND", "aot_eager" if DRY else "inductor")
LABEL_SMOOTHING, SEED = 0.1, 1
# the dry run: one layer a side (dynamo's tracing time grows with the layers)
LAYERS = dict(encoder_layers=1, decoder_layers=1) if DRY else {}
GRACE = 8.0  # seconds between a run's SIGTERM and its kill


# -- data ------------------------------------------------------------------------------------------
def multi30k_data(root: Path) -> Path:
    from xf_command import xf

    dest = root / "m30k-ende"
    if (dest / "meta.json").exists():
        return dest
    xf("preprocess", "--destdir", dest, "--source-lang", "en", "--target-lang", "de", "--trainpref", MULTI30K / "train",
       "--validpref", MULTI30K / "val", "--bpe-vocab-size", 8000)
    return dest


def wmt_like_lengths(pairs: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Source and target subword counts: log-normal, mean 27 (WMT14 EN-DE with a 37k joint BPE
    averages 26-28 per side), target/source ratio log-normal around 1, clipped to 1..250 and to
    xf preprocess's default ratio filter of 1.5."""
    sigma = 0.55
    src = np.clip(np.rint(rng.lognormal(math.log(27) - sigma**2 / 2, sigma, pairs)), 1, 250)
    tgt = np.clip(np.rint(src * rng.lognormal(0.0, 0.12, pairs)), 1, 250)
    tgt = np.clip(tgt, np.ceil(src / 1.5), np.floor(src * 1.5))
    return src.astype(np.int32), np.maximum(tgt, 1).astype(np.int32)


def wmt_like_data(root: Path, pairs: int = PAIRS, vocab: int = VOCAB) -> Path:
    """A data directory in xf's format with synthetic token ids (uniform over the vocabulary) and
    WMT-like lengths: speed depends on shapes, not on which ids they hold. Needs no text at all
    (a GPU machine may have only the repository); its spm.model is a placeholder word model of
    the vocabulary's size that only names the vocabulary in checkpoints."""
    import io

    import sentencepiece as spm

    from xformer_cli.data.dataset import FORMAT_VERSION, TokenArrayWriter, smallest_dtype
    from xformer_cli.text.vocab import BOS_ID, EOS_ID, PAD_ID, UNK_ID

    dest = root / f"wmt-like-{pairs}-{vocab}"
    if (dest / "meta.json").exists():  # XF_BENCH_TRAIN_DATA_DIR: made by an earlier stage of bench/gpu.sh
        return dest
    dest.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(SEED)
    dtype = smallest_dtype(vocab)
    for split, n in (("train", pairs), ("valid", 200)):
        src_len, tgt_len = wmt_like_lengths(n, rng)
        for lang, sizes in (("en", src_len), ("de", tgt_len)):
            writer = TokenArrayWriter(dest / f"{split}.{lang}", dtype)
            for start in range(0, n, 1 << 18):
                part = sizes[start : start + (1 << 18)]
                writer.add_flat(rng.integers(4, vocab, int(part.sum())), part)
            writer.close()
    # a word model with exactly `vocab` pieces, so that meta.json's vocab_size agrees with it (xf
    # checks that when a data directory is opened); trained in well under a second at 37,000
    words = [f"w{i:x}" for i in range(vocab)]
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(" ".join(words[i:i + 50]) for i in range(0, vocab, 50)),
                                   model_writer=model, vocab_size=vocab, model_type="word", pad_id=PAD_ID,
                                   unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID, minloglevel=2)
    (dest / "spm.model").write_bytes(model.getvalue())
    meta = dict(format_version=FORMAT_VERSION, source_lang="en", target_lang="de", vocab_size=vocab,
                dtype=dtype.name, splits=["train", "valid"], synthetic="bench/bench_train.py wmt_like_data")
    (dest / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    return dest


# -- measuring -------------------------------------------------------------------------------------
def matmul_peak(dtype: torch.dtype, device: torch.device) -> float:
    """FLOP/s of the best of a few n x n x n products through F.linear, the op the model's layers
    use (on CPUs without bf16 instructions a bare bf16 ``a @ b`` takes a far slower path than
    F.linear does, which would make the peak meaningless). GPUs need larger products to peak.
    Random operands (zeros run faster on some GPUs)."""
    n, reps = (8192, 20) if device.type == "cuda" else (512, 2) if DRY else (2048, 1)
    x = torch.randn(n, n, device=device).to(dtype)
    w = torch.randn(n, n, device=device).to(dtype)
    torch.nn.functional.linear(x, w)  # warm-up: the library's handles and kernels
    best = float("inf")
    for _ in range(5):
        sync(device)
        start = time.perf_counter()
        for _ in range(reps):
            torch.nn.functional.linear(x, w)
        sync(device)
        best = min(best, (time.perf_counter() - start) / reps)
    return 2 * n**3 / best


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def write_json(path: Path, value) -> None:
    """Whole or not at all: the parent may read it at any moment."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(value, indent=1))
    tmp.replace(path)


# -- one run, in a process of its own ---------------------------------------------------------------
def reference_model(cfg):
    """torch.nn.Transformer of xf's shape, with scaled tied embeddings and sinusoidal positions."""
    import torch.nn.functional as F
    from torch import nn

    from xformer_cli.model.transformer import sinusoidal_positions
    from xformer_cli.text.vocab import PAD_ID

    class Reference(nn.Module):
        def __init__(self):
            super().__init__()
            d = cfg.d_model
            self.embed = nn.Embedding(cfg.vocab_size, d, padding_idx=PAD_ID)
            nn.init.normal_(self.embed.weight, std=d**-0.5)
            self.register_buffer("pos", sinusoidal_positions(cfg.max_positions, d), persistent=False)
            self.drop = nn.Dropout(cfg.dropout)
            # nn.Transformer always closes both stacks with a LayerNorm (xf: only with pre-LN).
            self.transformer = nn.Transformer(d, cfg.heads, cfg.encoder_layers, cfg.decoder_layers, cfg.d_ff,
                                              cfg.dropout, batch_first=True, norm_first=cfg.normalize_before)

        def forward(self, src, prev):
            scale = cfg.d_model**0.5
            x = self.drop(self.embed(src) * scale + self.pos[: src.size(1)])
            y = self.drop(self.embed(prev) * scale + self.pos[: prev.size(1)])
            causal = nn.Transformer.generate_square_subsequent_mask(prev.size(1), device=prev.device)
            pad = src.eq(PAD_ID)
            h = self.transformer(x, y, tgt_mask=causal, src_key_padding_mask=pad, memory_key_padding_mask=pad,
                                 tgt_is_causal=True)
            return F.linear(h, self.embed.weight)  # tied output projection

    return Reference()


def one_run(engine: str, data: str, save_dir: str, out: str, device: str, precision: str, compiled: bool,
            deadline: float) -> None:
    """Set up, update 1 alone, then the timed window; writes the result to ``out`` after update 1
    (so that a run killed later still tells its compile time) and at the end."""
    import torch.nn.functional as F

    from xformer_cli.base import compiling, distributed
    from xformer_cli.data.batching import Prefetch
    from xformer_cli.model.flops import training_flops
    from xformer_cli.settings.options import TrainOptions, model_config
    from xformer_cli.base.safety import SaveDirLock
    from xformer_cli.train.log import peak_memory_mib
    from xformer_cli.base.compiling import compile_forward, compiled_graphs
    from xformer_cli.train.setup import set_up
    from xformer_cli.train.update import train_step
    from xformer_cli.text.vocab import PAD_ID

    stop = []  # SIGTERM (the deadline): finish the update, report what was done
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    compiling.COMPILE_BACKEND = BACKEND
    xf = engine == "xf"
    # The reference's set-up builds only the data, the batches and the autocast of xf train; the
    # xf model it also builds is made negligible (d_model 8, one layer) so as not to count in the
    # reference's memory.
    shrink = LAYERS if xf else dict(d_model=8, d_ff=8, heads=1, encoder_layers=1, decoder_layers=1)
    o = TrainOptions(data=data, save_dir=save_dir, arch=ARCH, max_tokens=MAX_TOKENS, precision=precision,
                     device=device, seed=SEED, label_smoothing=LABEL_SMOOTHING, compile=compiled and xf, **shrink)
    env = distributed.setup(device)
    dev = env.device
    with SaveDirLock(save_dir) as lock:
        run = set_up(o, env, lock)
    cfg = run.cfg if xf else model_config(ARCH, vocab_size=run.data.vocab_size, **LAYERS)
    if xf:
        def step(micro, lr, ntokens):
            return train_step(run.model, run.forward, run.state.optimizer, run.state.scaler, micro, grad_scale=1.0 / ntokens,
                              lr=lr, autocast=run.autocast, label_smoothing=o.label_smoothing,
                              clip_norm=o.clip_norm).loss_sums[0]
    else:
        torch.manual_seed(SEED)
        model = reference_model(cfg).to(dev).train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.0, betas=(0.9, 0.98), eps=1e-9, weight_decay=0.0,
                                      fused=True)
        forward = compile_forward(model) if compiled else model
        scaler = run.state.scaler

        def step(micro, lr, ntokens):
            for group in optimizer.param_groups:
                group["lr"] = lr
            total = 0.0
            for batch in micro:
                with run.autocast:
                    logits = forward(batch["src"].to(dev, non_blocking=True),
                                     batch["prev_output"].to(dev, non_blocking=True))
                    loss = F.cross_entropy(logits.view(-1, logits.size(-1)),
                                           batch["target"].to(dev, non_blocking=True).view(-1),
                                           ignore_index=PAD_ID, label_smoothing=LABEL_SMOOTHING, reduction="sum")
                scaler.scale(loss / ntokens).backward()
                total = total + loss.detach()
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            return total

    prefetch = Prefetch(run.batches, background=dev.type == "cuda")  # as xf train's loop makes it
    position = (1, 0)  # epoch, batch offset

    def next_update() -> list[dict]:
        nonlocal position
        micro = prefetch.take(*position)
        position = run.batches.next_update(*position)
        return micro

    def lr(n: int) -> float:  # xf train's schedule (of d_model, which the reference shares)
        return run.learning_rate(n) if xf else make_lr(n)

    if not xf:
        from xformer_cli.train.schedule import make_schedule

        make_lr = make_schedule(o.lr_scheduler, cfg.d_model, o.warmup_updates,
                                o.lr_factor if o.lr_scheduler == "noam" else o.lr, o.warmup_init_lr)

    result = dict(engine=engine, device=device, precision=precision, compiled=compiled, arch=ARCH,
                  parameters=sum(p.numel() for p in (run.model if xf else model).parameters()))
    sync(dev)
    start = time.perf_counter()
    micro = next_update()
    step(micro, lr(1), sum(b["ntokens"] for b in micro))
    sync(dev)
    result.update(first_update_seconds=round(time.perf_counter() - start, 3), graphs_after_first=compiled_graphs(),
                  ended="killed in the timed updates, after update 1")
    write_json(Path(out), result)

    # the timed window: synchronised at its two ends only
    window = max(0.0, min(SECONDS, deadline - time.time() - 2.0))
    updates = tgt = src = 0
    flops = 0.0
    loss = None
    sync(dev)
    start = time.perf_counter()
    while True:
        if updates >= UPDATES - 1:
            ended = f"all {UPDATES} updates"
            break
        if stop:
            ended = "stopped by SIGTERM (the time limit)"
            break
        if time.perf_counter() - start >= window:
            ended = f"stopped by time ({window:.0f} s window)"
            break
        micro = next_update()
        ntokens = sum(b["ntokens"] for b in micro)
        for b in micro:  # the pairs' own lengths, on the host: no padding counted
            flops += training_flops(cfg, b["src"].ne(PAD_ID).sum(1).numpy(), b["target"].ne(PAD_ID).sum(1).numpy())
        loss = step(micro, lr(updates + 2), ntokens)
        updates, tgt, src = updates + 1, tgt + ntokens, src + sum(b["src_tokens"] for b in micro)
    sync(dev)
    seconds = time.perf_counter() - start
    prefetch.close()
    result.update(ended=ended, updates_timed=updates, seconds=round(seconds, 4), tgt_tokens=tgt, src_tokens=src,
                  flops=flops, tgt_tok_s=tgt / seconds if updates else None,
                  src_tok_s=src / seconds if updates else None, ups=updates / seconds if updates else None,
                  graphs=compiled_graphs(), peak_memory_mib=round(peak_memory_mib(dev), 1),
                  finite=bool(torch.isfinite(loss).item()) if loss is not None else None)
    write_json(Path(out), result)


def run_child(engine: str, data: Path, tmp: Path, tag: str, device: str, precision: str, compiled: bool,
              deadline: float) -> dict:
    """One run in a child process, sent SIGTERM at ``deadline`` and killed GRACE seconds later;
    its result, or a result saying how it ended without one."""
    out, log = tmp / f"{engine}-{tag}.json", tmp / f"{engine}-{tag}.log"
    spec = dict(engine=engine, data=str(data), save_dir=str(tmp / f"{engine}-{tag}"), out=str(out), device=device,
                precision=precision, compiled=compiled, deadline=deadline)
    began = time.time()
    with open(log, "w") as err:
        proc = subprocess.Popen([sys.executable, __file__, "--run", json.dumps(spec)], stdout=subprocess.DEVNULL,
                                stderr=err, cwd=REPO)
        try:
            code = proc.wait(timeout=max(1.0, deadline - time.time()) if math.isfinite(deadline) else None)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGTERM)
            try:
                code = proc.wait(timeout=GRACE)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = proc.wait()
    result = json.loads(out.read_text()) if out.exists() else dict(engine=engine, ended="killed before update 1 ended")
    if code != 0 and "updates_timed" not in result:
        tail = log.read_text()[-1500:].strip().splitlines()
        result["ended"] = (f"{result['ended']} (exit {code}, after {time.time() - began:.0f} s)"
                           + (f": {tail[-1]}" if tail else ""))
        result["log_tail"] = "\n".join(tail[-20:])
    return result


# -- the benchmark ---------------------------------------------------------------------------------
def cpu_flags() -> str:
    try:
        flags = set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return "unknown"
    return " ".join(sorted(flags & {"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"})) or "none of avx2/avx512"


def measure(emit) -> None:
    """Calls ``emit(row)`` for every row as soon as it is measured."""
    from xformer_cli.base.precision import cpu_bf16_instructions

    devices = ENV("XF_BENCH_TRAIN_DEVICES", "cpu" if DRY else ",".join(["cpu"] + ["cuda"] * torch.cuda.is_available()))
    keep = ENV("XF_BENCH_TRAIN_DATA_DIR")
    with tempfile.TemporaryDirectory(prefix="xf-bench-train-") as tmp:
        tmp = Path(tmp)
        root = Path(keep) if keep else tmp
        data = wmt_like_data(root) if DATA == "wmt-like" else multi30k_data(root)
        data_name = f"wmt-like {PAIRS:,} pairs" if DATA == "wmt-like" else "m30k en-de"
        for device in devices.split(","):
            dev = torch.device(device)
            default = "bf16" if device == "cuda" else "fp32,bf16"
            for precision in ENV("XF_BENCH_TRAIN_PRECISIONS", default).split(","):
                case = f"{ARCH} {data_name} max_tokens {MAX_TOKENS:,} {device} {precision}"
                if device == "cpu" and precision == "bf16" and not cpu_bf16_instructions() and not DRY:
                    emit(dict(bench="train", case=case, metric="target tokens/s", value="not run", unit="",
                              note=f"this CPU has no native bf16 matrix instructions ({cpu_flags()})"))
                    continue
                dtype = torch.float32 if precision == "fp32" else torch.bfloat16 if precision == "bf16" else torch.float16
                measured = matmul_peak(dtype, dev)
                peak, peak_note = mfu_peak(measured, dev, precision)
                emit(dict(bench="train", case=case, metric="matmul peak", value=measured / 1e12, unit="TFLOP/s",
                          note=f"measured here: the best {precision} n x n x n F.linear; {peak_note}"))
                for compiled in COMPILE:
                    for r in range(ROUNDS):  # alternate xf and the reference: the machine's load hits both
                        name = f"{case}{' compiled' if compiled else ''}" + (f" round {r + 1}" if ROUNDS > 1 else "")
                        tag = f"{device}-{precision}-{int(compiled)}-{r}"
                        results = {}
                        for i, engine in enumerate(ENGINES):
                            # each run its share of the time left (the next one's starts when this one ends)
                            share = (DEADLINE - time.time()) / (len(ENGINES) - i) if math.isfinite(DEADLINE) else math.inf
                            results[engine] = run_child(engine, data, tmp, tag, device, precision, compiled,
                                                        time.time() + share)
                            for row in rows_of(name, results[engine], peak, peak_note):
                                emit(row)
                        xf, ref = results.get("xf", {}), results.get("reference", {})
                        if xf.get("tgt_tok_s") and ref.get("tgt_tok_s"):
                            emit(dict(bench="train", case=name, metric="xf / reference", unit="",
                                      value=xf["tgt_tok_s"] / ref["tgt_tok_s"], ratio=xf["tgt_tok_s"] / ref["tgt_tok_s"],
                                      note="target tokens/s, the two runs above"))


def rows_of(case: str, r: dict, peak: float, peak_note: str) -> list[dict]:
    """The rows of one run: speed, MFU (against ``peak``, FLOP/s, which ``peak_note`` names:
    gpu_peaks.mfu_peak), peak memory, update 1 (compilation), graphs; each row notes how the run
    ended."""
    who = "xf" if r["engine"] == "xf" else "reference"
    prefix = "" if who == "xf" else "reference "
    timed = r.get("updates_timed") or 0
    how = f"{who}; {timed} updates timed in {r.get('seconds', 0):.1f} s, {r['ended']}"
    row = dict(bench="train", case=case, ended=r["ended"], updates_timed=timed)
    out = []
    if not timed:
        out.append({**row, "metric": f"{prefix}target tokens/s", "value": "no update timed", "unit": "",
                    "note": how + (f"; update 1 took {r['first_update_seconds']:.1f} s" if "first_update_seconds" in r
                                   else "")})
    else:
        per_token = r["flops"] / r["tgt_tokens"]
        flops_note = f"{per_token / 1e6:.1f} MFLOP/target token over the timed pairs (no padding); {peak_note}"
        out += [
            {**row, "metric": f"{prefix}target tokens/s", "value": r["tgt_tok_s"], "unit": "tok/s",
             "note": how + ("" if r.get("finite") else "; the last loss was not finite")},
            {**row, "metric": f"{prefix}MFU", "value": 100 * r["flops"] / r["seconds"] / peak, "unit": "%",
             "note": f"{who}; {flops_note}"},
            {**row, "metric": f"{prefix}peak memory", "value": r["peak_memory_mib"], "unit": "MiB",
             "note": f"{who}; " + ("CUDA allocated" if r["device"] == "cuda" else "process RSS")},
        ]
    if "first_update_seconds" in r:
        out.append({**row, "metric": f"{prefix}update 1", "value": r["first_update_seconds"], "unit": "s",
                    "note": f"{who}; " + ("includes torch.compile" if r["compiled"] else "start-up of the step")
                            + "; not in the speed"})
    if r.get("compiled") and "graphs_after_first" in r:
        during = r.get("graphs", r["graphs_after_first"]) - r["graphs_after_first"]
        out.append({**row, "metric": f"{prefix}compiled graphs", "value": r.get("graphs", r["graphs_after_first"]),
                    "unit": "", "note": f"{who}; {during} made during the timed updates (recompilations)",
                    "recompiles": during})
    return out


def rows() -> list[dict]:
    out: list[dict] = []
    measure(out.append)
    return out


def main(argv: list[str]) -> None:
    if argv[:1] == ["--run"]:
        one_run(**json.loads(argv[1]))
        return
    path = Path(argv[0]) if argv else None
    out: list[dict] = []

    def emit(row):
        out.append(row)
        print(json.dumps(row), flush=True)
        if path:  # written after every row: a run cut short keeps what it measured
            write_json(path, {"cpu_flags": cpu_flags(), "torch": torch.__version__, "rows": out})

    measure(emit)


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    main(sys.argv[1:])
