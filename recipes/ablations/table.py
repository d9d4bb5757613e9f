"""Table 3 of the ablation recipe from its finished rows: table.md, table.csv, claims.md (a verdict per
claim of the paper, CLAIMS), table.png, curves.csv,
curves.png and cpu.tsv in OUT (default WORK_DIR); or, with --second-seeds, the rows that need a
second seed.

    python table.py WORK_DIR PAPER_CSV [--second-seeds] [--out OUT]

WORK_DIR is run.sh's work dir or its RECORD. A run is finished when WORK_DIR/rows/SPEC/val.score.json
exists; SPEC is a row's name (seed 1, the base's seed) or NAME@SEED. A run's configuration,
parameter count and updates come from its train_log.jsonl (a record's) or
checkpoints/train_log.jsonl (a work dir's) (the last 'start' record; the 'valid' records: its validation curve,
perplexity exp(nll) per target subword on val), its BLEU (its averaged checkpoint, beam 4) from
the score file, its CPU seconds from cpu.tsv (run.sh: user + system, every step). A row's value
is the mean over its seeds, and its perplexity is that of its best validation (the plateau).

The seed spread of a metric is the mean |seed 1 - seed 2| over the rows run with both (the base
at least). A difference to the base is "beyond noise" when it exceeds twice that spread; rows
whose difference is within it on BLEU or perplexity are the ones --second-seeds prints (NAME@2,
one a line, for rows run with one seed), so that their verdict rests on two seeds.
The Markdown leaves a cell blank where the row equals the base row, as the paper's table does.
Run by run.sh with xf's interpreter; the plots are skipped, saying why, without matplotlib.
"""

from __future__ import annotations

import csv
import io
import json
import math
import sys
from pathlib import Path

from xformer_cli.base.fileio import atomic_write, atomic_write_text

COLUMNS = ["row", "N", "d_model", "d_ff", "h", "d_k", "d_v", "P_drop", "eps_ls", "params_M", "seeds",
           "updates", "best_update", "cpu_s", "ppl", "bleu", "d_ppl", "d_bleu", "verdict"]
CONFIG_COLUMNS = COLUMNS[1:9]
NOISE = 2.0  # a difference beyond NOISE x the seed spread is beyond noise


def records(path: Path) -> list[dict]:
    out = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:  # a line still being written (a row training now)
            raise SystemExit(f"{path}:{number}: not a JSON record") from None
    return out


def run_of(spec: str, directory: Path) -> dict:
    """One finished run (a row at one seed): its configuration, curve, plateau, BLEU, CPU time."""
    log = directory / "train_log.jsonl"
    if not log.exists():
        log = directory / "checkpoints" / "train_log.jsonl"
    if not log.exists():
        raise SystemExit(f"{log}: missing (the run's score exists but not its training log)")
    found = records(log)
    starts = [r for r in found if r.get("type") == "start"]
    if not starts:
        raise SystemExit(f"{log}: no 'start' record")
    curve: dict[int, float] = {}
    for r in found:
        if r.get("type") == "valid":  # a resume that redid updates replaces their validations
            curve[int(r["update"])] = float(r["nll"])
    if not curve:
        raise SystemExit(f"{log}: no 'valid' record (did the row's training finish?)")
    start, o = starts[-1], starts[-1]["options"]
    best_update = min(curve, key=lambda u: (curve[u], u))
    layers = o["encoder_layers"] if o["encoder_layers"] == o["decoder_layers"] else f"{o['encoder_layers']}/{o['decoder_layers']}"
    score_file = directory / "val.score.json"
    try:
        bleu = json.loads(score_file.read_text(encoding="utf-8"))["bleu"]["score"]
    except (ValueError, KeyError, TypeError):
        raise SystemExit(f"{score_file}: not an xf score --json file with a BLEU score") from None
    cpu = 0.0
    if (directory / "cpu.tsv").exists():
        for number, line in enumerate((directory / "cpu.tsv").read_text(encoding="utf-8").splitlines(), 1):
            fields = line.split("\t")
            try:
                cpu += float(fields[1])
            except (IndexError, ValueError):
                raise SystemExit(f"{directory / 'cpu.tsv'}:{number}: not 'step<TAB>seconds'") from None
    machine = ""  # a record's: the CPU kind the run was made on (its flags line)
    if (directory / "machine.txt").exists():
        for line in (directory / "machine.txt").read_text(encoding="utf-8").splitlines():
            if line.startswith("flags "):
                machine = line[len("flags "):]
    return {"spec": spec, "machine": machine, "N": layers, "d_model": o["d_model"], "d_ff": o["d_ff"], "h": o["heads"],
            "d_k": o["head_dim"], "d_v": o["head_dim"], "P_drop": o["dropout"], "eps_ls": o["label_smoothing"],
            "params_M": round(start["parameters"] / 1e6, 3), "seed": o["seed"], "updates": max(curve),
            "best_update": best_update, "cpu_s": cpu, "ppl": math.exp(curve[best_update]), "bleu": float(bleu),
            "curve": sorted(curve.items())}


