"""bf16 against fp32 at an equal number of updates: is bf16 worse beyond seed noise?

    python bench/precision_quality.py --out work-dirs/precision          # Multi30k EN-DE, cpu.yaml
    python bench/precision_quality.py --out DIR --updates 4000 --seeds 1,2,3

For each precision (fp32, bf16) and seed (1, 2): ``xf train`` with recipes/multi30k/cpu.yaml's
``train:`` section, its 34-minute time budget replaced by ``--updates`` (2,000: about what the
budget reaches on a 2-core AVX2 EPYC), so both precisions take the same number of updates; each
run has its own save dir (DIR/runs/PRECISION-seedSEED) and keeps only its last checkpoint. Then the
last checkpoint's beam search of val (cpu.yaml's ``translate:`` beam size and length penalty,
scored by sacreBLEU as ``xf score`` scores ``xf translate``'s output). The data is preprocessed
once (cpu.yaml's ``preprocess:``, into DIR/data-bin). A re-run skips what is finished (a run whose
log ends at ``--updates``; a scored run) and resumes an interrupted run from its checkpoint.

Written to DIR: precision_quality.md (the table, the mean and spread per precision, bf16 - fp32
against the seed spread) and precision_quality.csv (one row per run). Validation loss (label
smoothed), nll and perplexity are xf train's at the last update; greedy val BLEU per epoch is
xf train's own (``eval_bleu``), from each run's train_log.jsonl: each run evaluated in its own
precision. The last checkpoint is also evaluated in fp32 (its val nll, and the beam search), so
that those columns compare the trained weights alone.

bf16 is refused, in one line, where it is emulated (a CPU without avx512_bf16/AMX, a GPU before
sm_80: precision.xf_precisions), where it would run some 30x slower than fp32; ``--force-bf16``
runs it anyway (the tests do, at a tiny size). Runs one after another in this process.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from xformer_cli.base.errors import XfError  # noqa: E402

PRECISIONS = ("fp32", "bf16")
COLUMNS = ("precision", "seed", "updates", "epochs", "val_loss", "val_nll", "val_ppl", "greedy_bleu_per_epoch",
           "fp32_eval_nll", "beam_bleu", "train_minutes")
# (column, its name in the table, higher is better)
COMPARED = (("val_loss", "val loss", False), ("val_ppl", "val ppl", False), ("fp32_eval_nll", "val nll, fp32 eval", False),
            ("greedy_bleu_last", "greedy BLEU", True), ("beam_bleu", "beam BLEU", True))


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, type=Path, help="work directory: data-bin/, runs/, the tables")
    p.add_argument("--multi30k", type=Path, default=REPO.parent / "shared" / "data" / "multi30k",
                   help="raw Multi30k: train.SRC, train.TGT, val.SRC, val.TGT")
    p.add_argument("--pair", default="en-de", help="SRC-TGT (en-de)")
    p.add_argument("--config", type=Path, default=REPO / "recipes" / "multi30k" / "cpu.yaml",
                   help="the recipe whose preprocess, train and translate sections are used")
    p.add_argument("--updates", type=int, default=2000, help="updates of every run (2000)")
    p.add_argument("--seeds", default="1,2", help="comma-separated seeds (1,2)")
    p.add_argument("--precisions", default="fp32,bf16", help="comma-separated, of fp32 and bf16")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda (auto)")
    p.add_argument("--force-bf16", action="store_true", help="run bf16 even where it is emulated (slow)")
    a = p.parse_args(argv)
    if a.updates < 1:
        p.error(f"--updates {a.updates}: must be at least 1")
    try:
        a.seeds = [int(s) for s in a.seeds.split(",")]
    except ValueError:
        p.error(f"--seeds {a.seeds!r}: comma-separated integers")
    a.precisions = [s.strip() for s in a.precisions.split(",")]
    if bad := [x for x in a.precisions if x not in PRECISIONS]:
        p.error(f"--precisions: {bad[0]!r} is not one of {', '.join(PRECISIONS)}")
    a.src, _, a.tgt = a.pair.partition("-")
    if not a.src or not a.tgt:
        p.error(f"--pair {a.pair!r}: SRC-TGT, e.g. en-de")
    return a


def check_bf16(device_option: str, force: bool) -> str:
    """The hardware the study runs on (precision.hardware_note); where bf16 is emulated, unless
    ``force``, the one-line refusal (an XfError) instead."""
    from xformer_cli.base.distributed import resolve_device
    from xformer_cli.base.precision import NATIVE, hardware_note, xf_precisions

    device = resolve_device(device_option)
    if xf_precisions(device).get("bf16") != NATIVE and not force:
        raise XfError(f"bf16 is emulated here ({hardware_note(device)}): some 30x slower than fp32, so "
                      "not run; --force-bf16 runs it anyway, --precisions fp32 leaves it out")
    return hardware_note(device)


def records(save_dir: Path, kind: str) -> list[dict]:
    path = save_dir / "train_log.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            r = json.loads(line)
        except json.JSONDecodeError:  # a torn last line of an interrupted run
            continue
        if r.get("type") == kind:
            out.append(r)
    return out


def finished(save_dir: Path, updates: int) -> bool:
    """The run's log ends with a summary at ``updates`` (xf train appends one as it stops)."""
    ends = records(save_dir, "summary")
    return bool(ends) and ends[-1]["num_updates"] >= updates


