"""Decoding speed, one case a process: sentences/s of xf translate's pipeline (and of
CTranslate2's own search), with same-run ratios against one case, each case's BLEU and the CPU flags.

    python bench/decode.py [--path CKPT] [--source FILE|wmt-like] [--reference REF] [--lines 1000]
                           [--cases "xf fp32,xf int8,ct2 int8"] [--against CASE] [--rounds 2]
                           [--threads 0] [--batch 64] [--shortlist FILE] [--max-len-a A --max-len-b B]
                           [--json OUT] [--isa avx2]

A case is words, the engine first:
- ``xf`` (xf translate: ``TranslateOptions`` and ``decode.translate.open_engine`` / ``translate_buffer``,
  sentencepiece, sorting and search included, loading excluded); ``ct2``: CTranslate2's own
  ``translate_batch`` (its own search and length penalty) on xf's export of the checkpoint;
  ``ct2-engine``: ``xf translate --engine ctranslate2`` (xf's search rules over CTranslate2);
- a precision: ``fp32`` (default), ``bf16``, ``fp16``, ``auto`` or ``int8``; with xf's int8 an
  engine ``fbgemm``, ``x86`` or ``onednn`` (without one: ``--int8-engine auto``, the decoding
  plan's rule by the CPU's flags, which the case's backend names: "rule fired: ...");
- ``compile`` (the decoder step ahead of time: its build or load happens in the warm-up, and is
  reported, not timed), ``shortlist`` (--shortlist; CTranslate2's vocabulary map), ``workersN``
  (--workers N; CTranslate2's inter_threads), ``workersauto`` (xf's --workers 0: the plan's rule),
  ``greedy`` (beam 1; else --beam), ``cuda``;
- CTranslate2's backends (it takes MKL and AVX-512 only on GenuineIntel CPUs unless told): ``mkl``,
  ``nomkl`` (CT2_USE_MKL), ``avx512`` (CT2_FORCE_CPU_ISA=AVX512).
Each xf case is checked by the decoding plan first (``decode.plan.plan_decoding``): a case the
plan refuses here, or would run badly (emulated bf16), is skipped with the plan's reason.

``--isa avx2`` runs every case as on an AVX2-only CPU (torch's kernels ``ATEN_CPU_CAPABILITY``,
oneDNN's ``ONEDNN_MAX_CPU_ISA``, fbgemm's ``FBGEMM_ENABLE_INSTRUCTIONS`` (torch's int8 products:
it picks its kernels by the CPU, not by torch's setting), MKL's ``MKL_ENABLE_INSTRUCTIONS``,
CTranslate2's ``CT2_FORCE_CPU_ISA``; bf16 cases skipped): the AVX2
row of a table measured on an AVX-512 machine, labelled so in the header; a real AVX2 CPU is the
better witness (the caches and clocks are the bigger machine's).

The length rule, one for both engines (STYLE.md item 22): xf stops each sentence after
floor(max_len_a x |X| + max_len_b) subwords (|X| its source's, eos not counted; xf translate's
defaults, |X| + 50, or --max-len-a/--max-len-b); CTranslate2 has no limit per sentence, so each of
its batches (sorted by length, as translate_batch sorts them) gets ``max_decoding_length`` = that
bound for the batch's longest source, the one xf applies to the same sentence (both counts are
subwords before eos, clamped to the model's positions - 1). No output of either engine is longer
than its batch's longest source allows; a shorter sentence may run longer in CTranslate2 than in
xf (never the reverse). The header names the rule, and each case's row its limit and its longest
output.

The cases alternate, --rounds rounds, each run in a fresh process (its peak memory its own; a busy
machine slows all alike), each figure its best round. Without --path a random model of --arch
stands in (it never ends a sentence: unless --max-len-a/--max-len-b say otherwise, outputs are capped at the
source length: max_len_a 1, max_len_b 0) with a BPE of
8,000 learned on Multi30k train, or with ``--source wmt-like`` --vocab-size made-up words and
synthetic sources of WMT-like lengths (no data needed; bench/gpu.sh). --cpu-lines N decodes only
the first N lines in the CPU cases (beside CUDA ones). Prints the CPU flags and one line a case,
and where both engines ran, the CPU kind's row of docs/benchmarks.md (xf's best against
CTranslate2's, with shortlists and without, and each engine's defaults with int8: ``--cases
kind`` runs that row's cases); --json OUT gets the rows (make bench's: bench, case, metric,
value, unit, ratio, note) after every measurement. ``make bench`` runs ``rows()``
(XF_BENCH_DECODE: more arguments). Figures mean something only against each other, from one
run on one machine: docs/benchmarks.md keeps them.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
MULTI30K = Path(os.environ.get("MULTI30K_DIR", REPO.parent / "shared" / "data" / "multi30k"))
DEADLINE = float(os.environ.get("XF_BENCH_DEADLINE", "inf"))  # bench/gpu.sh: start no case after it
FLAGS = ("avx2", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_tile",
         "amx_int8", "amx_bf16")  # the instruction sets the engines' kernels choose between
DEFAULT_CASES = ("xf fp32,xf bf16,xf int8,xf int8 fbgemm,xf int8 onednn,xf compile,xf int8 compile,xf shortlist,"
                 "xf int8 shortlist workers2,xf greedy,ct2-engine fp32,ct2 fp32,ct2 int8,ct2 int8 workers2")


# -- cases ---------------------------------------------------------------------------------------
ENGINES = ("xf", "ct2", "ct2-engine")
PRECISIONS = ("fp32", "bf16", "fp16", "auto", "int8")
INT8_ENGINES = ("fbgemm", "x86", "onednn")
CT2_ENV = {"mkl": ("CT2_USE_MKL", "1"), "nomkl": ("CT2_USE_MKL", "0"), "avx512": ("CT2_FORCE_CPU_ISA", "AVX512")}
CT2_COMPUTE = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "int8": "int8", "auto": "default"}


@dataclass(frozen=True)
class Case:
    name: str
    engine: str = "xf"
    precision: str = "fp32"
    int8_engine: Optional[str] = None
    compile: bool = False
    shortlist: bool = False
    workers: int = 1
    greedy: bool = False
    cuda: bool = False
    env: dict = field(default_factory=dict)


def parse_case(name: str) -> Case:
    """The case ``name`` spells (the module docstring's words), or ValueError naming the bad word."""
    words = name.split()
    fields = dict(name=name, engine=words.pop(0) if words and words[0] in ENGINES else "xf", env={})
    for word in words:
        if word in PRECISIONS:
            fields["precision"] = word
        elif word in INT8_ENGINES:
            fields["int8_engine"] = word
        elif word in ("compile", "shortlist", "greedy", "cuda"):
            fields[word] = True
        elif word.startswith("workers") and word[7:].isdigit() and int(word[7:]) > 0:
            fields["workers"] = int(word[7:])
        elif word == "workersauto":  # xf's --workers 0: the decoding plan's rule
            fields["workers"] = 0
        elif word in CT2_ENV:
            fields["env"].update([CT2_ENV[word]])
        else:
            raise ValueError(f"case {name!r}: unknown word {word!r} (the words: {', '.join(ENGINES + PRECISIONS)}, "
                             f"{', '.join(INT8_ENGINES)}, compile, shortlist, greedy, cuda, workersN, workersauto, "
                             f"{', '.join(CT2_ENV)})")
    case = Case(**fields)
    if case.int8_engine and (case.precision != "int8" or case.engine != "xf"):
        raise ValueError(f"case {name!r}: {case.int8_engine} is the engine of xf's int8: add int8")
    if case.workers == 0 and case.engine != "xf":
        raise ValueError(f"case {name!r}: workersauto is xf's --workers 0 (name CTranslate2's inter_threads: workersN)")
    if case.env and case.engine == "xf":
        raise ValueError(f"case {name!r}: {', '.join(case.env)} set CTranslate2's backends, not xf's")
    if case.compile and case.engine != "xf":
        raise ValueError(f"case {name!r}: compile is xf's own step (CTranslate2 runs its own)")
    return case


def translate_options(case: Case, job: dict):
    """The case's ``TranslateOptions`` (xf and ct2-engine cases)."""
    from xformer_cli.settings.options import TranslateOptions

    int8 = case.precision == "int8"
    return TranslateOptions(
        path=(job["ct2_dir"] if case.engine == "ct2-engine" else job["checkpoint"],),
        engine="ctranslate2" if case.engine == "ct2-engine" else "xf", beam_size=1 if case.greedy else job["beam"],
        batch_size=job["batch"], device="cuda" if case.cuda else "cpu", threads=job["threads"],
        workers=case.workers, precision="fp32" if int8 else case.precision, quantize="int8" if int8 else "none",
        int8_engine=case.int8_engine or "auto", compile=case.compile,
        shortlist=job["shortlist"] if case.shortlist else None, max_len_a=job["max_len_a"], max_len_b=job["max_len_b"])


def length_rule(job: dict) -> str:
    """The header's words for the length limit both engines decode under (the module docstring)."""
    a, b = job["max_len_a"], job["max_len_b"]
    bound = f"floor({a:g} x |X| + {b})" if a else f"{b}"
    return (f"length limit {bound} subwords before eos, at most {job['max_positions'] - 1}: xf per sentence "
            f"(|X| its source's subwords), CTranslate2 per batch sorted by length (max_decoding_length = the bound of "
            f"the batch's longest source)")


def case_limit(case: Case, job: dict) -> str:
    """A row's words for the limit its case ran under: how its engine applies the rule, and the
    largest bound of the run (that of the longest source)."""
    per = "per batch" if case.engine == "ct2" else "per sentence"
    return f"{per}, at most {batch_limit([job['longest_source']], job)}"


def batch_limit(lengths: list[int], job: dict) -> int:
    """CTranslate2's max_decoding_length for a batch of sources of ``lengths`` subwords: xf's
    bound (``search.max_output_lengths``) for the longest of them."""
    import torch

    from xformer_cli.decode.search import max_output_lengths

    longest = torch.tensor([max(lengths)])
    return int(max_output_lengths(longest, job["max_len_a"], job["max_len_b"], job["max_positions"])[0])


# --isa avx2: the variables that hold torch, oneDNN, fbgemm, MKL and CTranslate2 to AVX2 kernels
ISA_ENV = {"avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "FBGEMM_ENABLE_INSTRUCTIONS": "AVX2",
                    "MKL_ENABLE_INSTRUCTIONS": "AVX2", "CT2_FORCE_CPU_ISA": "AVX2"}}


