"""Profile xf's beam search with torch.profiler and print the top operators by self CPU time.

    python bench/profile_decode.py CHECKPOINT SOURCE [--lines 300] [--beam 4] [--batch 64]
                                   [--threads 0] [--quantize none|int8] [--compile] [--shortlist FILE]
                                   [--rows 25]

The search is the one ``xf translate`` runs (``decode.translate.open_engine`` then ``engine.search``) on
the first --lines lines of SOURCE, in batches of --batch sentences, longest first, after one
warm-up batch (with --compile, the batches run once more first, so that every graph is compiled
before the profile). Operators are grouped by name, with their call counts: two trees profiled
on the same input compare by both (the counts do not depend on the machine's load). Writes
nothing.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from xformer_cli.data.batching import batch_by_size  # noqa: E402
from xformer_cli.decode.translate import open_engine  # noqa: E402
from xformer_cli.settings.options import TranslateOptions  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint")
    parser.add_argument("source")
    parser.add_argument("--lines", type=int, default=300)
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--quantize", default="none")
    parser.add_argument("--compile", action="store_true", help="xf translate --compile")
    parser.add_argument("--shortlist", default=None, help="xf translate --shortlist FILE")
    parser.add_argument("--rows", type=int, default=25)
    args = parser.parse_args()
    options = TranslateOptions(path=(args.checkpoint,), beam_size=args.beam, device="cpu", threads=args.threads,
                               quantize=args.quantize, compile=args.compile, shortlist=args.shortlist)
    engine, sp, _ = open_engine(options)
    lines = Path(args.source).read_text(encoding="utf-8").splitlines()[: args.lines]
    pieces = sp.encode(lines, out_type=int)
    batches = [[pieces[i] for i in b.tolist()]
               for b in batch_by_size([len(p) for p in pieces], max_sentences=args.batch, longest_first=True)]
    for batch in batches if args.compile else batches[:1]:  # warm-up
        engine.search(batch, options)
    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for batch in batches:
            engine.search(batch, options)
    seconds = time.perf_counter() - start
    print(f"{len(lines)} lines in {seconds:.2f} s under the profiler ({len(lines) / seconds:.1f} sent/s), "
          f"{torch.get_num_threads()} thread(s)")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows))


if __name__ == "__main__":
    main()
