"""The filter of recipes/multi30k/distill.sh: keep the distilled pairs the teacher is sure enough of.

    python distill_filter.py SCORES SOURCE TARGET PREFIX SRC TGT DROP [MIN_MEAN]

SCORES is `xf score-pairs` jsonl of SOURCE -> TARGET (the teacher's translations), one record a
pair in order. Dropped: the fraction DROP (0 to 1) of the pairs of lowest per-token log-prob
(`mean`; ties: the later line first), the pairs whose mean is below MIN_MEAN (default -inf), and
the pairs whose target is empty. The kept pairs, in their order, go to PREFIX.SRC and PREFIX.TGT,
and the counts to PREFIX.json, written last: it marks the step as done.
"""

import json
import math
import os
import sys

from xformer_cli.base.errors import XfError
from xformer_cli.base.fileio import atomic_write_text
from xformer_cli.base.json_input import parse_json


def read_lines(path: str) -> list[str]:
    try:
        with open(path, encoding="utf-8", newline="\n") as f:
            return f.read().split("\n")[:-1] if os.path.getsize(path) else []
    except OSError as e:
        raise XfError(f"{path}: cannot read ({e.strerror})") from None
    except UnicodeDecodeError as e:
        raise XfError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None


def settings(drop: str, min_mean: str) -> tuple[float, float]:
    """(the fraction to drop, the cut) of DROP and MIN_MEAN, which distill.sh passes from its
    environment: a value that is not one is a one-line error naming the variable."""
    try:
        fraction = float(drop)
    except ValueError:
        fraction = math.nan
    if not 0 <= fraction <= 1:
        raise XfError(f"DROP (distill.sh's FILTER_DROP), the fraction to drop, must be in [0, 1], not {drop!r}")
    try:
        cut = float(min_mean)
    except ValueError:
        cut = math.nan
    if math.isnan(cut) or cut == math.inf:  # +inf would drop every pair
        raise XfError(f"MIN_MEAN (distill.sh's FILTER_MIN_MEAN) must be a number or -inf, not {min_mean!r}")
    return fraction, cut


def read_means(path: str) -> list[float]:
    """The per-token log-prob ('mean') of each record of ``path``, xf score-pairs' jsonl."""
    try:
        with open(path, "rb") as f:
            lines = f.read().split(b"\n")
    except OSError as e:
        raise XfError(f"{path}: cannot read ({e.strerror})") from None
    mean = []
    for number, line in enumerate(lines[:-1] if lines[-1] == b"" else lines, 1):
        record = parse_json(line.decode("utf-8", "replace"), f"{path}:{number}", hint="not a record of xf score-pairs")
        value = record.get("mean") if isinstance(record, dict) else None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise XfError(f"{path}:{number}: no number 'mean' (not a record of xf score-pairs)")
        mean.append(float(value))
    return mean


def main(scores: str, source: str, target: str, prefix: str, src: str, tgt: str, drop: str,
         min_mean: str = "-inf") -> None:
    fraction, cut = settings(drop, min_mean)
    mean = read_means(scores)
    pairs = {src: read_lines(source), tgt: read_lines(target)}
    for side, lines in pairs.items():
        if len(lines) != len(mean):
            raise XfError(f"{scores} scores {len(mean)} pairs but {source if side == src else target} has "
                          f"{len(lines)} lines")
    empty = {i for i, line in enumerate(pairs[tgt]) if not line.strip()}
    lowest = sorted(range(len(mean)), key=lambda i: (mean[i], -i))[:round(fraction * len(mean))]
    low = ({i for i, m in enumerate(mean) if m < cut} | set(lowest)) - empty
    keep = [i for i in range(len(mean)) if i not in empty and i not in low]
    for side, lines in pairs.items():
        atomic_write_text(f"{prefix}.{side}", "".join(lines[i] + "\n" for i in keep))
    kept_mean = [mean[i] for i in keep]
    report = {"pairs": len(mean), "kept": len(keep), "drop": fraction, "min_mean": cut,
              "dropped_low_log_prob": len(low), "dropped_empty": len(empty),
              "lowest_mean_kept": min(kept_mean) if kept_mean else None}
    atomic_write_text(f"{prefix}.json", json.dumps(report, indent=1))
    print(json.dumps(report), file=sys.stderr)


if __name__ == "__main__":
    if len(sys.argv) not in (8, 9):
        sys.exit(__doc__)
    try:
        main(*sys.argv[1:])
    except XfError as e:  # one line, as xf's own errors, and nothing written
        sys.exit(f"error: {e}")