def preprocess_once(a: argparse.Namespace) -> Path:
    from xf_command import xf

    dest = a.out / "data-bin"
    if (dest / "meta.json").exists():
        return dest
    for split in ("train", "val"):
        for lang in (a.src, a.tgt):
            if not (a.multi30k / f"{split}.{lang}").is_file():
                raise XfError(f"--multi30k {a.multi30k}: no {split}.{lang}")
    xf("preprocess", "--config", a.config, "--destdir", dest, "--source-lang", a.src, "--target-lang", a.tgt,
       "--overwrite", "--trainpref", a.multi30k / "train", "--validpref", a.multi30k / "val")
    return dest


def train_run(a: argparse.Namespace, data: Path, precision: str, seed: int, save_dir: Path) -> None:
    """xf train with the config's train section at a fixed number of updates; resumes a started run."""
    from xf_command import xf

    xf("train", data, "--config", a.config, "--save-dir", save_dir, "--precision", precision, "--seed", seed,
       "--device", a.device, "--max-update", a.updates,
       "--stop-time-hours", 0.0,  # the same number of updates, not the same time
       "--max-epoch", 0, "--keep-last-checkpoints", 1)


def evaluate_last(a: argparse.Namespace, save_dir: Path) -> dict:
    """The last checkpoint in fp32, so that only training differs between the runs: the sacreBLEU
    of its beam search of val (the config's translate beam and lenpen) and its val nll."""
    from xformer_cli.model.checkpoint import load_ensemble
    from xformer_cli.train.choose import read_valid, valid_bleu, valid_loss, valid_pairs
    from xformer_cli.frame import load_command_options
    from xformer_cli.base.distributed import resolve_device
    from xformer_cli.settings.options import TranslateOptions

    path = save_dir / "checkpoint_last.pt"
    options = load_command_options(TranslateOptions, a.config, {"path": (str(path),), "quiet": True}, section="translate")
    device = resolve_device(a.device)
    models, sp = load_ensemble([str(path)], device)
    source, reference = read_valid(str(a.multi30k / f"val.{a.src}"), str(a.multi30k / f"val.{a.tgt}"))
    bleu = valid_bleu(models, device, sp, source, reference, options, [options.lenpen])[0]["bleu"]
    nll = valid_loss(models[0], valid_pairs(sp, source, reference, models[0].cfg.max_positions - 1))
    return {"beam_bleu": bleu, "fp32_eval_nll": round(nll, 4)}


def run_row(precision: str, seed: int, save_dir: Path, evaluated: dict) -> dict:
    valid = records(save_dir, "valid")
    last = valid[-1]
    epochs = [r.get("bleu") for r in valid if "bleu" in r]
    summary = records(save_dir, "summary")
    return {"precision": precision, "seed": seed, "updates": last["update"], "epochs": last["epoch"],
            "val_loss": round(last["loss"], 4), "val_nll": round(last["nll"], 4), "val_ppl": round(last["ppl"], 2),
            "greedy_bleu_per_epoch": " ".join(f"{b:.2f}" for b in epochs), "greedy_bleu_last": epochs[-1] if epochs else None,
            **evaluated, "train_minutes": round(sum(s["train_seconds"] for s in summary) / 60, 1)}