def finished_runs(work: Path) -> dict[str, dict[str, dict]]:
    """{row name: {spec: run}} for every finished run under WORK_DIR/rows."""
    rows: dict[str, dict[str, dict]] = {}
    for d in sorted((work / "rows").glob("*")):
        if not d.name.startswith(".") and (d / "val.score.json").exists():  # .SPEC.tmp: being recorded
            rows.setdefault(d.name.split("@")[0], {})[d.name] = run_of(d.name, d)
    return rows


def spreads(rows: dict[str, dict[str, dict]]) -> dict[str, float | None]:
    """Per metric, the mean |seed a - seed b| over rows with two seeds (None: no such row)."""
    out: dict[str, float | None] = {}
    for key in ("ppl", "bleu"):
        gaps = []
        for runs in rows.values():
            values = [r[key] for r in runs.values()]
            if len(values) >= 2:
                gaps.append(max(values) - min(values))
        out[key] = sum(gaps) / len(gaps) if gaps else None
    return out


def summary(name: str, runs: dict[str, dict]) -> dict:
    """A row over its seeds: the first run's configuration, the means of its metrics."""
    ordered = sorted(runs.values(), key=lambda r: r["seed"])
    first = ordered[0]
    mean = lambda key: sum(r[key] for r in ordered) / len(ordered)  # noqa: E731
    return {"row": name, **{c: first[c] for c in CONFIG_COLUMNS}, "params_M": first["params_M"],
            "seeds": " ".join(str(r["seed"]) for r in ordered),
            "updates": " / ".join(str(r["updates"]) for r in ordered),
            "best_update": " / ".join(str(r["best_update"]) for r in ordered),
            "cpu_s": round(mean("cpu_s")), "ppl": round(mean("ppl"), 2), "bleu": round(mean("bleu"), 2),
            "ppl_each": [r["ppl"] for r in ordered], "bleu_each": [r["bleu"] for r in ordered]}


def observed(delta: float, spread: float | None, higher_is_better: bool) -> str | None:
    """better / worse / same (within NOISE x the seed spread) for a difference to the base."""
    if spread is None:
        return None
    if abs(delta) <= NOISE * spread:
        return "same"
    return "better" if (delta > 0) == higher_is_better else "worse"


def reference(name: str, names) -> str:
    """The row a row's differences are taken to: "base-SUFFIX" for a row "ROW-SUFFIX" when both
    ROW and base-SUFFIX are rows (a check that makes one change to several rows, the base among
    them: rows/*-lr2.5e-3.yaml against base-lr2.5e-3), else "base"."""
    for other in names:
        suffix = other[len("base"):]
        if other.startswith("base-") and name != other and name.endswith(suffix) and name[:-len(suffix)] in names:
            return other
    return "base"


def paper_row(name: str, names) -> str:
    """The paper's row a check row repeats (ROW of ROW-SUFFIX, as reference() pairs them), else itself."""
    ref = reference(name, names)
    return name[:-(len(ref) - len("base"))] if ref != "base" else name


