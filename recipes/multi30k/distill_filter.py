"""The filter of recipes/multi30k/distill.sh: keep the distilled pairs the teacher is sure enough of.

    python distill_filter.py SCORES SOURCE TARGET PREFIX SRC TGT MIN_MEAN

SCORES is `xf score-pairs` jsonl of SOURCE -> TARGET (the teacher's translations), one record a
pair in order. A pair is kept when its per-token log-prob (`mean`) is at least MIN_MEAN (-inf keeps
every pair) and its target is not empty; the kept pairs, in their order, go to PREFIX.SRC and
PREFIX.TGT, and the counts to PREFIX.json, written last: it marks the step as done.
"""

import json
import os
import sys


def read_lines(path: str) -> list[str]:
    with open(path, encoding="utf-8", newline="\n") as f:
        return f.read().split("\n")[:-1] if os.path.getsize(path) else []


def main(scores: str, source: str, target: str, prefix: str, src: str, tgt: str, min_mean: str) -> None:
    cut = float(min_mean)
    with open(scores, encoding="utf-8") as f:
        mean = [json.loads(line)["mean"] for line in f]
    pairs = {src: read_lines(source), tgt: read_lines(target)}
    for side, lines in pairs.items():
        if len(lines) != len(mean):
            sys.exit(f"error: {scores} scores {len(mean)} pairs but {source if side == src else target} has {len(lines)} lines")
    empty = [i for i, line in enumerate(pairs[tgt]) if not line.strip()]
    low = [i for i, m in enumerate(mean) if m < cut and pairs[tgt][i].strip()]
    dropped = set(empty) | set(low)
    keep = [i for i in range(len(mean)) if i not in dropped]
    for side, lines in pairs.items():
        with open(f"{prefix}.{side}.tmp", "w", encoding="utf-8", newline="\n") as f:
            f.writelines(lines[i] + "\n" for i in keep)
    for side in pairs:
        os.replace(f"{prefix}.{side}.tmp", f"{prefix}.{side}")
    report = {"pairs": len(mean), "kept": len(keep), "min_mean": cut, "dropped_low_log_prob": len(low),
              "dropped_empty": len(empty)}
    with open(f"{prefix}.json.tmp", "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1)
    os.replace(f"{prefix}.json.tmp", f"{prefix}.json")
    print(json.dumps(report), file=sys.stderr)


if __name__ == "__main__":
    if len(sys.argv) != 8:
        sys.exit(__doc__)
    main(*sys.argv[1:])
