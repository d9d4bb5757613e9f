"""xf translate --compile against eager decoding on one checkpoint: speed after compilation,
compile time from an empty and from a warm inductor cache, BLEU and identical outputs.

    python bench/bench_decode_compile.py CHECKPOINT SOURCE REFERENCE [--lines 1000] [--beam 4]
                                         [--batch 64] [--threads 0] [--rounds 3]

Two processes share one fresh inductor cache directory (TORCHINDUCTOR_CACHE_DIR): the first
compiles from an empty cache ("cold"), then times eager and compiled decoding of the same lines
alternately, --rounds times each, in one process (the figures a busy machine can compare); the
second opens the model again and compiles from the cache the first left ("warm"). A pass over
the lines with the compiled engine first compiles every graph the test set needs; its calls that
compiled a graph are its compile seconds (``search.CompiledStep``). Speeds are sentences per
second of ``translation.translate_buffer`` (sentencepiece, sorting and search, as xf translate
runs them; loading excluded). Prints one JSON object per process and a table; writes nothing
else (the cache directory is removed).
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

    from xformer_cli.engines import XfEngine
    from xformer_cli.options import TranslateOptions
    from xformer_cli.search import CompiledStep
    from xformer_cli.translation import Stats, open_engine, translate_buffer

    lines = Path(args.source).read_text(encoding="utf-8").splitlines()[: args.lines]
    options = TranslateOptions(path=(args.checkpoint,), beam_size=args.beam, batch_size=args.batch, device="cpu",
                               threads=args.threads)
    eager, sp, device = open_engine(options)
    compiled = XfEngine(eager.models, device, compiled=CompiledStep())

    def translate(engine) -> tuple[list[str], float]:
        start = time.perf_counter()
        out = translate_buffer(engine, sp, lines, 0, options, Stats())
        return [o.rstrip("\n") for o in out], time.perf_counter() - start

    outputs, first = translate(compiled)
    result = dict(threads=torch.get_num_threads(), first_pass_seconds=first,
                  compile_seconds=compiled.compiled.compile_seconds, graphs=compiled.compiled.graphs, rounds=[])
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
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)  # rounds, in a child process
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(run(args, args.child)))
        return

    import sacrebleu

    base = [sys.executable, __file__, args.checkpoint, args.source, args.reference, "--lines", str(args.lines),
            "--beam", str(args.beam), "--batch", str(args.batch), "--threads", str(args.threads)]
    with tempfile.TemporaryDirectory(prefix="xf-inductor-") as cache:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
        found = {}
        for name, rounds in (("cold", args.rounds), ("warm", 0)):
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
          f"load average {load:.1f} at the end")
    for i, r in enumerate(cold["rounds"], 1):
        print(f"round {i}: eager {r['eager']:.1f} sent/s, compiled {r['compiled']:.1f} sent/s "
              f"(ratio {r['compiled'] / r['eager']:.2f})")
    print(f"compile: cold {cold['compile_seconds']:.1f} s ({cold['graphs']} graphs; {cold['graphs_after']} after the "
          f"rounds), warm {warm['compile_seconds']:.1f} s ({warm['graphs']} graphs)")
    print(f"BLEU eager {bleu['eager']:.2f}, compiled {bleu['compiled']:.2f}; {same}/{len(refs)} outputs identical")


if __name__ == "__main__":
    main()