def refusal(case: Case, job: dict) -> Optional[str]:
    """Why ``case`` cannot run (or runs badly) here: the decoding plan's word, or what is missing."""
    import importlib.util

    from xformer_cli.decode.plan import Machine, plan_decoding
    from xformer_cli.base.errors import XfError

    if job.get("isa") == "avx2" and (case.precision == "bf16" or case.env.get("CT2_FORCE_CPU_ISA")):
        return "--isa avx2: an AVX2-only CPU has no native bf16 and no AVX-512 kernels"
    if case.engine != "xf" and importlib.util.find_spec("ctranslate2") is None:
        return "ctranslate2 is not installed"
    if case.shortlist and not job["shortlist"]:
        return "no shortlist (--shortlist FILE, or Multi30k train to build one)"
    if case.env.get("CT2_FORCE_CPU_ISA") == "AVX512" and "avx512f" not in job["cpu_flags"]:
        return "no avx512f here"
    if case.engine == "ct2":
        return None
    try:
        plan = plan_decoding(translate_options(case, job), Machine.here())
    except XfError as e:
        return str(e)
    return plan.warning


# -- one case, in its own process ----------------------------------------------------------------
def open_xf(case: Case, job: dict):
    """(translate(lines) -> (outputs, target subwords), the engine's description) through xf translate's library."""
    import torch

    from xformer_cli.decode.translate import Stats, open_engine, translate_buffer

    options = translate_options(case, job)
    engine, sp, _ = open_engine(options)
    plan = engine.plan
    described = (f"engine {plan.engine}, torch {torch.__version__}, {plan.device} {plan.precision}, int8 {plan.int8}"
                 f"{f' ({plan.int8_engine})' if plan.int8_engine else ''}, step {plan.step}"
                 f"{f', workers {plan.workers}' if plan.workers > 1 else ''}"
                 + "".join(f"; rule fired: {rule}" for rule in plan.rules))

    def translate(lines):
        stats = Stats()
        outputs = [o.rstrip("\n") for o in translate_buffer(engine, sp, lines, 0, options, stats)]
        return outputs, stats.tgt_tokens, stats.longest_output

    return translate, described, engine


