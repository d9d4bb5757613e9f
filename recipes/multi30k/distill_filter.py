"""The filter of recipes/multi30k/distill.sh: keep the distilled pairs the teacher is sure enough of.

    python distill_filter.py SCORES SOURCE TARGET PREFIX SRC TGT DROP [MIN_MEAN]

SCORES is `xf score-pairs` jsonl of SOURCE -> TARGET (the teacher's translations), one record a
pair in order. Dropped: the fraction DROP (0 to 1) of the pairs of lowest per-token log-prob
(`mean`; ties: the later line first), the pairs whose mean is below MIN_MEAN (default -inf), and
the pairs whose target is empty. The kept pairs, in their order, go to PREFIX.SRC and PREFIX.TGT,
and the counts to PREFIX.json, written last: it marks the step as done.
"""

import json
import os
import sys


def read_lines(path: str) -> list[str]:
    with open(path, encoding="utf-8", newline="\n") as f:
        return f.read().split("\n")[:-1] if os.path.getsize(path) else []


def main(scores: str, source: str, target: str, prefix: str, src: str, tgt: str, drop: str,
         min_mean: str = "-inf") -> None:
    fraction, cut = float(drop), float(min_mean)
    if not 0 <= fraction <= 1:
        sys.exit(f"error: the fraction to drop must be in [0, 1], not {drop}")
    with open(scores, encoding="utf-8") as f:
        mean = [json.loads(line)["mean"] for line in f]
    pairs = {src: read_lines(source), tgt: read_lines(target)}
    for side, lines in pairs.items():
        if len(lines) != len(mean):
            sys.exit(f"error: {scores} scores {len(mean)} pairs but {source if side == src else target} has {len(lines)} lines")
    empty = {i for i, line in enumerate(pairs[tgt]) if not line.strip()}
    lowest = sorted(range(len(mean)), key=lambda i: (mean[i], -i))[:round(fraction * len(mean))]
    low = ({i for i, m in enumerate(mean) if m < cut} | set(lowest)) - empty
    keep = [i for i in range(len(mean)) if i not in empty and i not in low]
    for side, lines in pairs.items():
        with open(f"{prefix}.{side}.tmp", "w", encoding="utf-8", newline="\n") as f:
            f.writelines(lines[i] + "\n" for i in keep)
    for side in pairs:
        os.replace(f"{prefix}.{side}.tmp", f"{prefix}.{side}")
    kept_mean = [mean[i] for i in keep]
    report = {"pairs": len(mean), "kept": len(keep), "drop": fraction, "min_mean": cut,
              "dropped_low_log_prob": len(low), "dropped_empty": len(empty),
              "lowest_mean_kept": min(kept_mean) if kept_mean else None}
    with open(f"{prefix}.json.tmp", "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1)
    os.replace(f"{prefix}.json.tmp", f"{prefix}.json")
    print(json.dumps(report), file=sys.stderr)


if __name__ == "__main__":
    if len(sys.argv) not in (8, 9):
        sys.exit(__doc__)
    main(*sys.argv[1:])
