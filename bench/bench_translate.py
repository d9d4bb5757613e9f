"""xf translate speed on CPU against CTranslate2: Multi30k test2016 with a `small` model, batch 64.

Rows: sentences and target subwords per second for beam 4 with xf fp32, xf --precision auto,
xf --quantize int8, xf --compile (its compile time is reported apart and left out of the
speed) and, when ctranslate2 is installed, CTranslate2 fp32 and int8 (its native
search: |Y|^alpha length penalty, its own stopping) on the same checkpoint exported by
``xf export ctranslate2``; greedy with xf fp32. Every case runs in a fresh process (so its peak
memory is its own) and the cases alternate, XF_BENCH_ROUNDS rounds (default 2), so that on a
busy machine the ratios to CTranslate2 fp32 compare like with like; each figure is the best
round. Model loading is excluded (sentencepiece, sorting and search are included, as
``xf translate`` runs them). Identical-output counts compare each case with xf fp32, and
"CTranslate2 engine" counts ``xf translate --engine ctranslate2`` (xf's search rules emulated).
The "interleaved" rows run xf and CTranslate2 (fp32 and int8) in one process, batch after batch,
in rotating order: the machine's load falls on all alike, but the two engines' thread pools in
one process slow each other (CTranslate2 fp32 81 sent/s there against 138 alone on the 2-core
EPYC: its threads spin-wait beside torch's), so the per-process rows are the fair comparison and
the interleaved ones only a check of the ordering on a busy machine. The key/value cache's
speed-up over decoding the whole prefix is measured on 200 lines.

XF_BENCH_CHECKPOINT=PATH uses a trained checkpoint (its BLEU against XF_BENCH_REFERENCE, default
test2016.de, is reported too). Without it, a randomly initialised `small` model with an
8000-subword sentencepiece model learned on Multi30k stands in; it never chooses eos, so its
outputs are capped at the source length (max_len_a 1, max_len_b 0). XF_BENCH_SOURCE changes the
input (default test2016.en); XF_BENCH_SENTENCES=N uses the first N lines; XF_BENCH_THREADS=N sets
the threads of torch and CTranslate2 (default: torch's, one per core); XF_BENCH_ROUNDS=N the
rounds; XF_BENCH_CACHE=0 skips the cache rows; XF_BENCH_ARCH=base makes the random model the
paper's `base` shape (vocabulary 8000). Two rows give the aims: xf's fastest beam-4
mode over CTranslate2 int8, and xf fp32 over CTranslate2 float32. The "shortlist" cases translate
with ``--shortlist``: XF_BENCH_SHORTLIST=FILE (written by xf shortlist for the checkpoint's data),
else one built from Multi30k train encoded with the checkpoint's sentencepiece model.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MULTI30K = Path(os.environ.get("MULTI30K_DIR", REPO.parent / "shared" / "data" / "multi30k"))
SOURCE = Path(os.environ.get("XF_BENCH_SOURCE", MULTI30K / "test2016.en"))
REFERENCE = Path(os.environ.get("XF_BENCH_REFERENCE", MULTI30K / "test2016.de"))
CHECKPOINT = os.environ.get("XF_BENCH_CHECKPOINT")
SENTENCES = int(os.environ.get("XF_BENCH_SENTENCES", "1000"))
ROUNDS = int(os.environ.get("XF_BENCH_ROUNDS", "2"))
NO_CACHE_SENTENCES = 200  # the prefix-recomputing loop is slow: compared on the first 200 lines
BATCH = 64
THREADS = int(os.environ.get("XF_BENCH_THREADS", "0"))  # 0: torch's default (one per core)
CACHE = os.environ.get("XF_BENCH_CACHE", "1") != "0"  # 0: skip the cache's speed-up rows
ARCH = os.environ.get("XF_BENCH_ARCH", "small")  # the random model's preset (base: the paper's shape)
SHORTLIST = os.environ.get("XF_BENCH_SHORTLIST")

# name -> (engine, beam, options of TranslateOptions); "ct2 native ..." run CTranslate2's own search
# "workers": WORKERS: one batch per thread, as many as threads (xf --workers; CTranslate2's inter_threads)
WORKERS = "one per thread"
CASES = {
    "xf fp32": ("xf", 4, {}),
    "xf fp32 workers": ("xf", 4, {"workers": WORKERS}),
    "xf auto": ("xf", 4, {"precision": "auto"}),
    "xf int8": ("xf", 4, {"quantize": "int8"}),
    "xf int8 workers": ("xf", 4, {"quantize": "int8", "workers": WORKERS}),
    # oneDNN's int8 kernels (AMX tiles where the CPU has amx_int8), against fbgemm's above
    "xf int8 onednn": ("xf", 4, {"quantize": "int8", "int8_engine": "onednn"}),
    "xf int8 onednn workers": ("xf", 4, {"quantize": "int8", "int8_engine": "onednn", "workers": WORKERS}),
    "CTranslate2 fp32": ("ct2-native", 4, {"compute_type": "float32"}),
    "CTranslate2 fp32 workers": ("ct2-native", 4, {"compute_type": "float32", "workers": WORKERS}),
    "CTranslate2 int8": ("ct2-native", 4, {"compute_type": "int8"}),
    "CTranslate2 int8 workers": ("ct2-native", 4, {"compute_type": "int8", "workers": WORKERS}),
    "CTranslate2 engine fp32": ("ctranslate2", 4, {}),
    "xf fp32 compile": ("xf", 4, {"compile": True}),  # its compile time is reported, not timed
    "xf fp32 greedy": ("xf", 1, {}),
    "xf fp32 shortlist": ("xf", 4, {"shortlist": True}),  # True: the shortlist rows() builds or is given
    "xf int8 shortlist": ("xf", 4, {"quantize": "int8", "shortlist": True}),
    "xf int8 shortlist workers": ("xf", 4, {"quantize": "int8", "shortlist": True, "workers": WORKERS}),
}
REFERENCE_CASE = "CTranslate2 fp32"


def random_checkpoint(directory: Path) -> str:
    """A random XF_BENCH_ARCH model and an 8000-subword joint sentencepiece model learned on Multi30k."""
    import sentencepiece as spm
    import torch

    from xformer_cli.checkpoint import make_checkpoint, save_checkpoint
    from xformer_cli.model import build_model

    lines = []
    for lang in ("en", "de"):
        lines += (MULTI30K / f"train.{lang}").read_text(encoding="utf-8").splitlines()
    model_bytes = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=model_bytes, vocab_size=8000, model_type="bpe",
        character_coverage=1.0, pad_id=0, unk_id=1, bos_id=2, eos_id=3, minloglevel=2,
    )
    torch.manual_seed(0)
    path = directory / f"{ARCH}-random.pt"
    save_checkpoint(path, make_checkpoint(build_model(ARCH, vocab_size=8000), model_bytes.getvalue()))
    return str(path)


def bench_shortlist(checkpoint: str, directory: Path) -> str:
    """xf shortlist's file (defaults) from Multi30k train, encoded with the checkpoint's vocabulary."""
    import numpy as np

    from xformer_cli.checkpoint import load_checkpoint, spm_digest, vocab_digest
    from xformer_cli.shortlist import build_shortlist
    from xformer_cli.vocab import load_sentencepiece

    spm_model = load_checkpoint(checkpoint)["spm_model"]
    sp = load_sentencepiece(spm_model, checkpoint)
    src, tgt = ([np.array(ids) for ids in sp.encode((MULTI30K / f"train.{lang}").read_text(encoding="utf-8").splitlines())]
                for lang in ("en", "de"))
    path = directory / "shortlist.npz"
    build_shortlist(src, tgt, sp.get_piece_size(), vocab_digest(spm_model), spm_sha256=spm_digest(spm_model)).save(path)
    return str(path)


def run_case(checkpoint: str, ct2_dir: str, lines: list[str], case: str, trained: bool, shortlist: str = "") -> dict:
    """Translate ``lines`` as ``case`` says and time it (loading excluded)."""
    import torch

    from xformer_cli.options import TranslateOptions
    from xformer_cli.train_log import peak_memory_mib
    from xformer_cli.translation import Stats, open_engine, translate_buffer

    if THREADS:
        torch.set_num_threads(THREADS)
    threads = torch.get_num_threads()
    engine, beam, extra = CASES[case]
    extra = dict(extra)
    workers = threads if extra.pop("workers", None) == WORKERS else 1
    if extra.get("shortlist"):
        extra["shortlist"] = shortlist
    limits = {} if trained else dict(max_len_a=1.0, max_len_b=0)
    if engine == "ct2-native":
        import ctranslate2
        import sentencepiece as spm

        sp = spm.SentencePieceProcessor(model_file=f"{ct2_dir}/spm.model")
        translator = ctranslate2.Translator(ct2_dir, device="cpu", intra_threads=threads // workers,
                                            inter_threads=workers, **extra)

        def translate_all(chunk):
            # batches of BATCH sentences of similar lengths, as translate_batch(max_batch_size=BATCH)
            # makes them; the random model never ends on its own: each batch stops at its longest
            # source (as xf's rows, max_len_a 1, max_len_b 0), not at the longest of the input
            pieces = sp.encode(chunk, out_type=str)
            order = sorted(range(len(pieces)), key=lambda i: -len(pieces[i]))
            batches = [order[i : i + BATCH] for i in range(0, len(order), BATCH)]

            def run(b):
                max_len = {} if trained else {"max_decoding_length": max(len(pieces[i]) for i in b)}
                return translator.translate_batch([pieces[i] for i in b], beam_size=beam, **max_len)

            if workers == 1:
                done = map(run, batches)
            else:  # translate_batch called from `workers` threads (inter_threads)
                from concurrent.futures import ThreadPoolExecutor

                pool = ThreadPoolExecutor(workers)
                done = list(pool.map(run, batches))
                pool.shutdown()
            out = [None] * len(pieces)
            for b, results in zip(batches, done):
                for i, r in zip(b, results):
                    out[i] = r
            hyps = [r.hypotheses[0] for r in out]
            return [sp.decode_pieces(h) for h in hyps], sum(len(h) + 1 for h in hyps)
    else:
        options = TranslateOptions(path=(ct2_dir if engine == "ctranslate2" else checkpoint,), engine=engine,
                                   beam_size=beam, batch_size=BATCH, device="cpu", threads=threads, workers=workers,
                                   **extra, **limits)
        engine_, sp, _ = open_engine(options)

        def translate_all(chunk):
            stats = Stats()
            out = [o.rstrip("\n") for o in translate_buffer(engine_, sp, chunk, 0, options, stats)]
            return out, stats.tgt_tokens

    compiled = getattr(engine_, "compiled", None) if engine != "ct2-native" else None  # xf translate --compile
    translate_all(lines[:BATCH])  # warm-up (with --compile: most graphs compile here)
    compiling = compiled.compile_seconds if compiled else 0.0
    start = time.perf_counter()
    outputs, tokens = translate_all(lines)
    seconds = time.perf_counter() - start
    extra = {}
    if compiled:  # graphs compiled in the timed pass (a batch of one sentence) are not decoding either
        seconds -= compiled.compile_seconds - compiling
        extra = dict(compile_seconds=compiled.compile_seconds, graphs=compiled.graphs)
    return dict(seconds=seconds, tokens=tokens, peak=peak_memory_mib(torch.device("cpu")), outputs=outputs,
                threads=threads, **extra)


def run_interleaved(checkpoint: str, ct2_dir: str, lines: list[str], trained: bool) -> dict:
    """xf and CTranslate2 (fp32 and int8 each) in one process, batch after batch, the order
    rotating: the machine's load falls on all of them alike, but their thread pools slow each
    other (the module docstring), so these are a check of the ordering, not the fair ratios."""
    import ctranslate2
    import torch

    from xformer_cli.options import TranslateOptions
    from xformer_cli.batching import batch_by_size
    from xformer_cli.translation import open_engine

    if THREADS:
        torch.set_num_threads(THREADS)
    threads = torch.get_num_threads()
    limits = {} if trained else dict(max_len_a=1.0, max_len_b=0)
    runners = {}
    for name, quantize in (("xf fp32", "none"), ("xf int8", "int8")):
        options = TranslateOptions(path=(checkpoint,), beam_size=4, device="cpu", threads=threads, quantize=quantize, **limits)
        engine, sp, _ = open_engine(options)
        runners[name] = lambda batch, engine=engine, options=options: engine.search(batch, options)
    for name, compute_type in (("CTranslate2 fp32", "float32"), ("CTranslate2 int8", "int8")):
        translator = ctranslate2.Translator(ct2_dir, device="cpu", intra_threads=threads, compute_type=compute_type)
        max_len = {} if trained else {"max_decoding_length": 256}

        def run(batch, translator=translator, max_len=max_len):
            tokens = [[sp.id_to_piece(t) for t in ids] for ids in batch]
            if not trained:
                max_len = {"max_decoding_length": max(len(ids) for ids in batch)}
            return translator.translate_batch(tokens, beam_size=4, max_batch_size=BATCH, **max_len)

        runners[name] = run
    pieces = sp.encode(lines, out_type=int)
    batches = [[pieces[i] for i in b.tolist()] for b in batch_by_size([len(p) for p in pieces], max_sentences=BATCH, longest_first=True)]
    names = list(runners)
    for name in names:
        runners[name](batches[0])  # warm-up
    seconds = {name: 0.0 for name in names}
    for i, batch in enumerate(batches):
        for name in names[i % len(names):] + names[: i % len(names)]:
            start = time.perf_counter()
            runners[name](batch)
            seconds[name] += time.perf_counter() - start
    return dict(seconds=seconds, threads=threads)


def run_cache_case(checkpoint: str, lines: list[str], use_cache: bool, trained: bool) -> dict:
    """The beam search alone, with the key/value cache or decoding the whole prefix every step."""
    import torch

    from xformer_cli.options import DecodingOptions
    from xformer_cli.search import beam_search
    from xformer_cli.batching import batch_by_size, collate_source
    from xformer_cli.checkpoint import load_ensemble

    if THREADS:
        torch.set_num_threads(THREADS)
    cpu = torch.device("cpu")
    models, sp = load_ensemble([checkpoint], cpu)
    options = DecodingOptions(beam_size=4) if trained else DecodingOptions(beam_size=4, max_len_a=1.0, max_len_b=0)
    pieces = sp.encode(lines, out_type=int)
    outputs = [""] * len(lines)
    start = time.perf_counter()
    for batch in batch_by_size([len(p) for p in pieces], max_sentences=BATCH, longest_first=True):
        batch = batch.tolist()
        hyps = beam_search(models, collate_source([pieces[i] for i in batch]), options, use_cache=use_cache)
        for i, h in zip(batch, hyps):
            outputs[i] = sp.decode(h[0].tokens[:-1])
    return dict(seconds=time.perf_counter() - start, outputs=outputs)


def measure(kind: str, **kwargs) -> dict:
    """run_case / run_cache_case in a fresh process, so that its peak memory is its own."""
    proc = subprocess.run([sys.executable, __file__, kind], input=json.dumps(kwargs), capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"bench_translate {kind} failed:\n{proc.stderr}")
    return json.loads(proc.stdout.splitlines()[-1])


def cpu_flags() -> str:
    try:
        flags = set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return "unknown CPU flags"
    return ", ".join(f for f in ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16") if f in flags)


def rows() -> list[dict]:
    import importlib.util

    lines = SOURCE.read_text(encoding="utf-8").splitlines()[:SENTENCES]
    have_ct2 = importlib.util.find_spec("ctranslate2") is not None
    cases = [c for c, (engine, _, _) in CASES.items() if have_ct2 or engine == "xf"]
    with tempfile.TemporaryDirectory() as tmp:
        trained = CHECKPOINT is not None
        checkpoint = CHECKPOINT or random_checkpoint(Path(tmp))
        shortlist = SHORTLIST or bench_shortlist(checkpoint, Path(tmp))
        ct2_dir = str(Path(tmp) / "ct2")
        if have_ct2:
            from xformer_cli.checkpoint import load_checkpoint, model_from_checkpoint
            from xformer_cli.ctranslate2_format import write_model_directory

            ckpt = load_checkpoint(checkpoint)
            write_model_directory(Path(ct2_dir), model_from_checkpoint(ckpt, checkpoint).eval(), ckpt["spm_model"],
                                  source=str(checkpoint))
        results: dict[str, list[dict]] = {c: [] for c in cases}
        for _ in range(ROUNDS):  # alternate the cases, round after round
            for case in cases:
                results[case].append(measure("--case", checkpoint=checkpoint, ct2_dir=ct2_dir, lines=lines,
                                             case=case, trained=trained, shortlist=shortlist))
        interleaved = None
        if have_ct2:
            interleaved = measure("--interleaved", checkpoint=checkpoint, ct2_dir=ct2_dir, lines=lines, trained=trained)
        subset = lines[:NO_CACHE_SENTENCES]
        if CACHE:
            cached = measure("--cache", checkpoint=checkpoint, lines=subset, use_cache=True, trained=trained)
            full = measure("--cache", checkpoint=checkpoint, lines=subset, use_cache=False, trained=trained)

    which = f"trained {Path(checkpoint).name}" if trained else f"random {ARCH} model, outputs = source length"
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    common = f"{which}; CPU {cpu_flags()}; load average {load:.1f} at the end"
    best = {c: min(rs, key=lambda r: r["seconds"]) for c, rs in results.items()}
    reference = best.get(REFERENCE_CASE)
    refs = REFERENCE.read_text(encoding="utf-8").splitlines()[: len(lines)] if trained and REFERENCE.exists() else None
    out = []
    for case in cases:
        r = best[case]
        rate = len(lines) / r["seconds"]
        per_round = ", ".join(f"{len(lines) / x['seconds']:.1f}" for x in results[case])
        note = f"{r['threads']} thread(s); rounds {per_round} sent/s"
        if "compile_seconds" in r:
            note += f"; compile {r['compile_seconds']:.1f} s ({r['graphs']} graphs), not in the speed"
        if case != "xf fp32":
            same = sum(a == b for a, b in zip(r["outputs"], best["xf fp32"]["outputs"]))
            note += f"; {same}/{len(lines)} outputs identical to xf fp32"
        if refs is not None:
            import sacrebleu

            note += f"; BLEU {sacrebleu.corpus_bleu(r['outputs'], [refs]).score:.2f}"
        ratio = rate / (len(lines) / reference["seconds"]) if reference else None
        name = f"{case}{' beam 4' if CASES[case][1] == 4 else ''}, {SOURCE.name} {len(lines)} lines, batch {BATCH}"
        out += [
            dict(bench="translate", case=name, metric="sentences/s", value=rate, unit="sent/s", ratio=ratio,
                 note=note + (f"; ratio vs {REFERENCE_CASE}" if ratio else "") + f"; {common}"),
            dict(bench="translate", case=name, metric="target subwords/s", value=r["tokens"] / r["seconds"],
                 unit="tok/s", note="eos included"),
            dict(bench="translate", case=name, metric="peak memory", value=r["peak"], unit="MiB",
                 note="peak RSS of the process (torch or CTranslate2 included)"),
        ]
    # The two aims (parity, 1.0x), from the best rounds above: xf's fastest mode against CTranslate2's
    # fastest (int8), and xf fp32 against CTranslate2 float32.
    rate = {c: len(lines) / best[c]["seconds"] for c in cases}

    def fastest(names):
        names = [c for c in names if c in rate]
        return max(names, key=rate.get) if names else None

    xf_beam = [c for c in cases if CASES[c][0] == "xf" and CASES[c][1] == 4]
    aims = ((fastest(xf_beam), fastest(["CTranslate2 int8", "CTranslate2 int8 workers"])),
            (fastest(["xf fp32", "xf fp32 workers"]), fastest(["CTranslate2 fp32", "CTranslate2 fp32 workers"])))
    for mine, theirs in aims:
        if theirs is not None:
            out.append(dict(bench="translate", case=f"{mine} / {theirs} beam 4 (aim >= 1.0)", metric="speed ratio",
                            value=rate[mine] / rate[theirs], unit="x", ratio=rate[mine] / rate[theirs],
                            note=f"{rate[mine]:.1f} vs {rate[theirs]:.1f} sent/s, best rounds; {common}"))
    if interleaved is not None:
        secs = interleaved["seconds"]
        for name, value in secs.items():
            out.append(dict(bench="translate", case=f"{name} beam 4, interleaved batch by batch in one process (thread pools contend: not the fair ratio)",
                            metric="sentences/s", value=len(lines) / value, unit="sent/s",
                            ratio=secs[REFERENCE_CASE] / value,
                            note=f"{interleaved['threads']} thread(s); ratio vs {REFERENCE_CASE} in the same batches; {common}"))
    if not CACHE:
        return out
    same = sum(a == b for a, b in zip(cached["outputs"], full["outputs"]))
    out.append(dict(bench="translate", case=f"xf fp32 beam 4, first {len(subset)} lines, batch {BATCH}",
                    metric="speed-up of the cache", value=full["seconds"] / cached["seconds"], unit="x",
                    ratio=full["seconds"] / cached["seconds"],
                    note=f"{len(subset) / full['seconds']:.1f} sent/s recomputing the prefix vs "
                         f"{len(subset) / cached['seconds']:.1f} with the cache; {same}/{len(subset)} outputs identical"))
    return out


if __name__ == "__main__":
    if sys.argv[1:] == ["--case"]:
        print(json.dumps(run_case(**json.loads(sys.stdin.read()))))
    elif sys.argv[1:] == ["--interleaved"]:
        print(json.dumps(run_interleaved(**json.loads(sys.stdin.read()))))
    elif sys.argv[1:] == ["--cache"]:
        print(json.dumps(run_cache_case(**json.loads(sys.stdin.read()))))
    else:
        for row in rows():
            print(row)