def verdicts(table: list[dict], spread: dict[str, float | None]) -> None:
    """Each row's difference to its reference (the base, or its check's base-SUFFIX) and whether
    it is beyond NOISE x the seed spread."""
    by_name = {r["row"]: r for r in table}
    for r in table:
        base = by_name.get(reference(r["row"], by_name))
        r["vs"] = base["row"] if base is not None else ""
        if base is None or r is by_name.get("base"):
            r.update(d_ppl="", d_bleu="", verdict="")
            continue
        r["d_ppl"], r["d_bleu"] = round(r["ppl"] - base["ppl"], 2), round(r["bleu"] - base["bleu"], 2)
        said = []
        for key, better in (("bleu", 1), ("ppl", -1)):
            if spread[key] is None:
                said.append(f"{key}: no seed spread yet")
                continue
            got = observed(r[f"d_{key}"], spread[key], better > 0)
            said.append(f"{key} {'within noise' if got == 'same' else got}")
        r["verdict"] = ", ".join(said) + ("" if base["row"] == "base" else f" (vs {base['row']})")


# The paper's claims (Sec. 6.2 and 5.4), each tested by the rows that bear on it: per row, what
# the claim says of its quality against the base's, per metric (better, worse, same; None: the
# claim says nothing of that metric). Quality: higher BLEU, lower perplexity.
CLAIMS = (
    ("A", "single-head attention is worse (than the base), and quality drops off with too many heads",
     (("A1-h1", "worse", "worse"), ("A4-h16", "worse", "worse"))),
    ("B", "reducing the attention key size d_k hurts model quality",
     (("B1-dk4", "worse", "worse"), ("B2-dk8", "worse", "worse"))),
    ("C", "bigger models are better",
     (("C1-N1", "worse", "worse"), ("C2-N2", "worse", "worse"), ("C3-N4", "better", "better"),
      ("C4-d32", "worse", "worse"), ("C5-d128", "better", "better"), ("C6-ff128", "worse", "worse"),
      ("C7-ff512", "better", "better"), ("big", "better", "better"))),
    ("D", "dropout is very helpful in avoiding over-fitting",
     (("D1-drop0", "worse", "worse"),)),
    ("D", "label smoothing hurts perplexity, as the model learns to be more unsure, but improves BLEU",
     (("D3-ls0", "worse", "better"), ("D4-ls0.2", None, "worse"))),
    ("E", "learned positional embeddings give nearly identical results to the sinusoids",
     (("E1-learned", "same", "same"),)),
    # not a claim of the paper: (C)'s check, its larger rows at half the shared peak lr, each
    # against the base at that lr (reference())
    ("C", "bigger models are better, all at half the peak lr (rows/*-lr2.5e-3.yaml, against base-lr2.5e-3)",
     tuple((f"{row}-lr2.5e-3", "better", "better") for row in ("C3-N4", "C5-d128", "C7-ff512", "big"))),
)


def claim_verdicts(table: list[dict], paper: dict[str, dict], spread: dict[str, float | None]) -> list[dict]:
    """One line per (claim, row): the paper's difference to its base and ours, what the claim
    expects, and whether it holds on that row; a row not run yet is "not run"."""
    ours = {r["row"]: r for r in table}
    pbase = paper.get("base", {})
    lines = []
    for group, claim, tests in CLAIMS:
        for row, bleu_says, ppl_says in tests:
            p = paper.get(paper_row(row, ours), {})
            try:
                paper_d = (float(p["ppl"]) - float(pbase["ppl"]), float(p["bleu"]) - float(pbase["bleu"]))
            except (KeyError, ValueError):
                paper_d = None
            line = {"group": group, "claim": claim, "row": row, "expects": (bleu_says, ppl_says), "paper": paper_d}
            r = ours.get(row)
            if r is None or "base" not in ours or (row not in paper and reference(row, ours) == "base"):  # a check's base not run
                lines.append({**line, "ours": None, "seeds": "", "verdict": "not run"})
                continue
            seen = (observed(r["d_bleu"], spread["bleu"], True), observed(r["d_ppl"], spread["ppl"], False))
            said = [(want, got) for want, got in zip((bleu_says, ppl_says), seen) if want is not None]
            if any(got is None for _, got in said):
                verdict = "no seed spread yet"
            elif all(want == got for want, got in said):
                verdict = "holds"
            elif any(got != "same" and want != "same" and got != want for want, got in said) or any(
                    want == "same" and got != "same" for want, got in said):
                verdict = "partly" if any(want == got for want, got in said) else "does not hold"
            else:  # every miss is within noise
                verdict = "partly" if any(want == got for want, got in said) else "within noise"
            lines.append({**line, "ours": (r["d_ppl"], r["d_bleu"]), "seeds": r["seeds"], "verdict": verdict})
    return lines


