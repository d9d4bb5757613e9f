"""xf translate --compile against eager decoding on one checkpoint: speed after compilation,
compile time from an empty and from a warm cache, BLEU and identical outputs.

    python bench/bench_decode_compile.py CHECKPOINT SOURCE REFERENCE [--lines 1000] [--beam 4]
                                         [--batch 64] [--threads 0] [--rounds 3]
                                         [--precision fp32|bf16] [--quantize none|int8]
                                         [--mode auto|aot|jit]

Two processes share one fresh xf cache (XDG_CACHE_HOME: the compiled step's file,
compiling.CompileCache), each with an inductor cache directory of its own
(TORCHINDUCTOR_CACHE_DIR), so that the second finds only what xf kept: the first compiles from
nothing ("cold"), then times eager and compiled decoding of the same lines alternately, --rounds
times each, in one process (the figures a busy machine can compare); the second opens the model
again and compiles from xf's cache file ("warm"). With --quantize int8 the eager engine is
torch.ao's (--int8-engine auto) and the compiled one xf's oneDNN int8 layers, so outputs are
compared by BLEU, not expected identical. A pass over
the lines with the compiled engine first compiles every graph the test set needs; its calls that
compiled a graph are its compile seconds (``search.CompiledStep``). Speeds are sentences per
second of ``translation.translate_buffer`` (sentencepiece, sorting and search, as xf translate
runs them; loading excluded). Prints one JSON object per process and a table; writes nothing
else (the cache directory is removed). --mode is xf translate's --compile-mode: aot (auto's
choice without int8) builds AOTInductor packages in the first process and loads them in the
second ("warm": its compile seconds are the loading), jit is torch.compile with its cache file.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def run(args, rounds: int) -> dict:
    """In this process: the compiled engine's first pass (compiling), then ``rounds`` alternating
    timed passes of eager and compiled decoding."""
    import torch

    import dataclasses

    from xformer_cli.options import TranslateOptions
    from xformer_cli.translation import Stats, open_engine, translate_buffer

    lines = Path(args.source).read_text(encoding="utf-8").splitlines()[: args.lines]
    options = TranslateOptions(path=(args.checkpoint,), beam_size=args.beam, batch_size=args.batch, device="cpu",
                               threads=args.threads, precision=args.precision, quantize=args.quantize)
    eager, sp, _ = open_engine(options)
    compiled, _, _ = open_engine(dataclasses.replace(options, compile=True, compile_mode=args.mode))

    def translate(engine) -> tuple[list[str], float]:
        start = time.perf_counter()
        out = translate_buffer(engine, sp, lines, 0, options, Stats())
        return [o.rstrip("\n") for o in out], time.perf_counter() - start

    outputs, first = translate(compiled)
    step = compiled.compiled
    loaded = step.loaded > 0 if hasattr(step, "loaded") else step.cache.loaded  # aot: packages loaded
    result = dict(threads=torch.get_num_threads(), first_pass_seconds=first, cache_loaded=loaded, mode=type(step).__name__,
                  compile_seconds=compiled.compiled.compile_seconds, graphs=compiled.compiled.graphs, rounds=[],
                  int8_engine=eager.int8_engine)
    for _ in range(rounds):
        eager_out, eager_s = translate(eager)
        compiled_out, compiled_s = translate(compiled)
        result["rounds"].append(dict(eager=len(lines) / eager_s, compiled=len(lines) / compiled_s))
    result["graphs_after"] = compiled.compiled.graphs
    if rounds:
        result["outputs"] = dict(eager=eager_out, compiled=compiled_out)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint")
    parser.add_argument("source")
    parser.add_argument("reference")
    parser.add_argument("--lines", type=int, default=1000)
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--precision", default="fp32", choices=("fp32", "bf16"))
    parser.add_argument("--quantize", default="none", choices=("none", "int8"))
    parser.add_argument("--mode", default="auto", choices=("auto", "aot", "jit"))
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)  # rounds, in a child process
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(run(args, args.child)))
        return

    import sacrebleu

    base = [sys.executable, __file__, args.checkpoint, args.source, args.reference, "--lines", str(args.lines),
            "--beam", str(args.beam), "--batch", str(args.batch), "--threads", str(args.threads),
            "--precision", args.precision, "--quantize", args.quantize, "--mode", args.mode]
    with tempfile.TemporaryDirectory(prefix="xf-compile-cache-") as cache:
        found = {}
        for name, rounds in (("cold", args.rounds), ("warm", 0)):
            env = {**os.environ, "XDG_CACHE_HOME": f"{cache}/xdg", "TORCHINDUCTOR_CACHE_DIR": f"{cache}/inductor-{name}"}
            proc = subprocess.run([*base, "--child", str(rounds)], env=env, capture_output=True, text=True)
            if proc.returncode:
                sys.exit(f"bench_decode_compile ({name} cache) failed:\n{proc.stderr[-4000:]}")
            found[name] = json.loads(proc.stdout.splitlines()[-1])
            summary = {k: v for k, v in found[name].items() if k != "outputs"}
            print(f"{name} cache: {json.dumps(summary)}", file=sys.stderr, flush=True)  # as it comes: runs are long
    cold, warm = found["cold"], found["warm"]
    refs = Path(args.reference).read_text(encoding="utf-8").splitlines()[: args.lines]
    outputs = cold.pop("outputs")
    bleu = {k: sacrebleu.corpus_bleu(v, [refs]).score for k, v in outputs.items()}
    same = sum(a == b for a, b in zip(outputs["eager"], outputs["compiled"]))
    load = os.getloadavg()[0]
    print(json.dumps(dict(cold=cold, warm=warm, bleu=bleu, identical=same, lines=len(refs), load=load)))
    print(f"{args.checkpoint}, {len(refs)} lines, beam {args.beam}, batch {args.batch}, {cold['threads']} thread(s), "
          f"{cold['mode']}, {args.precision}{', int8 (eager: ' + str(cold['int8_engine']) + ')' if args.quantize == 'int8' else ''}, "
          f"load average {load:.1f} at the end")
    for i, r in enumerate(cold["rounds"], 1):
        print(f"round {i}: eager {r['eager']:.1f} sent/s, compiled {r['compiled']:.1f} sent/s "
              f"(ratio {r['compiled'] / r['eager']:.2f})")
    print(f"compile: cold {cold['compile_seconds']:.1f} s ({cold['graphs']} graphs; {cold['graphs_after']} after the "
          f"rounds), warm {warm['compile_seconds']:.1f} s ({warm['graphs']} graphs, xf's cache file "
          f"{'loaded' if warm['cache_loaded'] else 'NOT loaded'})")
    print(f"BLEU eager {bleu['eager']:.2f}, compiled {bleu['compiled']:.2f}; {same}/{len(refs)} outputs identical")


if __name__ == "__main__":
    main()
