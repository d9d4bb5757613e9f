"""What the confidence of xf translate's jsonl is worth, on Multi30k EN-DE, as one command.

    python bench/confidence.py [--work-dir DIR] [--data ../shared/data] [--updates 1200] [--out DIR]

1. Two small models (arch tiny, vocabulary 2,000, --updates updates on all 29,000 training pairs,
   one CPU thread, fp32): EN->DE and DE->EN (the reverse model). Kept in --work-dir: a re-run
   with the same --work-dir reuses them.
2. ``xf calibrate`` on val (1,014 lines) twice: with the reverse model and without; the test
   set is never read by a fit.
3. On val and on test2016 (1,000 lines), beam 4: the ROC area of each confidence for predicting
   a sentence whose sacreBLEU sentence chrF is below that set's median (higher is better, 0.5 is
   chance), beside the raw length-normalized log-probability alone (the search's per-subword
   score) and the uncalibrated default. On val the calibrated rows are fitted on the same lines:
   test2016 is the honest figure.
4. The flags on failures made on purpose, on test2016: the source copied as the output; the
   French reference given as the output; and the output forced into English by a target prefix
   (the source's first 4 words, or its words but the last 2), the search completing the line (in
   German, mostly: a mixed line). Their recall, and the false-alarm rate on the model's own beam
   output and on the German references.
5. On val, the share of clean outputs, references and prefix-forced outputs that each bound of
   py3langid's probability of German would flag: how confidence.WRONG_LANGUAGE_P was chosen.
6. What the confidence costs: test2016 translated into jsonl (beam 4, batch 64, one thread)
   without it, with the default one (the flags: language identification and the copy check) and
   with the calibrated one that scores the reverse direction, best of --rounds passes each,
   interleaved; milliseconds per sentence and the ratio to plain decoding (the machine to itself).

Writes DIR/confidence.md and prints it. Library calls measure; whole commands (xf preprocess,
xf train, xf calibrate) run through the CLI, as a user runs them.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from xf_command import write_report, xf  # noqa: E402


def train_models(work: Path, multi30k: Path, updates: int) -> dict[str, Path]:
    """EN->DE and DE->EN checkpoints under work (trained unless there)."""
    out = {}
    for s, t in (("en", "de"), ("de", "en")):
        d = work / f"{s}-{t}"
        ckpt = d / "ckpt" / "checkpoint_last.pt"
        if not ckpt.exists():
            if not (d / "data").exists():
                xf("preprocess", "--source-lang", s, "--target-lang", t, "--trainpref", multi30k / "train",
                   "--validpref", multi30k / "val", "--destdir", d / "data", "--bpe-vocab-size", 2000, "--workers", 1)
            xf("train", d / "data", "--save-dir", d / "ckpt", "--arch", "tiny", "--max-tokens", 3000,
               "--warmup-updates", 100, "--max-update", updates, "--device", "cpu", "--threads", 1, "--seed", 1,
               "--dropout", 0.1, "--save-interval-minutes", 0, "--precision", "fp32",
               "--lr-scheduler", "inverse_sqrt", "--lr", 3e-3)
        out[f"{s}-{t}"] = ckpt
    return out


def read(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work-dir", type=Path, default=Path("work-dirs/confidence"))
    ap.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data")
    ap.add_argument("--updates", type=int, default=1200)
    ap.add_argument("--out", type=Path, default=None, help="where confidence.md goes (default: a temporary folder)")
    ap.add_argument("--rounds", type=int, default=3, help="timed passes of each case (the best counts)")
    ap.add_argument("--timing-only", action="store_true", help="step 6 alone (the models and calibrations of "
                    "--work-dir, made by an earlier run)")
    a = ap.parse_args(argv)
    multi30k = a.data / "multi30k"
    models = train_models(a.work_dir, multi30k, a.updates)
    calibrations = {}
    for name, reverse in (("with reverse", ["--reverse-path", models["de-en"]]), ("forward only", [])):
        path = a.work_dir / f"calibration-{'reverse' if reverse else 'forward'}.json"
        calibrations[name] = path
        if a.timing_only and path.exists():
            continue
        xf("calibrate", "--path", models["en-de"], *reverse, "--source", multi30k / "val.en", "--reference",
           multi30k / "val.de", "--output", path, "--overwrite", "--device", "cpu", "--threads", 1,
           "--target-lang", "de")
    report = ["# Confidence on Multi30k EN-DE", "",
              f"Models: arch tiny, {a.updates} updates on Multi30k train (EN->DE, and DE->EN as the reverse); "
              "beam 4; calibrated on val only.", ""]
    if not a.timing_only:
        report += measure(models, calibrations, multi30k)
    report += timing(models, calibrations["with reverse"], multi30k, a.rounds)
    write_report("\n".join(report) + "\n", a.out, "confidence.md")


def measure(models: dict[str, Path], calibrations: dict[str, Path], multi30k: Path) -> list[str]:
    from xformer_cli.decode.confidence import Calibration, roc_auc, uncalibrated
    from xformer_cli.text.metrics import sentence_chrf
    from xformer_cli.settings.options import TranslateOptions
    from xformer_cli.decode.translate import open_engine, open_scorer, translate_with_features

    options = TranslateOptions(path=(str(models["en-de"]),), device="cpu", threads=1, output_format="jsonl",
                               reverse_path=(str(models["de-en"]),), target_lang="de")
    engine, sp, _ = open_engine(options)
    scorer = open_scorer(options, engine.plan)  # no calibration: the features alone
    fitted = {name: Calibration.load(str(path)) for name, path in calibrations.items()}
    lines = ["| set | median chrF | raw log-prob / subword | default (no file) | calibrated, forward only | "
             "calibrated, with reverse |", "|---|---|---|---|---|---|"]
    outputs = {}
    for split in ("val", "test2016"):
        sources, refs = read(multi30k / f"{split}.en"), read(multi30k / f"{split}.de")
        texts, rows = translate_with_features(engine, sp, sources, options, scorer)
        outputs[split] = (sources, texts, rows)
        chrf = sentence_chrf(texts, refs)
        median = statistics.median(chrf)
        low = [c < median for c in chrf]
        auc = lambda values: f"{roc_auc([-v for v in values], low):.3f}"  # noqa: E731 (low confidence: low chrF)
        no_reverse = [[r[0], 0.0, r[2], r[3]] for r in rows]
        lines.append(f"| {split} | {median:.1f} | {auc([r[0] for r in rows])} | {auc([uncalibrated(r) for r in rows])} "
                     f"| {auc([fitted['forward only'].confidence(r) for r in no_reverse])} "
                     f"| {auc([fitted['with reverse'].confidence(r) for r in rows])} |")
    lines += ["", "ROC area for predicting a sentence whose chrF is below the set's median (0.5: chance).", ""]
    lines += flags(engine, sp, options, scorer, multi30k, outputs["test2016"])
    lines += ["", "The wrong_language bound (confidence.WRONG_LANGUAGE_P), on val:", ""]
    lines += language_thresholds(engine, sp, options, multi30k, outputs["val"])
    engine.close()
    return lines


def timing(models: dict[str, Path], calibration: Path, multi30k: Path, rounds: int) -> list[str]:
    """Step 6: milliseconds per sentence of test2016 into jsonl, without and with the confidence."""
    import platform
    import time

    import torch

    from xformer_cli.decode.confidence import Calibration
    from xformer_cli.settings.options import TranslateOptions
    from xformer_cli.base.precision import cpu_flags
    from xformer_cli.decode.translate import Stats, open_engine, open_scorer, translate_buffer

    torch.set_num_threads(1)
    sources = read(multi30k / "test2016.en")
    common = dict(path=(str(models["en-de"]),), device="cpu", threads=1, precision="fp32", output_format="jsonl",
                  batch_size=64)
    cases = {"plain decoding": (TranslateOptions(**common), None),
             "default confidence (flags)": (TranslateOptions(**common, target_lang="de"), None),
             "calibrated, with the reverse model": (
                 TranslateOptions(**common, target_lang="de", reverse_path=(str(models["de-en"]),),
                                  confidence=str(calibration)), Calibration.load(str(calibration)))}
    engine, sp, _ = open_engine(cases["plain decoding"][0])
    scorers = {name: open_scorer(o, engine.plan, cal) if name != "plain decoding" else None
               for name, (o, cal) in cases.items()}
    for name, (o, _) in cases.items():  # warm: the language identifier's model, first-call allocations
        translate_buffer(engine, sp, sources[:64], 0, o, Stats(), scorer=scorers[name])
    best = {name: float("inf") for name in cases}
    for _ in range(rounds):
        for name, (o, _) in cases.items():
            start = time.perf_counter()
            translate_buffer(engine, sp, sources, 0, o, Stats(), scorer=scorers[name])
            best[name] = min(best[name], time.perf_counter() - start)
    engine.close()
    from decode import FLAGS  # the instruction sets a figure is written beside

    flags = " ".join(f for f in FLAGS if f in cpu_flags()) or "none of them"
    plain = best["plain decoding"]
    lines = ["", f"What it costs: test2016 ({len(sources):,} lines) into jsonl, beam 4, batch 64, fp32, one thread, "
             f"best of {rounds} interleaved passes; {platform.processor() or platform.machine()} ({flags}):", "",
             "| case | ms per sentence | vs plain decoding |", "|---|---|---|"]
    lines += [f"| {name} | {1000 * t / len(sources):.2f} | {t / plain:.2f}x |" for name, t in best.items()]
    return lines


# English forced by a target prefix: the source's words that the prefix keeps
PREFIXES = {"first 4 words": lambda words: words[:4], "words but the last 2": lambda words: words[:-2]}


def prefixed(engine, sp, options, sources: list[str], cut) -> list[str]:
    """The best translation of each source, forced to start with ``cut(its words)``."""
    from xformer_cli.decode.translate import Stats, hypothesis_texts, search_lines

    prefixes = [sp.encode(" ".join(cut(s.split())), out_type=int) for s in sources]
    found, _ = search_lines(engine, sp.encode(sources, out_type=int), options, Stats(), None, 64, prefixes=prefixes)
    return [hypothesis_texts(sp, hyps[:1])[0] for hyps in found]


def language_thresholds(engine, sp, options, multi30k: Path, clean) -> list[str]:
    """How the wrong_language bound was chosen, on val: the share flagged at each bound."""
    from xformer_cli.text.language_id import LanguageId

    sources, texts, _ = clean
    probability = LanguageId(["de"]).probability
    sets = [texts, read(multi30k / "val.de"), prefixed(engine, sp, options, sources, PREFIXES["words but the last 2"])]
    p = [[probability(t, "de") for t in outs] for outs in sets]
    lines = ["| py3langid's probability of German under | clean val output flagged | val references flagged | "
             "val outputs forced by a prefix (all but 2 words) flagged |", "|---|---|---|---|"]
    for bound in (0.05, 0.2, 0.5, 0.8, 0.9):
        lines.append(f"| {bound} | " + " | ".join(f"{sum(x < bound for x in ps) / len(ps):.3f}" for ps in p) + " |")
    return lines


def flags(engine, sp, options, scorer, multi30k: Path, clean) -> list[str]:
    """Recall of the flags on failures made on purpose, false alarms on clean output (test2016)."""
    sources, texts, rows = clean
    refs, french = read(multi30k / "test2016.de"), read(multi30k / "test2016.fr")
    forced = {name: prefixed(engine, sp, options, sources, cut) for name, cut in PREFIXES.items()}
    cases = [("copy: the source as output", sources, 3), ("wrong_language: the French reference", french, 2)]
    for name, outs in forced.items():
        cases += [(f"wrong_language: English forced by a prefix, the source's {name}", outs, 2),
                  (f"either flag: English forced by a prefix, the source's {name}", outs, None)]
    fired = lambda outs, col: [(r[2] or r[3]) if col is None else r[col]  # noqa: E731
                               for r in scorer.rows(sources, outs, [0.0] * len(outs))]
    lines = ["| failure made on purpose (test2016, 1,000 lines) | recall |", "|---|---|"]
    lines += [f"| {name} | {sum(fired(outs, col)) / len(outs):.3f} |" for name, outs, col in cases]
    lines += ["", "| clean output (test2016) | copy false alarms | wrong_language false alarms |", "|---|---|---|"]
    for name, outs in (("the model's beam output", texts), ("the German references", refs)):
        got = scorer.rows(sources, outs, [0.0] * len(outs))
        lines.append(f"| {name} | {sum(r[3] for r in got) / len(got):.3f} | {sum(r[2] for r in got) / len(got):.3f} |")
    return lines


if __name__ == "__main__":
    main(sys.argv[1:])