def claims_markdown(lines: list[dict]) -> str:
    """The claims' table: per row the paper's difference and ours, the verdict; and per claim."""
    out = ["| claim | row | expects (BLEU, ppl) | paper Δ ppl / Δ BLEU | ours Δ ppl / Δ BLEU | seeds | verdict |",
           "|---|---|---|---|---|---|---|"]
    shown = set()
    for x in lines:
        label = "" if x["claim"] in shown else f"({x['group']}) {x['claim']}"  # the claim on its first row
        shown.add(x["claim"])
        expects = ", ".join(w or "-" for w in x["expects"])
        paper_d = "" if x["paper"] is None else f"{x['paper'][0]:+.2f} / {x['paper'][1]:+.1f}"
        ours = "" if x["ours"] is None else f"{x['ours'][0]:+.2f} / {x['ours'][1]:+.2f}"
        out.append(f"| {label} | {x['row']} | {expects} | {paper_d} | {ours} | {x['seeds']} | {x['verdict']} |")
    out.append("")
    for group, claim, _ in CLAIMS:
        got = [x["verdict"] for x in lines if x["claim"] == claim]
        run = [v for v in got if v != "not run"]
        if not run:
            verdict = "not run yet"
        elif len(set(run)) == 1:  # every row says the same
            verdict = run[0]
        else:
            verdict = "partly (" + ", ".join(f"{v} {got.count(v)}" for v in dict.fromkeys(run)) + ")"
        missing = len(got) - len(run)
        out.append(f"- ({group}) {claim}: **{verdict}**" + (f" ({missing} of {len(got)} rows not run yet)" if missing else ""))
    return "\n".join(out) + "\n"


def second_seeds(rows: dict[str, dict[str, dict]]) -> list[str]:
    """NAME@2 for the seed-1 rows whose BLEU or perplexity difference to the base is within
    NOISE x the base's seed spread (all of them while the base has one seed only)."""
    if "base" not in rows:
        raise SystemExit("no finished base row: the seed spread comes from it")
    base = summary("base", rows["base"])
    if len(rows["base"]) < 2:
        raise SystemExit("the base has one seed: run base@2 for the seed spread")
    spread = spreads({"base": rows["base"]})
    out = []
    for name, runs in rows.items():
        if name == "base" or len(runs) >= 2:
            continue
        r = summary(name, runs)
        if any(abs(r[k] - base[k]) <= NOISE * spread[k] for k in ("ppl", "bleu")):
            out.append(f"{name}@2")
    return out


def machines(rows: dict[str, dict[str, dict]]) -> str:
    """Which runs were made on which CPU kind (a record's machine.txt), a line; "" without."""
    kinds: dict[str, list[str]] = {}
    for runs in rows.values():
        for spec, run in runs.items():
            if run["machine"]:
                kinds.setdefault(run["machine"], []).append(spec)
    if not kinds:
        return ""
    return "runs by CPU flags: " + "; ".join(f"{kind}: {len(specs)} ({', '.join(specs)})" for kind, specs in kinds.items()) + "\n"


