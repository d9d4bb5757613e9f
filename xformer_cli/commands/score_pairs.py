"""xf score-pairs: the model's log-probability of given source-target pairs, one line per pair.

Each pair is scored by forced decoding (``decode/pair_scoring.py``): the summed log-probability of the
target's subwords and its eos, and its mean per subword; with --reverse-path also the reverse
model's of the source given the target, and the dual conditional cross-entropy that filters
parallel data (Junczys-Dowmunt, 2018). Pairs are read ``buffer_size`` at a time, sorted by
length into batches, and written back in input order.

What a pair may hold: the two files must have as many lines (checked before anything is
scored); an empty or whitespace-only line is the empty sentence (its side is eos alone), scored
like any other and counted; invalid UTF-8 is replaced by U+FFFD and counted, as xf translate
does; a line longer than the model's max_positions - 1 subwords is an error naming its file and
line, never cut, since a cut sentence's score is not the pair's.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import sys
import time
from dataclasses import dataclass
from typing import IO, Iterator, Optional

from ..base.console import invalid_utf8_warning, print_summary, stderr_console, warn
from ..base.errors import ConfigError, XfError
from ..base.fileio import atomic_write
from ..decode.engines import XfEngine
from ..decode.pair_scoring import PairScore, dual_conditional_cross_entropy, max_length, score_pairs as score
from ..decode.plan import Machine, plan_decoding
from ..settings.options import ScorePairsOptions
from ..text.vocab import decode_line, encode_target


# -- reading -------------------------------------------------------------------------------------
@dataclass
class Side:
    """One input file and what was found in it."""

    path: str
    empty: int = 0  # empty or whitespace-only lines
    first_empty: int = 0
    invalid_utf8: int = 0
    first_invalid: int = 0
    subwords: int = 0  # of the forward model's encoding, eos not counted


def count_lines(path: str) -> int:
    """The lines of ``path`` as iterating over it counts them (a last line without LF included)."""
    lines, last = 0, b"\n"
    try:
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                lines += chunk.count(b"\n")
                last = chunk[-1:]
    except FileNotFoundError:
        raise XfError(f"{path}: input file not found") from None
    except OSError as e:
        raise XfError(f"{path}: cannot read input: {e.strerror}") from None
    return lines + (last != b"\n")


def read_pairs(source: IO[bytes], target: IO[bytes], size: int) -> Iterator[list[tuple[bytes, bytes]]]:
    """The pairs of lines of the two files, ``size`` at a time."""
    pairs = zip(source, target)
    return iter(lambda: list(itertools.islice(pairs, size)), [])


def decode_lines(raws: list[bytes], first_line: int, side: Side) -> list[str]:
    """The text of each line (empty for a whitespace-only line); invalid UTF-8 replaced and counted."""
    out = []
    for i, raw in enumerate(raws):
        line_no = first_line + i
        text = decode_line(raw, side.path, line_no, "skip")
        if text is None:
            text = decode_line(raw, side.path, line_no, "replace")
            side.invalid_utf8 += 1
            side.first_invalid = side.first_invalid or line_no
        if not text.strip():
            text = ""
            side.empty += 1
            side.first_empty = side.first_empty or line_no
        out.append(text)
    return out


def encode_lines(encode, texts: list[str], first_line: int, path: str, limit: int) -> list[list[int]]:
    """The subword ids of each line (``encode(texts)``: one side's encoding); a line over
    ``limit`` subwords is an error naming it."""
    pieces = encode(texts)
    for i, ids in enumerate(pieces):
        if len(ids) > limit:
            raise XfError(f"{path}:{first_line + i}: {len(ids)} subwords, more than the model's {limit} "
                          "(max_positions - 1); xf score-pairs does not cut a sentence: drop or split that pair")
    return pieces


# -- writing -------------------------------------------------------------------------------------
def format_pair(line: int, forward: PairScore, reverse: Optional[PairScore], options: ScorePairsOptions) -> str:
    """One output line: a JSON record, or one number (the dual score with a reverse model)."""
    dual = None
    if reverse is not None:
        dual = dual_conditional_cross_entropy(-forward.mean, -reverse.mean)
    if options.output_format == "text":
        value = dual if dual is not None else forward.mean if options.normalize == "mean" else forward.score
        return f"{value:.6f}\n"
    record = {"line": line, "score": round(forward.score, 6), "tokens": forward.tokens, "mean": round(forward.mean, 6)}
    if reverse is not None:
        record.update(reverse_score=round(reverse.score, 6), reverse_tokens=reverse.tokens,
                      reverse_mean=round(reverse.mean, 6), h_forward=round(-forward.mean, 6),
                      h_reverse=round(-reverse.mean, 6), dual=round(dual, 6))
    return json.dumps(record) + "\n"


# -- the command ---------------------------------------------------------------------------------
def score_pairs(options: ScorePairsOptions) -> None:
    """Score the pairs of --source and --target, written to the output (stdout or --output)."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    total, target_lines = count_lines(options.source), count_lines(options.target)
    if target_lines != total:
        raise XfError(f"{options.target}: {target_lines:,} lines, but {options.source} has {total:,}: "
                      "xf score-pairs needs one target line per source line")
    plan = plan_decoding(options, Machine.here())
    directions = [XfEngine.open(path, plan) for path in (options.path, options.reverse_path) if path]
    # each direction's (source encoding, target encoding): the forward model's sources start with
    # --target-lang's tag when it is multilingual; a reverse model would need the source's
    # language as its target, which no option names: a multilingual one is refused
    if len(directions) > 1 and directions[1][0].facts.multilingual:
        raise ConfigError(f"--reverse-path {options.reverse_path[0]}: a multilingual model; the reverse score needs a "
                          "bilingual target->source model")
    forward = directions[0][0].facts.vocabulary(directions[0][1], options.target_lang, options.path[0])
    encoders = [(lambda texts, v=v: v.encode(texts, out_type=int), lambda texts, sp=sp: encode_target(sp, texts, out_type=int))
                for v, (_, sp) in zip([forward, *[sp for _, sp in directions[1:]]], directions)]
    batch = dict(max_tokens=options.max_tokens or None, max_sentences=None if options.max_tokens else options.batch_size)

    console = stderr_console()
    src_side, tgt_side = Side(options.source), Side(options.target)
    sums, tokens, dual_sum, lines = [0.0] * len(directions), [0] * len(directions), 0.0, 0
    start = time.perf_counter()
    # --output is written atomically: nothing half-written if scoring fails
    stdout = options.output in (None, "-")
    output = contextlib.nullcontext(sys.stdout.buffer) if stdout else atomic_write(options.output, "wb")
    with open(options.source, "rb") as source, open(options.target, "rb") as target, output as sink:
        progress = Progress(
            TextColumn("scoring"), BarColumn(), TextColumn("{task.completed:,} pairs"),
            TextColumn("{task.fields[rate]:.1f} pairs/s"), TimeElapsedColumn(), TimeRemainingColumn(),
            console=console, transient=True, disable=options.quiet or not console.is_terminal,
        )
        with progress:
            task = progress.add_task("score-pairs", total=total, rate=0.0)
            for pairs in read_pairs(source, target, options.buffer_size):
                src_texts = decode_lines([s for s, _ in pairs], lines + 1, src_side)
                tgt_texts = decode_lines([t for _, t in pairs], lines + 1, tgt_side)
                found = []
                sides = [(src_texts, options.source), (tgt_texts, options.target)]
                for d, ((engine, _), (source_side, target_side)) in enumerate(zip(directions, encoders)):
                    limit = max_length(engine.models)  # forward, then target -> source
                    (a, a_path), (b, b_path) = sides if d == 0 else sides[::-1]
                    xs = encode_lines(source_side, a, lines + 1, a_path, limit)
                    ys = encode_lines(target_side, b, lines + 1, b_path, limit)
                    if d == 0:
                        src_side.subwords += sum(map(len, xs))
                        tgt_side.subwords += sum(map(len, ys))
                    found.append(score(engine.models, xs, ys, **batch))
                    sums[d] += sum(p.score for p in found[d])
                    tokens[d] += sum(p.tokens for p in found[d])
                out = []
                for i, forward in enumerate(found[0]):
                    reverse = found[1][i] if len(found) > 1 else None
                    if reverse is not None:
                        dual_sum += dual_conditional_cross_entropy(-forward.mean, -reverse.mean)
                    out.append(format_pair(lines + i + 1, forward, reverse, options))
                sink.write("".join(out).encode("utf-8"))
                sink.flush()
                lines += len(pairs)
                progress.update(task, completed=lines, rate=lines / max(time.perf_counter() - start, 1e-9))
    elapsed = time.perf_counter() - start

    for side in (src_side, tgt_side):
        invalid_utf8_warning(str(side.path), side.invalid_utf8, side.first_invalid)
        if side.empty:
            warn(f"{side.path}: {side.empty} empty line(s), scored as the empty sentence (first: line "
                  f"{side.first_empty})")
    if not options.quiet:
        _summary(console, options, lines, src_side, tgt_side, elapsed, sums, tokens, dual_sum)


def _summary(console, options: ScorePairsOptions, lines: int, src_side: Side, tgt_side: Side, elapsed: float,
             sums: list[float], tokens: list[int], dual_sum: float) -> None:
    per_token = lambda d: f"{sums[d] / tokens[d]:.4f}" if tokens[d] else "-"  # noqa: E731
    rows = [
        ("pairs", f"{lines:,}"),
        ("empty source / target lines", f"{src_side.empty:,} / {tgt_side.empty:,}"),
        ("source / target subwords", f"{src_side.subwords:,} / {tgt_side.subwords:,}"),
        ("time", f"{elapsed:.2f} s"),
        ("pairs/s", f"{lines / max(elapsed, 1e-9):,.1f}"),
        ("log-probability per target subword", per_token(0)),
    ]
    if len(sums) > 1:
        rows += [("reverse: per source subword", per_token(1)),
                 ("mean dual score (lower is better)", f"{dual_sum / lines:.4f}" if lines else "-")]
    if src_side.invalid_utf8 or tgt_side.invalid_utf8:
        rows.append(("invalid UTF-8 source / target lines", f"{src_side.invalid_utf8:,} / {tgt_side.invalid_utf8:,}"))
    models = f"{len(options.path)} model(s)" + (f", reverse {len(options.reverse_path)}" if options.reverse_path else "")
    print_summary(console, f"xf score-pairs ({models})", rows, values="right")
