"""Where xf and CTranslate2 spend a beam step, side by side, on this CPU: one command.

    python bench/profile_engines.py --path CKPT [--source FILE] [--lines 300] [--batches 8,64]
                                    [--precisions int8,fp32] [--ct2-backend nomkl] [--rounds 2]
                                    [--isa avx2] [--json OUT]

1. Thread layouts by batch size, both engines (each case in a fresh process, through
   bench/decode.py's cases; CTranslate2's own translate_batch on xf's export): one search on one
   thread, one search on two threads (torch's intra-op threads; CTranslate2's intra_threads), and
   two searches on one thread each (xf --workers 2; CTranslate2's inter_threads 2). For each:
   sentences/s and milliseconds per beam step (a batch's steps are its longest output's subwords
   plus eos, re-encoded from the text: approximate for both engines alike). Between two batch sizes
   a step's cost splits into a part that does not grow with the batch (per-step overhead: the
   interpreter, dispatch, small operators) and a part per sentence.
2. xf's operators, one search on one thread at the largest batch: torch.profiler's self time
   grouped by kind (int8 products, float products, attention, the beams' cache gathers, top-k,
   log-softmax, copies, elementwise, the rest) and the wall time outside any operator (Python).
   The shares are of the search's wall time without the profiler (timed in a pass before the
   profiled one); "outside" is that wall time less the operators' (the profiler's own cost per
   event is left out of both). CTranslate2's wheel has no profiler (its profiling is a build
   option), so its side is part 1.

Run it with the machine to itself: the figures compare with each other only within one run.
Writes --json (both parts) and prints two tables.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import decode  # noqa: E402

LAYOUTS = {  # name -> (threads, workers)
    "1 thread": (1, 1),
    "2 threads, one search": (2, 1),
    "2 searches, 1 thread each": (2, 2),
}
# operator name -> kind, first match wins (torch.profiler's names for the ops xf's search runs)
KINDS = (
    ("int8 products", r"quantized::|_int_mm|quantize_per|fbgemm|onednn|dynamic_quant"),
    ("float products", r"aten::(addmm|mm|bmm|matmul|linear|baddbmm)$"),
    ("attention", r"scaled_dot_product|aten::_?softmax$"),
    ("cache gathers", r"aten::(index_select|gather|index|take_along_dim)$"),
    ("top-k", r"aten::(topk|sort|argsort|kthvalue)$"),
    ("log-softmax", r"log_softmax"),
    ("the compiled step", r"^xf::compiled_step$"),
    ("copies", r"aten::(copy_|cat|clone|contiguous|to|_to_copy|stack|empty_like|fill_|zero_)$"),
    ("elementwise", r"aten::(add|add_|mul|mul_|div|div_|sub|rsub|where|masked_fill_?|eq|ne|lt|gt|le|ge|"
                    r"logical_\w+|bitwise_\w+|neg|exp|sum|max|min|any|all|relu|gelu|layer_norm|native_layer_norm)$"),
)


def kind_of(name: str) -> str:
    return next((kind for kind, pattern in KINDS if re.search(pattern, name)), "other operators")


def steps_of(outputs: list[str], sources: list[list[int]], batch: int, sp) -> tuple[int, int]:
    """(beam steps, sentence steps) of decoding ``outputs`` in batches of ``batch`` sources,
    longest first: each batch runs until its longest output (re-encoded) and eos; a sentence is in
    its batch for its own output and eos (xf drops a finished sentence from the batch), so the
    sentence steps are the outputs' subwords plus one eos each."""
    order = sorted(range(len(sources)), key=lambda i: -len(sources[i]))
    lengths = [len(ids) + 1 for ids in sp.encode(outputs, out_type=int)]
    return sum(max(lengths[i] for i in order[k: k + batch]) for k in range(0, len(order), batch)), sum(lengths)