def markdown(table: list[dict], paper: dict[str, dict], spread: dict[str, float | None]) -> str:
    head = ["row", *CONFIG_COLUMNS, "params (M)", "seeds", "updates (stop)", "best update", "CPU s / seed",
            "val ppl", "val BLEU", "Δ ppl", "Δ BLEU", "vs base (2x seed spread)", "paper ppl", "paper BLEU"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    base = next((r for r in table if r["row"] == "base"), None)
    for r in table:
        cells = [r["row"]]
        for c in CONFIG_COLUMNS:
            same = base is not None and r is not base and str(r[c]) == str(base[c])
            cells.append("" if same else str(r[c]))
        p = paper.get(r["row"], {})
        each = lambda key: "" if len(r[f"{key}_each"]) < 2 else " (" + " / ".join(f"{v:.2f}" for v in r[f"{key}_each"]) + ")"  # noqa: E731
        cells += [f"{r['params_M']:.3f}", r["seeds"], r["updates"], r["best_update"], str(r["cpu_s"]),
                  f"{r['ppl']:.2f}{each('ppl')}", f"{r['bleu']:.2f}{each('bleu')}", str(r["d_ppl"]), str(r["d_bleu"]),
                  r["verdict"], p.get("ppl", ""), p.get("bleu", "")]
        lines.append("| " + " | ".join(cells) + " |")
    said = ", ".join(f"{k} {v:.2f}" if v is not None else f"{k} -" for k, v in spread.items())
    return "\n".join(lines) + f"\n\nseed spread (mean |seed 1 - seed 2| over the rows run with both): {said}\n"


def plot_table(table: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["row"] for r in table]
    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(max(6.0, 0.42 * len(table) + 2), 5.2))
    for ax, key, label in ((top, "bleu", "val BLEU (averaged, beam 4)"), (bottom, "ppl", "val perplexity (best)")):
        values = [r[key] for r in table]
        colors = ["C3" if n == "base" else "C0" for n in names]
        ax.bar(range(len(table)), values, color=colors)
        for i, r in enumerate(table):  # every seed's value as a dot on its bar
            ax.plot([i] * len(r[f"{key}_each"]), r[f"{key}_each"], "k.", ms=3)
        if "base" in names:
            ax.axhline(values[names.index("base")], color="C3", lw=0.8, ls="--", label="base")
            ax.legend(loc="upper right", fontsize=8, frameon=False)
        ax.set_ylabel(label)
        ax.grid(axis="y", alpha=0.3)
    bottom.set_xticks(range(len(table)), names, rotation=60, ha="right", fontsize=8)
    top.set_title("Table 3, scaled down, each row at its plateau: Multi30k EN-DE val (dots: seeds)", fontsize=9)
    fig.tight_layout()
    with atomic_write(path, "wb") as f:
        fig.savefig(f, format="png", dpi=90)
    plt.close(fig)


GROUPS = (("(A) heads", "A"), ("(B) key size", "B"), ("(C) N, d_model, d_ff", "C"), ("(D) dropout, label smoothing", "D"),
          ("(E) positions, big", "E"))