def open_ct2(case: Case, job: dict):
    """(translate, description) of CTranslate2's own search: batches of --batch sentences sorted by
    length, as translate_batch(max_batch_size) makes them, each capped at xf's bound for its longest
    source (``batch_limit``); workersN: N batches at once (inter_threads)."""
    from concurrent.futures import ThreadPoolExecutor

    import ctranslate2
    import sentencepiece as spm
    import torch

    from xformer_cli.decode.ctranslate2_engine import _with_vocabulary_map

    sp = spm.SentencePieceProcessor(model_file=f"{job['ct2_dir']}/spm.model")
    vmap = _with_vocabulary_map(Path(job["ct2_dir"]), job["shortlist"], sp) if case.shortlist else None
    threads = job["threads"] or torch.get_num_threads()
    translator = ctranslate2.Translator(vmap.name if vmap else job["ct2_dir"], device="cuda" if case.cuda else "cpu",
                                        compute_type=CT2_COMPUTE[case.precision], inter_threads=case.workers,
                                        intra_threads=max(1, threads // case.workers))
    beam = 1 if case.greedy else job["beam"]

    def translate(lines):
        pieces = sp.encode(lines, out_type=str)
        order = sorted(range(len(pieces)), key=lambda i: -len(pieces[i]))
        batches = [order[i: i + job["batch"]] for i in range(0, len(order), job["batch"])]

        def run(batch):
            cap = batch_limit([len(pieces[i]) for i in batch], job)
            return translator.translate_batch([pieces[i] for i in batch], beam_size=beam,
                                              use_vmap=vmap is not None, max_decoding_length=cap)

        with ThreadPoolExecutor(case.workers) as pool:
            found = list(pool.map(run, batches))
        out = [None] * len(pieces)
        for batch, results in zip(batches, found):
            for i, r in zip(batch, results):
                out[i] = r.hypotheses[0]
        # eos counted in the subwords, as xf's; the longest output without it
        return [sp.decode_pieces(h) for h in out], sum(len(h) + 1 for h in out), max(map(len, out), default=0)

    env = "".join(f", {k}={v}" for k, v in case.env.items())
    return translate, f"ctranslate2 {ctranslate2.__version__}, {CT2_COMPUTE[case.precision]}{env}", None


def measure_case(job: dict) -> dict:
    """In this process: a warm-up on the first batch (with compile: the step built or loaded),
    then one timed pass over the lines. Graphs built in the timed pass are not decoding either."""
    import torch

    from xformer_cli.train.log import peak_memory_mib

    if job["threads"]:
        torch.set_num_threads(job["threads"])
    case = parse_case(job["case"])
    translate, described, engine = (open_ct2 if case.engine == "ct2" else open_xf)(case, job)
    lines = job["lines"][: job["cpu_lines"]] if not case.cuda and job["cpu_lines"] else job["lines"]
    step = getattr(engine, "compiled", None)
    translate(lines[: job["batch"]])
    compiling = step.compile_seconds if step else 0.0
    start = time.perf_counter()
    outputs, tokens, longest = translate(lines)
    seconds = time.perf_counter() - start
    row = dict(seconds=seconds, tokens=tokens, outputs=outputs, longest_output=longest, limit=case_limit(case, job),
               backend=described, threads=torch.get_num_threads(),
               peak_mib=peak_memory_mib(torch.device("cuda" if case.cuda else "cpu")))
    if step:
        seconds -= step.compile_seconds - compiling
        row.update(seconds=seconds, compile_seconds=step.compile_seconds, built=step.graphs, loaded=step.loaded)
    if engine is not None:
        engine.close()
    return row


def run_child(job: dict, env: dict) -> dict:
    """``measure_case`` in a fresh process; {"error": its last line} when it fails."""
    timeout = None if DEADLINE == float("inf") else max(1.0, DEADLINE - time.time())
    try:
        proc = subprocess.run([sys.executable, __file__, "--child"], input=json.dumps(job), capture_output=True,
                              text=True, env={**os.environ, **env}, timeout=timeout)
    except subprocess.TimeoutExpired:
        return dict(error="stopped at the deadline")
    if proc.returncode:
        return dict(error=(proc.stderr.strip().splitlines() or ["exit status %d" % proc.returncode])[-1])
    return json.loads(proc.stdout.splitlines()[-1])


# -- the inputs ----------------------------------------------------------------------------------
def random_checkpoint(directory: Path, arch: str = "small", vocabulary: object = "multi30k") -> str:
    """A random ``arch`` model with a joint BPE of 8,000 learned on Multi30k train (vocabulary
    "multi30k"), or a sentencepiece word model of ``vocabulary`` made-up words w0, w1, ..."""
    import sentencepiece as spm
    import torch

    from xformer_cli.model.checkpoint import make_checkpoint, save_checkpoint
    from xformer_cli.model.transformer import build_model

    if vocabulary == "multi30k":
        lines = [line for lang in ("en", "de")
                 for line in (MULTI30K / f"train.{lang}").read_text(encoding="utf-8").splitlines()]
        size, kind = 8000, "bpe"
    else:
        size, kind = int(vocabulary), "word"
        words = [f"w{i}" for i in range(size - 4)]
        lines = [" ".join(words[i: i + 50]) for i in range(0, len(words), 50)]
    spm_bytes = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=spm_bytes, vocab_size=size,
                                   model_type=kind, character_coverage=1.0, pad_id=0, unk_id=1, bos_id=2, eos_id=3,
                                   minloglevel=2)
    torch.manual_seed(0)
    path = directory / f"{arch}-random.pt"
    save_checkpoint(path, make_checkpoint(build_model(arch, vocab_size=size), spm_bytes.getvalue()))
    return str(path)


def wmt_like_lines(count: int, vocabulary: int) -> list[str]:
    """Sources of WMT-like lengths (bench_train.wmt_like_lengths: mean 27 subwords) over the made-up
    words of ``random_checkpoint``: one word, one subword."""
    import numpy as np

    from bench_train import wmt_like_lengths

    rng = np.random.default_rng(1)
    lengths, _ = wmt_like_lengths(count, rng)
    return [" ".join(f"w{i}" for i in rng.integers(0, vocabulary - 4, int(n))) for n in lengths]


def longest_source(checkpoint: str, lines: list[str]) -> int:
    """The most subwords of any of ``lines`` in the checkpoint's vocabulary (eos not counted)."""
    from xformer_cli.model.checkpoint import load_checkpoint
    from xformer_cli.text.vocab import load_sentencepiece

    sp = load_sentencepiece(load_checkpoint(checkpoint)["spm_model"], checkpoint)
    return max(map(len, sp.encode(lines)), default=0)


def build_shortlist(checkpoint: str, directory: Path) -> Optional[str]:
    """xf shortlist's file (its defaults) from Multi30k train encoded with the checkpoint's
    vocabulary; None without Multi30k."""
    import numpy as np

    from xformer_cli.model.checkpoint import load_checkpoint, spm_digest, vocab_digest
    from xformer_cli.decode.shortlist import build_shortlist as build
    from xformer_cli.text.vocab import load_sentencepiece

    if not (MULTI30K / "train.en").exists():
        return None
    spm_model = load_checkpoint(checkpoint)["spm_model"]
    sp = load_sentencepiece(spm_model, checkpoint)
    src, tgt = ([np.array(ids) for ids in sp.encode((MULTI30K / f"train.{lang}").read_text(encoding="utf-8")
                                                    .splitlines())] for lang in ("en", "de"))
    path = directory / "shortlist.npz"
    build(src, tgt, sp.get_piece_size(), vocab_digest(spm_model), spm_sha256=spm_digest(spm_model)).save(path)
    return str(path)


def export_ct2(checkpoint: str, directory: Path) -> str:
    """xf export ctranslate2 of the checkpoint (float32 weights; each case's compute type converts)."""
    from xformer_cli.model.checkpoint import load_checkpoint, model_from_checkpoint
    from xformer_cli.formats.ctranslate2 import write_model_directory

    ckpt = load_checkpoint(checkpoint)
    write_model_directory(directory, model_from_checkpoint(ckpt, checkpoint).eval(), ckpt["spm_model"],
                          source=checkpoint)
    return str(directory)


def ct2_backends(ct2_dir: str, env: dict) -> list[str]:
    """CTranslate2's log of its CPU backends under ``env`` (CT2_VERBOSE=1: the ISA, MKL or not)."""
    code = f"import ctranslate2; ctranslate2.Translator({ct2_dir!r}, device='cpu', compute_type='int8')"
    proc = subprocess.run([sys.executable, "-c", code], env={**os.environ, "CT2_VERBOSE": "1", **env},
                          capture_output=True, text=True)
    return [line.split("[info]", 1)[-1].strip(" -") for line in proc.stderr.splitlines()
            if any(k in line for k in ("CPU:", "ISA", "MKL", "backend"))]


# -- the run -------------------------------------------------------------------------------------
def prepare(args, work: Path, cases: list[Case]) -> dict:
    """The job every case shares: the checkpoint (or a random one), the lines, the export and
    shortlist the cases need, the machine's CPU flags."""
    import importlib.util

    import torch

    from xformer_cli.model.checkpoint import load_checkpoint
    from xformer_cli.settings.options import TranslateOptions
    from xformer_cli.base.precision import cpu_flags

    wmt_like = args.source == "wmt-like"
    checkpoint = args.path or random_checkpoint(work, args.arch, args.vocab_size if wmt_like else "multi30k")
    source = None if wmt_like else Path(args.source or MULTI30K / "test2016.en")
    lines = (wmt_like_lines(args.lines, args.vocab_size) if wmt_like
             else source.read_text(encoding="utf-8").splitlines()[: args.lines])
    found = cpu_flags()
    positions = load_checkpoint(checkpoint)["model_config"]["max_positions"]
    flags = " ".join(f for f in FLAGS if f in found) or "none of " + " ".join(FLAGS)
    # xf translate's length rule; a random model never ends, so its outputs stop at |X| unless told
    defaults = {f.name: f.default for f in dataclasses.fields(TranslateOptions)} if args.path else dict(max_len_b=0)
    job = dict(checkpoint=checkpoint, max_positions=positions, lines=lines, beam=args.beam, batch=args.batch,
               max_len_a=args.max_len_a if args.max_len_a is not None else defaults.get("max_len_a", 1.0),
               max_len_b=args.max_len_b if args.max_len_b is not None else defaults["max_len_b"],
               threads=args.threads, cpu_lines=args.cpu_lines, ct2_dir=None, shortlist=args.shortlist,
               cpu_flags=f"AVX2 emulated (--isa avx2) on {flags}" if args.isa else flags, isa=args.isa)
    job["longest_source"] = longest_source(checkpoint, lines)
    if any(c.shortlist for c in cases) and not args.shortlist:
        job["shortlist"] = build_shortlist(checkpoint, work)
    if any(c.engine != "xf" for c in cases) and importlib.util.find_spec("ctranslate2"):
        job["ct2_dir"] = export_ct2(checkpoint, work / "ct2")
    job["header"] = dict(checkpoint=args.path or f"random {args.arch}", source=str(source or "wmt-like"),
                         lines=len(lines), beam=args.beam, batch=args.batch, cpu_flags=job["cpu_flags"],
                         length_rule=length_rule(job),
                         torch=torch.__version__, threads=args.threads or torch.get_num_threads())
    return job


def measure(args, cases: list[Case], emit) -> tuple[dict, dict, dict]:
    """(header, best round of each case, skipped case -> why); ``emit(header, best, skipped)`` after
    every measurement."""
    with tempfile.TemporaryDirectory(prefix="xf-bench-decode-") as tmp:
        job = prepare(args, Path(tmp), cases)
        header, skipped, best = job.pop("header"), {}, {}
        for case in cases:
            why = refusal(case, job)
            if why:
                skipped[case.name] = why
        envs = {" ".join(f"{k}={v}" for k, v in c.env.items()) or "its defaults": c.env
                for c in cases if c.engine != "xf" and c.name not in skipped}
        if job["ct2_dir"] and envs:
            header["ct2_backends"] = {name: ct2_backends(job["ct2_dir"], env) for name, env in envs.items()}
        emit(header, best, skipped)
        for _ in range(args.rounds):  # the cases alternate, round after round
            for case in (c for c in cases if c.name not in skipped):
                if time.time() > DEADLINE:
                    skipped.setdefault(case.name, "not run: the deadline")
                    continue
                found = run_child({**job, "case": case.name}, case.env)
                if "error" in found:
                    skipped[case.name] = f"failed: {found['error']}"
                    best.pop(case.name, None)
                elif case.name not in best or found["seconds"] < best[case.name]["seconds"]:
                    best[case.name] = found
                emit(header, best, skipped)
    return header, best, skipped


def result_rows(header: dict, best: dict, against: str, refs: Optional[list[str]]) -> list[dict]:
    """make bench's rows, one a case: sentences/s with its ratio to ``against`` (same run), the
    other figures in the note and in keys of their own."""
    import sacrebleu

    rows = []
    reference = best.get(against)
    for name, r in best.items():
        count = len(r["outputs"])
        rate = count / r["seconds"]
        row = dict(bench="decode", case=name, metric="sentences/s", value=rate, unit="sent/s",
                   tokens_per_s=r["tokens"] / r["seconds"], peak_mib=r["peak_mib"], threads=r["threads"],
                   backend=r["backend"], lines=count, limit=r["limit"], longest_output=r["longest_output"])
        if reference:
            row["ratio"] = rate / (len(reference["outputs"]) / reference["seconds"])
            row["identical"] = sum(a == b for a, b in zip(r["outputs"], reference["outputs"]))
        if refs:
            row["bleu"] = round(sacrebleu.corpus_bleu(r["outputs"], [refs[:count]]).score, 2)
        if "compile_seconds" in r:
            row.update(compile_seconds=round(r["compile_seconds"], 2), built=r["built"], loaded=r["loaded"])
        row["note"] = "; ".join(filter(None, [
            f"{count} lines, {r['threads']} thread(s), {row['tokens_per_s']:.0f} target subwords/s, "
            f"peak {r['peak_mib']:.0f} MiB", r["backend"],
            f"length limit {r['limit']}, longest output {r['longest_output']} subwords",
            f"ratio vs {against}, {row['identical']}/{min(count, len(reference['outputs']))} outputs identical to it"
            if reference else "",
            f"BLEU {row['bleu']}" if "bleu" in row else "",
            f"compiling {row['compile_seconds']} s ({r['built']} package(s) built, {r['loaded']} loaded), not timed"
            if "compile_seconds" in row else "",
            f"CPU flags {header['cpu_flags']}"]))
        rows.append(row)
    return rows


def table(header: dict, rows: list[dict], skipped: dict, against: str) -> str:
    """The printed table: the run's settings and CPU flags, one line a case."""
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    out = [f"{header['checkpoint']}, {header['source']} ({header['lines']} lines), beam {header['beam']}, batch "
           f"{header['batch']}, {header['threads']} thread(s), torch {header['torch']}, load average {load:.1f}; "
           f"CPU flags: {header['cpu_flags']}", f"Both engines: {header['length_rule']}"]
    out += [f"CTranslate2 with {name}: {'; '.join(lines)}" for name, lines in header.get("ct2_backends", {}).items()]
    for r in rows:
        ratio = f"  {r['ratio']:.2f}x {against}" if "ratio" in r else ""
        bleu = f"  BLEU {r['bleu']:.2f}" if "bleu" in r else ""
        compiled = (f"  compiling {r['compile_seconds']} s ({r['built']} built, {r['loaded']} loaded; not timed)"
                    if "compile_seconds" in r else "")
        out.append(f"{r['case']:<32} {r['value']:8.1f} sent/s{ratio}{bleu}  limit {r['limit']}, longest "
                   f"{r['longest_output']}{compiled}   [{r['backend']}]")
    out += [f"{name:<32} skipped: {why}" for name, why in skipped.items()]
    return "\n".join(out)


# --cases kind: one CPU kind's row of docs/benchmarks.md ("xf beside CTranslate2, one row per CPU
# kind"): each engine's defaults with int8, and the settings that were each engine's fastest on
# some CPU kind, with and without shortlists (the plan refuses what this CPU cannot run)
KIND_CASES = ("xf int8,ct2 int8,xf int8 workers2,xf int8 compile workers2,xf bf16 compile workers2,"
              "xf int8 shortlist workers2,xf int8 compile shortlist workers2,xf bf16 compile shortlist workers2,"
              "ct2 int8 workers2,ct2 int8 nomkl workers2,ct2 int8 avx512 workers2,ct2 int8 nomkl avx512 workers2,"
              "ct2 fp32 nomkl avx512 workers2,ct2 int8 shortlist workers2,ct2 int8 nomkl shortlist workers2,"
              "ct2 int8 avx512 shortlist workers2,ct2 int8 nomkl avx512 shortlist workers2")


BLEU_TOLERANCE = 0.3  # "at equal BLEU": xf's best is its fastest case at most this below CTranslate2's best


def kind_row(header: dict, rows: list[dict]) -> Optional[str]:
    """The CPU kind's row: xf's best against CTranslate2's best with shortlists and without, and
    xf's defaults (``xf int8``: --quantize int8 alone) against CTranslate2's (``ct2 int8``), each
    with its case and BLEU; xf's best is its fastest case whose BLEU is at most ``BLEU_TOLERANCE``
    below CTranslate2's best's (where both have one). None unless both engines ran."""
    import datetime

    def best(engine: str, shortlist: bool, near=None):
        found = [r for r in rows if r["case"].split()[0] == engine and ("shortlist" in r["case"].split()) == shortlist
                 and (near is None or "bleu" not in near or r.get("bleu", near["bleu"]) >= near["bleu"] - BLEU_TOLERANCE
                      - 1e-9)]
        return max(found, key=lambda r: r["value"], default=None)

    def cell(xf, ct2) -> str:
        if xf is None or ct2 is None:
            return "not measured"
        bleu = lambda r: f", BLEU {r['bleu']:.2f}" if "bleu" in r else ""  # noqa: E731
        return (f"**{xf['value'] / ct2['value']:.2f}x**: {xf['case']} {xf['value']:.1f}{bleu(xf)} / {ct2['case']} "
                f"{ct2['value']:.1f}{bleu(ct2)}")

    named = {r["case"]: r for r in rows}
    if best("xf", False) is None or best("ct2", False) is None:
        return None
    ct2 = {shortlist: best("ct2", shortlist) for shortlist in (True, False)}
    xf = {shortlist: best("xf", shortlist, ct2[shortlist]) for shortlist in (True, False)}
    return (f"| {datetime.date.today().isoformat()} | {header['cpu_flags']} | {cell(xf[True], ct2[True])} "
            f"| {cell(xf[False], ct2[False])} | {cell(named.get('xf int8'), named.get('ct2 int8'))} |")


def parse_args(argv: list[str]):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--path", default=None, help="the checkpoint (default: a random --arch model)")
    ap.add_argument("--source", default=None, help="the lines to translate, or wmt-like (default: Multi30k "
                    "test2016.en)")
    ap.add_argument("--reference", default=None, help="reference translations of --source: each case's sacreBLEU")
    ap.add_argument("--lines", type=int, default=1000, help="the first N lines of --source")
    ap.add_argument("--cpu-lines", type=int, default=0, help="the first N lines in the CPU cases (0: all)")
    ap.add_argument("--cases", default=DEFAULT_CASES, help="comma-separated cases (the module docstring), or kind: "
                    "the CPU kind's row of docs/benchmarks.md (KIND_CASES)")
    ap.add_argument("--against", default=None, help="the case of the ratios (default: the first)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=0, help="torch's and CTranslate2's threads (0: one per core)")
    ap.add_argument("--beam", type=int, default=4)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--max-len-a", type=float, default=None, help="both engines' length limit a x |X| + b (default: "
                    "xf translate's, |X| + 50; a random model's: |X|); --max-len-a 0 --max-len-b N: one cap for all")
    ap.add_argument("--max-len-b", type=int, default=None, help="see --max-len-a")
    ap.add_argument("--shortlist", default=None, help="xf shortlist's file for the shortlist cases")
    ap.add_argument("--arch", default="small", help="the random model's preset")
    ap.add_argument("--vocab-size", type=int, default=37000, help="the made-up words of --source wmt-like")
    ap.add_argument("--json", default=None, help="write the rows here after every measurement")
    ap.add_argument("--isa", choices=sorted(ISA_ENV), default=None,
                    help="run every case as on a CPU with this instruction set only (the module docstring)")
    args = ap.parse_args(argv)
    if args.cases == "kind":
        args.cases = KIND_CASES
        args.against = args.against or "ct2 int8"
    try:
        cases = [parse_case(name.strip()) for name in args.cases.split(",") if name.strip()]
    except ValueError as e:
        ap.error(str(e))
    args.against = args.against or cases[0].name
    if args.against not in [c.name for c in cases]:
        ap.error(f"--against {args.against!r} is not one of --cases")
    return args, cases


def run(argv: list[str]) -> tuple[list[dict], int]:
    """Measure, print the table (and write --json as it goes); (the rows, 1 if a case failed in
    its process, else 0: a case the plan refuses here is skipped, not failed)."""
    args, cases = parse_args(argv)
    if args.isa:  # before torch is imported here: the plan's checks and every child see the same kernels
        os.environ.update(ISA_ENV[args.isa])
    refs = Path(args.reference).read_text(encoding="utf-8").splitlines() if args.reference else None

    def emit(header, best, skipped):
        if args.json:
            found = dict(header, skipped=skipped, rows=result_rows(header, best, args.against, refs))
            Path(args.json).write_text(json.dumps(found, indent=1))

    header, best, skipped = measure(args, cases, emit)
    rows = result_rows(header, best, args.against, refs)
    print(table(header, rows, skipped, args.against), flush=True)
    row = kind_row(header, rows)
    if row:
        print("\nThis CPU kind's row (docs/benchmarks.md: date | CPU flags | best with shortlists | best without | "
              f"defaults, --quantize int8 / CTranslate2 int8):\n{row}", flush=True)
    return rows, int(any(why.startswith("failed:") for why in skipped.values()))


def rows() -> list[dict]:
    """make bench: the default cases on a random small model and Multi30k test2016, ratios
    against CTranslate2 fp32 where installed; XF_BENCH_DECODE adds arguments."""
    import importlib.util

    against = ["--against", "ct2 fp32"] if importlib.util.find_spec("ctranslate2") else []
    return run([*against, *shlex.split(os.environ.get("XF_BENCH_DECODE", ""))])[0]


if __name__ == "__main__":
    if sys.argv[1:] == ["--child"]:
        print(json.dumps(measure_case(json.loads(sys.stdin.read()))))
    else:
        sys.exit(run(sys.argv[1:])[1])