def layouts(args, job: dict, sp) -> list[dict]:
    """Part 1: every engine x precision x layout x batch, best of --rounds, in fresh processes."""
    sources = sp.encode(job["lines"], out_type=int)
    # xf's modes of a precision ("int8 compile"); CTranslate2 runs the precision itself, once
    cases = list(dict.fromkeys((engine, precision if engine == "xf" else precision.split()[0], layout, batch)
                               for precision in args.precisions for engine in ("xf", "ct2")
                               for layout in LAYOUTS for batch in args.batches))
    best: dict = {}
    for _ in range(args.rounds):
        for engine, precision, layout, batch in cases:
            threads, workers = LAYOUTS[layout]
            backend = f" {args.ct2_backend}" if engine == "ct2" and args.ct2_backend else ""
            name = f"{engine} {precision}{backend}" + (f" workers{workers}" if workers > 1 else "")
            found = decode.run_child({**job, "case": name, "threads": threads, "batch": batch}, {})
            key = (engine, precision, layout, batch)
            if "error" in found:
                best[key] = dict(error=found["error"])
            elif key not in best or found["seconds"] < best[key].get("seconds", float("inf")):
                best[key] = found
    rows = []
    for (engine, precision, layout, batch), r in best.items():
        row = dict(engine=engine, precision=precision, layout=layout, batch=batch)
        if "error" in r:
            rows.append({**row, "error": r["error"]})
            continue
        steps, sentence_steps = steps_of(r["outputs"], sources, batch, sp)
        searches = LAYOUTS[layout][1]  # two searches side by side: each ran half the steps in the wall time
        rows.append({**row, "sent_per_s": len(r["outputs"]) / r["seconds"], "steps": steps,
                     "sentence_steps": sentence_steps, "seconds": r["seconds"] * searches,
                     "ms_per_step": 1000 * r["seconds"] / steps * searches, "backend": r["backend"]})
    return rows


def split_step_cost(rows: list[dict], small: int, large: int) -> dict:
    """(engine, precision, layout) -> (per-step overhead ms, ms per sentence of a step): a search's
    time is overhead x beam steps + per sentence x sentence steps (``steps_of``: sentences leave
    the batch as they end), solved from its two batch sizes (the same lines: the sentence steps
    nearly equal, the beam steps far apart)."""
    found = {(r["engine"], r["precision"], r["layout"], r["batch"]): r for r in rows if "seconds" in r}
    out = {}
    for (engine, precision, layout, batch), big in found.items():
        little = found.get((engine, precision, layout, small))
        if batch != large or little is None:
            continue
        (n1, t1, s1), (n2, t2, s2) = ((r["steps"], r["sentence_steps"], r["seconds"]) for r in (little, big))
        det = n1 * t2 - n2 * t1
        if det:
            out[(engine, precision, layout)] = (1000 * (s1 * t2 - s2 * t1) / det, 1000 * (n1 * s2 - n2 * s1) / det)
    return out