def plot_curves(rows: dict[str, dict[str, dict]], path: Path) -> None:
    """Validation nll per validation, one panel a group of Table 3, the base's seeds in each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(GROUPS), sharey=True, figsize=(3.2 * len(GROUPS), 3.4))
    for ax, (title, prefix) in zip(axes, GROUPS):
        names = [n for n in rows if n[0] == prefix or (prefix == "E" and n not in ("base",) and n[0] not in "ABCD")]
        for i, name in enumerate(["base", *sorted(names)]):
            for run in rows.get(name, {}).values():
                updates, nll = zip(*run["curve"])
                style = dict(color="k", lw=1.2) if name == "base" else dict(color=f"C{i % 10}", lw=0.9)
                label = name if run["seed"] == min(r["seed"] for r in rows[name].values()) else None
                ax.plot(updates, nll, ls="-" if run["seed"] == 1 else ":", label=label, **style)
                ax.plot([run["best_update"]], [math.log(run["ppl"])], "o", ms=2.5, color=style["color"])
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("updates", fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6, frameon=False)
        ax.tick_params(labelsize=7)
    axes[0].set_ylabel("val nll per target subword (nats)", fontsize=8)
    lows = [nll for runs in rows.values() for r in runs.values() for _, nll in r["curve"]]
    if lows:
        axes[0].set_ylim(min(lows) - 0.05, min(lows) + 1.2)
    fig.suptitle("Validation curves to the plateau (solid: seed 1, dotted: seed 2; dot: the best validation)", fontsize=9)
    fig.tight_layout()
    with atomic_write(path, "wb") as f:
        fig.savefig(f, format="png", dpi=80)
    plt.close(fig)


USAGE = "usage: table.py WORK_DIR PAPER_CSV [--second-seeds] [--out OUT]"


def main(argv: list[str]) -> None:
    positional, mode, out = [], None, None
    args = iter(argv)
    for arg in args:
        if arg == "--second-seeds":
            mode = arg
        elif arg == "--out":
            out = next(args, None)
            if out is None:
                raise SystemExit(f"--out needs a directory; {USAGE}")
        elif arg.startswith("-"):
            raise SystemExit(f"unknown option {arg}; {USAGE}")
        else:
            positional.append(arg)
    if len(positional) != 2:
        raise SystemExit(USAGE)
    work, paper_csv = Path(positional[0]), positional[1]
    paper = {r["row"]: r for r in csv.DictReader(open(paper_csv, encoding="utf-8"))}
    rows = finished_runs(work)
    if mode == "--second-seeds":
        for spec in second_seeds(rows):
            print(spec)
        return
    if not rows:
        raise SystemExit(f"{work}/rows: no finished row yet")
    if out is not None:
        work = Path(out)
        work.mkdir(parents=True, exist_ok=True)
    order = [n for n in paper if n in rows] + sorted(n for n in rows if n not in paper)
    rows = {n: rows[n] for n in order}
    table = [summary(n, rows[n]) for n in order]
    spread = spreads(rows)
    verdicts(table, spread)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, COLUMNS + ["paper_ppl", "paper_bleu"], lineterminator="\n", extrasaction="ignore")
    writer.writeheader()
    for r in table:
        writer.writerow({**r, "paper_ppl": paper.get(r["row"], {}).get("ppl", ""),
                         "paper_bleu": paper.get(r["row"], {}).get("bleu", "")})
    atomic_write_text(work / "table.csv", buf.getvalue())
    curves = io.StringIO()
    curves.write("run,update,val_nll,val_ppl\n")
    cpu = io.StringIO()
    cpu.write("run\tupdates\tcpu_s\n")
    for runs in rows.values():
        for spec, run in runs.items():
            curves.writelines(f"{spec},{u},{nll:.4f},{math.exp(nll):.2f}\n" for u, nll in run["curve"])
            cpu.write(f"{spec}\t{run['updates']}\t{run['cpu_s']:.0f}\n")
    total = sum(run["cpu_s"] for runs in rows.values() for run in runs.values())
    cpu.write(f"total\t\t{total:.0f}\n")
    atomic_write_text(work / "curves.csv", curves.getvalue())
    atomic_write_text(work / "cpu.tsv", cpu.getvalue())
    text = markdown(table, paper, spread) + machines(rows)
    atomic_write_text(work / "table.md", text)
    claims = claims_markdown(claim_verdicts(table, paper, spread))
    atomic_write_text(work / "claims.md", claims)
    text += "\n" + claims
    print(f"\n{text}\nCPU time, all runs: {total / 3600:.2f} h\n"
          f"table: {work / 'table.md'}, {work / 'table.csv'}; claims: {work / 'claims.md'}; curves: {work / 'curves.csv'}; CPU: {work / 'cpu.tsv'}")
    try:
        plot_table(table, work / "table.png")
        plot_curves(rows, work / "curves.png")
        print(f"plots: {work / 'table.png'}, {work / 'curves.png'}")
    except ImportError:
        print("no plots: matplotlib is not installed (pip install 'xformer-cli[plot]')", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1:])