def compare(rows: list[dict]) -> list[dict]:
    """Per compared metric: each precision's mean and seed spread (max - min over its seeds), and
    bf16 - fp32 of the means against the larger of the two spreads (seed noise)."""
    out = []
    for key, name, higher_better in COMPARED:
        per = {p: [r[key] for r in rows if r["precision"] == p and r[key] is not None] for p in PRECISIONS}
        stats = {p: (statistics.fmean(v), max(v) - min(v)) for p, v in per.items() if v}
        row = {"metric": name, **{f"{p}_mean": round(m, 3) for p, (m, _) in stats.items()},
               **{f"{p}_spread": round(s, 3) for p, (_, s) in stats.items()}}
        if len(stats) == 2:
            diff = stats["bf16"][0] - stats["fp32"][0]
            noise = max(stats["bf16"][1], stats["fp32"][1])
            worse = diff < 0 if higher_better else diff > 0
            row["diff"] = f"{diff:+.3f}"
            row["noise"] = f"{noise:.3f}"
            row["verdict"] = ("within seed noise" if abs(diff) <= noise or math.isclose(diff, 0.0)
                              else f"bf16 {'worse' if worse else 'better'} beyond seed noise")
        out.append(row)
    return out


def markdown(a: argparse.Namespace, rows: list[dict], comparison: list[dict], hardware: str) -> str:
    import torch

    lines = [f"# bf16 against fp32: {a.config.name}, Multi30k {a.pair}, {a.updates} updates", "",
             f"{hardware}; torch {torch.__version__}; seeds {', '.join(map(str, a.seeds))}. val_loss (label "
             "smoothed), val_nll, val_ppl and the greedy BLEU per epoch are xf train's, each run evaluated "
             "in its own precision; fp32_eval_nll and beam_bleu (beam search of val, sacreBLEU) are the "
             "last checkpoint's, evaluated in fp32.", "",
             "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(str(r[c]) for c in COLUMNS) + " |" for r in rows]
    lines += ["", "| metric | fp32 mean | fp32 spread | bf16 mean | bf16 spread | bf16 - fp32 | seed noise | verdict |",
              "|---|---|---|---|---|---|---|---|"]
    for c in comparison:
        lines.append("| " + " | ".join(str(c.get(k, "")) for k in (
            "metric", "fp32_mean", "fp32_spread", "bf16_mean", "bf16_spread", "diff", "noise", "verdict")) + " |")
    lines += ["", "Spread: max - min over the seeds of one precision; seed noise: the larger of the two "
              "spreads. With two seeds a difference inside it is not evidence of a difference."]
    return "\n".join(lines) + "\n"


def study(a: argparse.Namespace) -> list[dict]:
    from xformer_cli.base.console import print_summary, stderr_console
    from xformer_cli.base.fileio import atomic_write_text

    console = stderr_console()
    hardware = check_bf16(a.device, force=a.force_bf16 or "bf16" not in a.precisions)
    start = time.perf_counter()
    data = preprocess_once(a)
    rows = []
    for precision in a.precisions:
        for seed in a.seeds:
            save_dir = a.out / "runs" / f"{precision}-seed{seed}"
            scored = save_dir / "evaluated.json"
            if not finished(save_dir, a.updates):
                console.print(f"[bold]{precision}, seed {seed}[/bold]: training to update {a.updates} in {save_dir}")
                scored.unlink(missing_ok=True)
                train_run(a, data, precision, seed, save_dir)
            else:
                console.print(f"{precision}, seed {seed}: trained ({save_dir})")
            if not scored.exists():
                console.print(f"{precision}, seed {seed}: beam search of val")
                atomic_write_text(scored, json.dumps(evaluate_last(a, save_dir)) + "\n")
            rows.append(run_row(precision, seed, save_dir, json.loads(scored.read_text())))
    comparison = compare(rows)
    csv_text = io.StringIO()
    writer = csv.DictWriter(csv_text, fieldnames=COLUMNS, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(a.out / "precision_quality.csv", csv_text.getvalue())
    atomic_write_text(a.out / "precision_quality.md", markdown(a, rows, comparison, hardware))
    summary = [(f"{r['precision']} seed {r['seed']}", f"val loss {r['val_loss']}, ppl {r['val_ppl']}, "
                f"beam BLEU {r['beam_bleu']}") for r in rows]
    summary += [(c["metric"], f"bf16 - fp32 {c['diff']} (seed noise {c['noise']}): {c['verdict']}")
                for c in comparison if "diff" in c]
    summary.append(("written", f"{a.out / 'precision_quality.md'}, .csv ({time.perf_counter() - start:.0f} s)"))
    print_summary(console, "precision quality", summary)
    return rows


def main(argv=None) -> int:
    a = parse_args(argv)
    try:
        study(a)
    except XfError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