def profile_child(job: dict) -> dict:
    """Part 2, in this process: xf's search of the lines on one thread under torch.profiler."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.set_num_threads(1)
    case = decode.parse_case(job["case"])
    translate, described, engine = decode.open_xf(case, job)
    translate(job["lines"][: job["batch"]])  # warm-up
    if engine.compiled is not None:  # its kernels are no operators: one range around each call
        for key, run in list(engine.compiled.runners.items()):
            engine.compiled.runners[key] = _ranged(run)
    start = time.perf_counter()
    translate(job["lines"])  # the wall time, without the profiler's own cost per event
    wall = time.perf_counter() - start
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        translate(job["lines"])
    kinds: dict = {}
    other: dict = {}
    for event in prof.key_averages():
        kind = kind_of(event.key)
        seconds, calls = kinds.get(kind, (0.0, 0))
        kinds[kind] = (seconds + event.self_cpu_time_total / 1e6, calls + event.count)
        if kind == "other operators":
            other[event.key] = event.self_cpu_time_total / 1e6
    inside = sum(s for s, _ in kinds.values())
    kinds["outside operators (Python)"] = (max(0.0, wall - inside), 0)
    engine.close()
    top_other = sorted(other.items(), key=lambda kv: -kv[1])[:6]
    return dict(wall=wall, kinds=kinds, backend=described, top_other=top_other)


def _ranged(run):
    """``run`` (a compiled package's runner) inside a profiler range named xf::compiled_step."""
    import torch

    def call(*args):
        with torch.profiler.record_function("xf::compiled_step"):
            return run(*args)
    return call


def profile(args, job: dict) -> dict:
    """Part 2 for each precision, in fresh processes."""
    out = {}
    for precision in args.precisions:
        child = {**job, "case": f"xf {precision}", "threads": 1, "batch": max(args.batches)}
        proc = subprocess.run([sys.executable, __file__, "--child-profile"], input=json.dumps(child),
                              capture_output=True, text=True)
        if proc.returncode:
            out[precision] = dict(error=(proc.stderr.strip().splitlines() or ["failed"])[-1])
        else:
            out[precision] = json.loads(proc.stdout.splitlines()[-1])
    return out


def tables(header: dict, rows: list[dict], split: dict, profiles: dict, small: int, large: int) -> str:
    out = [f"{header['checkpoint']}, {header['source']} ({header['lines']} lines), beam {header['beam']}; "
           f"CPU flags: {header['cpu_flags']}; torch {header['torch']}", f"Both engines: {header['length_rule']}", "",
           "| engine | layout | batch | sent/s | ms per beam step |", "|---|---|---|---|---|"]
    for r in rows:
        label = f"{'xf' if r['engine'] == 'xf' else 'CTranslate2'} {r['precision']}"
        cells = (f"failed: {r['error']} | |" if "error" in r else f"{r['sent_per_s']:.1f} | {r['ms_per_step']:.2f} |")
        out.append(f"| {label} | {r['layout']} | {r['batch']} | {cells}")
    out += ["", f"A beam step's cost between batches of {small} and {large}: overhead + batch x per sentence",
            "", "| engine | layout | per-step overhead, ms | ms per sentence of a step |", "|---|---|---|---|"]
    for (engine, precision, layout), (overhead, per) in split.items():
        out.append(f"| {'xf' if engine == 'xf' else 'CTranslate2'} {precision} | {layout} | {overhead:.2f} | {per:.3f} |")
    for precision, p in profiles.items():
        if "error" in p:
            out += ["", f"xf {precision} operators: failed: {p['error']}"]
            continue
        out += ["", f"xf {precision}, one search on one thread, batch {large}: {p['wall']:.2f} s "
                f"({p['backend']})", "", "| kind | share | seconds | calls |", "|---|---|---|---|"]
        for kind, (seconds, calls) in sorted(p["kinds"].items(), key=lambda kv: -kv[1][0]):
            out.append(f"| {kind} | {100 * seconds / p['wall']:.1f}% | {seconds:.2f} | {calls or ''} |")
        out.append("other operators, the largest: " + ", ".join(f"{name} {s:.2f} s" for name, s in p["top_other"]))
    return "\n".join(out)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--path", required=True, help="the checkpoint (a trained one: outputs end)")
    ap.add_argument("--source", default=str(decode.MULTI30K / "test2016.en"))
    ap.add_argument("--lines", type=int, default=300)
    ap.add_argument("--batches", default="8,64", help="two or more batch sizes, comma-separated")
    ap.add_argument("--precisions", default="int8,fp32", help="comma-separated: int8, fp32, bf16, and xf's modes "
                    "of them (\"int8 compile\": xf's compiled step; CTranslate2 runs the first word)")
    ap.add_argument("--ct2-backend", default="", help="bench/decode.py's words for CTranslate2's backend, e.g. "
                    "\"nomkl\" (oneDNN where it would pick MKL: an Intel CPU) or \"nomkl avx512\"")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--beam", type=int, default=4)
    ap.add_argument("--isa", choices=sorted(decode.ISA_ENV), default=None, help="as bench/decode.py --isa")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    args.batches = sorted({int(b) for b in args.batches.split(",")})
    args.precisions = [p.strip() for p in args.precisions.split(",") if p.strip()]
    if len(args.batches) < 2 or min(args.batches) < 1:
        ap.error("--batches: two or more sizes, each at least 1")
    if args.isa:
        os.environ.update(decode.ISA_ENV[args.isa])
    from xformer_cli.model.checkpoint import load_checkpoint
    from xformer_cli.text.vocab import load_sentencepiece

    sp = load_sentencepiece(load_checkpoint(args.path)["spm_model"], args.path)
    with tempfile.TemporaryDirectory(prefix="xf-profile-engines-") as tmp:
        settings = argparse.Namespace(path=args.path, source=args.source, lines=args.lines, beam=args.beam,
                                      batch=max(args.batches), threads=1, cpu_lines=0, shortlist=None, isa=args.isa,
                                      arch="small", vocab_size=0, max_len_a=None, max_len_b=None)
        job = decode.prepare(settings, Path(tmp), [decode.parse_case("ct2 fp32")])
        header = job.pop("header")
        rows = layouts(args, job, sp)
        profiles = profile(args, job)
    split = split_step_cost(rows, args.batches[0], args.batches[-1])
    if args.json:
        Path(args.json).write_text(json.dumps(dict(header=header, rows=rows, profiles=profiles,
                                                   split={" / ".join(k): v for k, v in split.items()}), indent=1))
    print(tables(header, rows, split, profiles, args.batches[0], args.batches[-1]), flush=True)
    return int(any("error" in r for r in rows) or any("error" in p for p in profiles.values()))


if __name__ == "__main__":
    if sys.argv[1:] == ["--child-profile"]:
        print(json.dumps(profile_child(json.loads(sys.stdin.read()))))
    else:
        sys.exit(main(sys.argv[1:]))
