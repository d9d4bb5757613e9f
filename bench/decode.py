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
"""

from __future__ import annotations

import json
import os
import subprocess
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


if __name__ == "__main__":
    main(sys.argv[1:])
