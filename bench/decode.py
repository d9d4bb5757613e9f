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
``python bench/decode.py OUT.json`` writes the rows to OUT.json after every measurement.

Every CPU kind at its best (``--cpu``): one trained checkpoint on real sources, each engine and
setting in a fresh process, run one after another, best of --rounds passes each::

    python bench/decode.py --cpu CHECKPOINT SOURCE [--reference REF] [--shortlist FILE] \
        [--lines 500] [--threads 0] [--rounds 2] [--cases NAME,...] [OUT.json]

xf fp32, bf16 (where native), int8 with each of torch's quantized engines (fbgemm, x86, onednn)
and int8 with --workers 2 (the default engine, x86); CTranslate2
float32 and int8 (xf's own export of the checkpoint, its own beam search) each with CT2_USE_MKL=0
and =1 and CT2_FORCE_CPU_ISA=AVX512 or not, since CTranslate2 uses MKL and AVX-512 only on
GenuineIntel CPUs by default, and with inter_threads 2 (its --workers). xf fp32, bf16 and int8
with --compile (ahead of time: the first case run builds the package into xf's cache, later runs
load it; int8 where its products are exact): the build or load is outside the timed passes, its
seconds in the row. --shortlist FILE (xf
shortlist) adds xf with the shortlist and CTranslate2 with it as its vocabulary map (use_vmap).
CTranslate2's best setting is the reference of the ratios; --reference adds each case's
sacreBLEU on those lines, so that a faster case is seen to keep its BLEU.
Prints the CPU flags, torch's and CTranslate2's backends (CT2_VERBOSE=1's log), one JSON row a
case and a table. Same machine, same run: on a loaded machine only the ratios mean much.

``make bench`` (``BENCH=translate``: ``rows()``), xf translate speed on CPU against CTranslate2: Multi30k test2016 with a `small` model, batch 64.

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
import tempfile
import sys
import time
from pathlib import Path
from typing import Optional

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


# -- --cpu: every engine of this CPU, each in its own process -------------------------------------
CPU_CASES = {  # name -> (engine, TranslateOptions fields or CTranslate2 settings, environment)
    "xf fp32": ("xf", {}, {}),
    "xf bf16": ("xf", {"precision": "bf16"}, {}),
    "xf int8 fbgemm": ("xf", {"quantize": "int8", "int8_engine": "fbgemm"}, {}),
    "xf int8 x86": ("xf", {"quantize": "int8", "int8_engine": "x86"}, {}),
    "xf int8 onednn": ("xf", {"quantize": "int8", "int8_engine": "onednn"}, {}),
    "xf int8 workers 2": ("xf", {"quantize": "int8", "workers": 2}, {}),  # the default engine, x86
    "xf fp32 shortlist": ("xf", {"shortlist": True}, {}),
    "xf int8 shortlist": ("xf", {"quantize": "int8", "shortlist": True}, {}),
    "xf int8 shortlist workers 2": ("xf", {"quantize": "int8", "shortlist": True, "workers": 2}, {}),
    # --compile: its warm-up pass builds (or loads) the compiled step, outside the timed passes
    "xf fp32 compile": ("xf", {"compile": True}, {}),
    "xf fp32 compile workers 2": ("xf", {"compile": True, "workers": 2}, {}),
    "xf fp32 compile shortlist workers 2": ("xf", {"compile": True, "shortlist": True, "workers": 2}, {}),
    "xf bf16 compile": ("xf", {"precision": "bf16", "compile": True}, {}),
    # int8 --compile: ahead of time over torch._int_mm, where this CPU's int8 products are exact
    # (VNNI, AMX; refused elsewhere, and the case is reported as refused)
    "xf int8 compile": ("xf", {"quantize": "int8", "compile": True}, {}),
    "xf int8 compile workers 2": ("xf", {"quantize": "int8", "compile": True, "workers": 2}, {}),
    "xf int8 compile shortlist workers 2": ("xf", {"quantize": "int8", "compile": True, "shortlist": True,
                                                   "workers": 2}, {}),
    # CTranslate2 picks MKL and AVX-512 only on GenuineIntel CPUs unless told: each combination
    **{f"CTranslate2 {ct}{' MKL' * mkl}{' AVX512' * avx512}": (
        "ct2", {"compute_type": ct}, {"CT2_USE_MKL": str(mkl), **({"CT2_FORCE_CPU_ISA": "AVX512"} if avx512 else {})})
       for ct in ("float32", "int8") for mkl in (0, 1) for avx512 in (0, 1)},
    # ... and its throughput settings, with its default backends (MKL on Intel CPUs) and with AVX-512
    **{f"CTranslate2 {ct}{' AVX512' * avx512}{extra}": (
        "ct2", {"compute_type": ct, **setting}, {"CT2_FORCE_CPU_ISA": "AVX512"} if avx512 else {})
       for ct in ("float32", "int8") for avx512 in (0, 1)
       for extra, setting in ((" inter 2", {"workers": 2}), (" vmap", {"shortlist": True}),
                              (" vmap inter 2", {"workers": 2, "shortlist": True}))},
}
FLAGS = ("avx2", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_tile",
         "amx_int8", "amx_bf16")  # the instruction sets the engines' kernels choose between


def cpu_case(name: str, checkpoint: str, source: str, lines: int, threads: int, rounds: int, ct2_dir: str,
             shortlist: Optional[str] = None, reference: Optional[str] = None) -> dict:
    """In this process: the best of ``rounds`` passes of case ``name`` over the first ``lines``
    lines, beam 4, batches of 64 (loading excluded);
    with ``reference``, the sacreBLEU of the last pass's output against its first ``lines`` lines."""
    from xformer_cli.options import TranslateOptions
    from xformer_cli.translation import Stats, open_engine, translate_buffer

    if threads:
        torch.set_num_threads(threads)
    engine_kind, setting, _ = CPU_CASES[name]
    if setting.get("shortlist"):
        if shortlist is None:
            raise SystemExit(f"{name}: needs --shortlist FILE")
        setting = {**setting, "shortlist": shortlist}
    text = Path(source).read_text(encoding="utf-8").splitlines()[:lines]
    row = dict(case=name, threads=torch.get_num_threads())
    if engine_kind == "xf":
        options = TranslateOptions(path=(checkpoint,), beam_size=4, batch_size=64, device="cpu", **setting)
        engine, sp, _ = open_engine(options)
        row["backend"] = (f"torch {torch.__version__}, quantized engine {engine.int8_engine}" if engine.int8_engine
                          else f"torch {torch.__version__}, {setting.get('precision', 'fp32')} (oneDNN/MKL via aten)")

        def one_pass():
            return translate_buffer(engine, sp, text, 0, options, Stats())
        if engine.compiled is not None:
            start = time.perf_counter()
            one_pass()  # the compiled step's graphs or packages, built or loaded
            row["compile_seconds"] = round(time.perf_counter() - start, 1)
            row["backend"] += f", compiled: {type(engine.compiled).__name__}"
    else:
        import ctranslate2
        import sentencepiece as spm

        from xformer_cli.ctranslate2_format import _with_vocabulary_map

        sp = spm.SentencePieceProcessor(model_file=f"{ct2_dir}/spm.model")
        vmap = _with_vocabulary_map(Path(ct2_dir), shortlist, sp) if setting.get("shortlist") else None
        workers = setting.get("workers", 1)
        # inter_threads batches at once (translate_batch posts each max_batch_size chunk to them),
        # each with its share of the threads
        translator = ctranslate2.Translator(vmap.name if vmap else ct2_dir, device="cpu",
                                            compute_type=setting["compute_type"], inter_threads=workers,
                                            intra_threads=max(1, torch.get_num_threads() // workers))
        pieces = sp.encode(text, out_type=str)
        row["backend"] = f"ctranslate2 {ctranslate2.__version__}" + "".join(
            f", {k}={os.environ[k]}" for k in ("CT2_USE_MKL", "CT2_FORCE_CPU_ISA") if k in os.environ)

        def one_pass():
            found = translator.translate_batch(pieces, beam_size=4, max_batch_size=64, use_vmap=vmap is not None)
            return [sp.decode_pieces(r.hypotheses[0]) for r in found]
    out = one_pass()  # warm-up: kernels, allocator, oneDNN's primitives
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        out = one_pass()
        best = min(best, time.perf_counter() - start)
    row["sentences/s"] = len(text) / best
    if reference is not None:
        import sacrebleu

        refs = Path(reference).read_text(encoding="utf-8").splitlines()[:lines]
        row["bleu"] = round(sacrebleu.corpus_bleu(out, [refs]).score, 2)
    return row


def ct2_backends(ct2_dir: str, env: dict) -> list[str]:
    """CTranslate2's log of its CPU backends under ``env`` (CT2_VERBOSE=1: the ISA, MKL or not,
    each GEMM's library)."""
    code = f"import ctranslate2; ctranslate2.Translator({ct2_dir!r}, device='cpu', compute_type='int8')"
    proc = subprocess.run([sys.executable, "-c", code], env={**os.environ, "CT2_VERBOSE": "1", **env},
                          capture_output=True, text=True)
    return [line.split("[info]", 1)[-1].strip(" -") for line in proc.stderr.splitlines()
            if any(k in line for k in ("CPU:", "ISA", "MKL", "backend"))]


def cpu_main(argv: list[str]) -> None:
    import argparse
    import tempfile

    parser = argparse.ArgumentParser(description="decode.py --cpu: every engine of this CPU")
    parser.add_argument("checkpoint")
    parser.add_argument("source")
    parser.add_argument("out", nargs="?")
    parser.add_argument("--lines", type=int, default=500)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--shortlist", default=None, help="an xf shortlist file: adds the shortlist cases")
    parser.add_argument("--reference", default=None, help="reference translations of SOURCE: each case's sacreBLEU")
    parser.add_argument("--cases", default=None, help="comma-separated case names (default: every case, "
                        "those with a shortlist only with --shortlist)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--ct2-dir", default=None, help=argparse.SUPPRESS)
    args = parser.parse_intermixed_args(argv)  # OUT after the options, as the docs write it
    if args.child:
        print(json.dumps(cpu_case(args.child, args.checkpoint, args.source, args.lines, args.threads, args.rounds,
                                  args.ct2_dir, args.shortlist, args.reference)))
        return
    cases = args.cases.split(",") if args.cases else [
        name for name, case in CPU_CASES.items()
        if args.shortlist or not case[1].get("shortlist")]
    unknown = [name for name in cases if name not in CPU_CASES]
    if unknown:
        parser.error(f"unknown case(s) {', '.join(unknown)}; the cases: {', '.join(CPU_CASES)}")
    from xformer_cli.checkpoint import load_checkpoint, load_ensemble
    from xformer_cli.ctranslate2_format import write_model_directory
    from xformer_cli.precision import cpu_bf16_instructions

    from xformer_cli.precision import cpu_flags as all_cpu_flags

    found = all_cpu_flags()
    header = dict(cpu_flags=" ".join(f for f in FLAGS if f in found) or "none of " + " ".join(FLAGS),
                  torch=torch.__version__, quantized_engines=torch.backends.quantized.supported_engines)
    rows = []
    with tempfile.TemporaryDirectory(prefix="xf-ct2-") as ct2_dir:
        models, _ = load_ensemble([args.checkpoint], torch.device("cpu"))
        write_model_directory(Path(ct2_dir), models[0], load_checkpoint(args.checkpoint)["spm_model"], "float32",
                              args.checkpoint)
        settings = {" ".join(f"{k}={v}" for k, v in case[2].items()) or "its defaults": case[2]
                    for case in CPU_CASES.values() if case[0] == "ct2" and case[2] is not None}
        header["ct2_backends"] = {name: ct2_backends(ct2_dir, env) for name, env in settings.items()}
        print(json.dumps(header), flush=True)
        for name in cases:
            if name.startswith("xf bf16") and not cpu_bf16_instructions():
                print(f"{name}: skipped: no native bf16 here (emulated: about 0.03x fp32)", file=sys.stderr)
                continue
            if CPU_CASES[name][2].get("CT2_FORCE_CPU_ISA") == "AVX512" and "avx512f" not in found:
                print(f"{name}: skipped: no avx512f here (CT2_FORCE_CPU_ISA=AVX512 needs it)", file=sys.stderr)
                continue
            env = {**os.environ, **CPU_CASES[name][2]}
            proc = subprocess.run([sys.executable, __file__, "--cpu", args.checkpoint, args.source, "--child", name,
                                   "--ct2-dir", ct2_dir, "--lines", str(args.lines), "--threads", str(args.threads),
                                   "--rounds", str(args.rounds),
                                   *(["--shortlist", args.shortlist] if args.shortlist else []),
                                   *(["--reference", args.reference] if args.reference else [])],
                                  env=env, capture_output=True, text=True)
            if proc.returncode:
                print(f"{name}: failed: {proc.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
                continue
            rows.append(json.loads(proc.stdout.splitlines()[-1]))
            print(json.dumps(rows[-1]), flush=True)
            if args.out:
                Path(args.out).write_text(json.dumps({**header, "rows": rows}, indent=1))
    ct2 = [r for r in rows if r["case"].startswith("CTranslate2")]
    best = max(ct2, key=lambda r: r["sentences/s"]) if ct2 else None
    print(f"{args.checkpoint}, {args.lines} lines, beam 4, batch 64, load average {os.getloadavg()[0]:.1f}; "
          f"cpu flags: {header['cpu_flags']}")
    for setting, lines in header["ct2_backends"].items():
        print(f"CTranslate2 with {setting}: {'; '.join(lines)}")
    for r in rows:
        ratio = f", {r['sentences/s'] / best['sentences/s']:.2f}x {best['case']}" if best else ""
        bleu = f", BLEU {r['bleu']:.2f}" if "bleu" in r else ""
        bleu += f", compiling {r['compile_seconds']} s (not timed)" if "compile_seconds" in r else ""
        print(f"{r['case']:<34} {r['sentences/s']:8.1f} sent/s{ratio}{bleu}   [{r['backend']}]")


def main(argv: list[str]) -> None:
    if argv[:1] == ["--cpu"]:
        return cpu_main(argv[1:])
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


# -- make bench: xf translate against CTranslate2, case by case in fresh processes --------------
REPO = Path(__file__).resolve().parents[1]
MULTI30K = Path(os.environ.get("MULTI30K_DIR", REPO.parent / "shared" / "data" / "multi30k"))
SOURCE = Path(os.environ.get("XF_BENCH_SOURCE", MULTI30K / "test2016.en"))
REFERENCE = Path(os.environ.get("XF_BENCH_REFERENCE", MULTI30K / "test2016.de"))
CHECKPOINT = os.environ.get("XF_BENCH_CHECKPOINT")
TRANSLATE_SENTENCES = int(os.environ.get("XF_BENCH_SENTENCES", "1000"))
ROUNDS = int(os.environ.get("XF_BENCH_ROUNDS", "2"))
NO_CACHE_SENTENCES = 200  # the prefix-recomputing loop is slow: compared on the first 200 lines
TRANSLATE_BATCH = 64
THREADS = int(os.environ.get("XF_BENCH_THREADS", "0"))  # 0: torch's default (one per core)
CACHE = os.environ.get("XF_BENCH_CACHE", "1") != "0"  # 0: skip the cache's speed-up rows
RANDOM_ARCH = os.environ.get("XF_BENCH_ARCH", "small")  # the random model's preset (base: the paper's shape)
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
    path = directory / f"{RANDOM_ARCH}-random.pt"
    save_checkpoint(path, make_checkpoint(build_model(RANDOM_ARCH, vocab_size=8000), model_bytes.getvalue()))
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
            # batches of TRANSLATE_BATCH sentences of similar lengths, as translate_batch(max_batch_size=TRANSLATE_BATCH)
            # makes them; the random model never ends on its own: each batch stops at its longest
            # source (as xf's rows, max_len_a 1, max_len_b 0), not at the longest of the input
            pieces = sp.encode(chunk, out_type=str)
            order = sorted(range(len(pieces)), key=lambda i: -len(pieces[i]))
            batches = [order[i : i + TRANSLATE_BATCH] for i in range(0, len(order), TRANSLATE_BATCH)]

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
                                   beam_size=beam, batch_size=TRANSLATE_BATCH, device="cpu", threads=threads, workers=workers,
                                   **extra, **limits)
        engine_, sp, _ = open_engine(options)

        def translate_all(chunk):
            stats = Stats()
            out = [o.rstrip("\n") for o in translate_buffer(engine_, sp, chunk, 0, options, stats)]
            return out, stats.tgt_tokens

    compiled = getattr(engine_, "compiled", None) if engine != "ct2-native" else None  # xf translate --compile
    translate_all(lines[:TRANSLATE_BATCH])  # warm-up (with --compile: most graphs compile here)
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
            return translator.translate_batch(tokens, beam_size=4, max_batch_size=TRANSLATE_BATCH, **max_len)

        runners[name] = run
    pieces = sp.encode(lines, out_type=int)
    batches = [[pieces[i] for i in b.tolist()] for b in batch_by_size([len(p) for p in pieces], max_sentences=TRANSLATE_BATCH, longest_first=True)]
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
    for batch in batch_by_size([len(p) for p in pieces], max_sentences=TRANSLATE_BATCH, longest_first=True):
        batch = batch.tolist()
        hyps = beam_search(models, collate_source([pieces[i] for i in batch]), options, use_cache=use_cache)
        for i, h in zip(batch, hyps):
            outputs[i] = sp.decode(h[0].tokens[:-1])
    return dict(seconds=time.perf_counter() - start, outputs=outputs)


def measure(kind: str, **kwargs) -> dict:
    """run_case / run_cache_case in a fresh process, so that its peak memory is its own."""
    proc = subprocess.run([sys.executable, __file__, kind], input=json.dumps(kwargs), capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"decode.py {kind} failed:\n{proc.stderr}")
    return json.loads(proc.stdout.splitlines()[-1])


def flags_note() -> str:
    try:
        flags = set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return "unknown CPU flags"
    return ", ".join(f for f in ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16") if f in flags)


def rows() -> list[dict]:
    import importlib.util

    lines = SOURCE.read_text(encoding="utf-8").splitlines()[:TRANSLATE_SENTENCES]
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

    which = f"trained {Path(checkpoint).name}" if trained else f"random {RANDOM_ARCH} model, outputs = source length"
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    common = f"{which}; CPU {flags_note()}; load average {load:.1f} at the end"
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
        name = f"{case}{' beam 4' if CASES[case][1] == 4 else ''}, {SOURCE.name} {len(lines)} lines, batch {TRANSLATE_BATCH}"
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
    out.append(dict(bench="translate", case=f"xf fp32 beam 4, first {len(subset)} lines, batch {TRANSLATE_BATCH}",
                    metric="speed-up of the cache", value=full["seconds"] / cached["seconds"], unit="x",
                    ratio=full["seconds"] / cached["seconds"],
                    note=f"{len(subset) / full['seconds']:.1f} sent/s recomputing the prefix vs "
                         f"{len(subset) / cached['seconds']:.1f} with the cache; {same}/{len(subset)} outputs identical"))
    return out


if __name__ == "__main__":
    child = {"--case": run_case, "--interleaved": run_interleaved, "--cache": run_cache_case}.get(" ".join(sys.argv[1:]))
    if child is not None:  # one of rows()' measurements, in a process of its own (measure)
        print(json.dumps(child(**json.loads(sys.stdin.read()))))
    else:
        main(sys.argv[1:])
