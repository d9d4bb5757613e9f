"""xf shortlist: a vocabulary shortlist for ``xf translate --shortlist`` from a data directory's
training pairs (the frequent target pieces plus IBM Model 1's top-k per source piece;
``decode/shortlist.py`` holds the method and the file format)."""

from __future__ import annotations

import time
from pathlib import Path

from ..base.console import print_summary, stderr_console
from ..base.errors import XfError
from ..data.dataset import DataDir, read_rows
from ..decode.shortlist import build_shortlist, candidate_set_size
from ..model.checkpoint import spm_digest, vocab_digest
from ..settings.options import ShortlistOptions


def _sentences(array) -> list:
    tokens = read_rows(array.tokens, slice(0, len(array.tokens)))
    ends = (array.offsets + array.sizes).tolist()
    return [tokens[start:end] for start, end in zip(array.offsets.tolist(), ends)]


def shortlist(options: ShortlistOptions) -> None:
    """Write the shortlist of options.data's training pairs to options.output."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    output = Path(options.output)
    data = DataDir.open(options.data)
    start = time.perf_counter()
    train = data.split("train")
    if len(train) == 0:
        raise XfError(f"{data.path}: the train split is empty")
    src, tgt = _sentences(train.src), _sentences(train.tgt)
    spm = data.spm_model_bytes

    console = stderr_console()
    with Progress(TextColumn("IBM Model 1 EM"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=console, transient=True, disable=not console.is_terminal) as progress:
        task = progress.add_task("em", total=options.em_iterations)
        result = build_shortlist(src, tgt, data.vocab_size, vocab_digest(spm), options.frequent, options.per_source,
                                 options.em_iterations, spm_digest(spm),
                                 on_iteration=lambda it: progress.update(task, completed=it))
    valid_name = next((s for s in data.splits if s.startswith("valid")), None)
    held_out = _sentences(data.split(valid_name).src) if valid_name else src[:1000]
    result.save(output)
    elapsed = time.perf_counter() - start
    print_summary(console, "xf shortlist", [
        ("pairs", f"{len(train):,}"),
        ("vocabulary", f"{data.vocab_size:,}"),
        ("frequent / per source", f"{len(result.frequent):,} / {result.k:,}"),
        ("EM iterations", f"{options.em_iterations}"),
        (f"candidates per batch of 64 ({valid_name or 'train'})", f"{candidate_set_size(result, held_out):,.0f}"),
        ("time", f"{elapsed:.1f} s"),
        ("written", str(output)),
    ], values="right")
