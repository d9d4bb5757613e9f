"""Table 3 of the ablation recipe from its finished rows: table.md, table.csv and table.png.

    python table.py WORK_DIR PAPER_CSV

A row is finished when WORK_DIR/rows/NAME/val.score.json exists. Its configuration, parameter
count and updates come from its checkpoints/train_log.jsonl (the last 'start' record, the last
'valid' record: perplexity exp(nll) per target subword on val), its BLEU from the score file.
The Markdown leaves a cell blank where the row equals the base row, as the paper's table does.
Run by run.sh with xf's interpreter; the plot is skipped, saying why, without matplotlib.
"""

from __future__ import annotations

import csv
import io
import json
import sys
from pathlib import Path

from xformer_cli.fileio import atomic_write, atomic_write_text

COLUMNS = ["row", "N", "d_model", "d_ff", "h", "d_k", "d_v", "P_drop", "eps_ls", "train_steps", "params_M",
           "ppl", "bleu"]
CONFIG_COLUMNS = COLUMNS[1:10]


def last(path: Path, kind: str) -> dict:
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    found = [r for r in records if r.get("type") == kind]
    if not found:
        raise SystemExit(f"{path}: no '{kind}' record (did the row's training finish?)")
    return found[-1]


def row_of(name: str, directory: Path) -> dict:
    log = directory / "checkpoints" / "train_log.jsonl"
    start, valid = last(log, "start"), last(log, "valid")
    o = start["options"]
    layers = o["encoder_layers"] if o["encoder_layers"] == o["decoder_layers"] else f"{o['encoder_layers']}/{o['decoder_layers']}"
    bleu = json.loads((directory / "val.score.json").read_text(encoding="utf-8"))["bleu"]["score"]
    return {"row": name, "N": layers, "d_model": o["d_model"], "d_ff": o["d_ff"], "h": o["heads"],
            "d_k": o["head_dim"], "d_v": o["head_dim"], "P_drop": o["dropout"], "eps_ls": o["label_smoothing"],
            "train_steps": valid["update"], "params_M": round(start["parameters"] / 1e6, 2),
            "ppl": round(valid["ppl"], 2), "bleu": round(bleu, 2)}


def markdown(rows: list[dict], paper: dict[str, dict]) -> str:
    head = ["row", *CONFIG_COLUMNS, "params (M)", "val ppl", "val BLEU", "paper ppl", "paper BLEU"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    base = next((r for r in rows if r["row"] == "base"), None)
    for r in rows:
        cells = [r["row"]]
        for c in CONFIG_COLUMNS:
            same = base is not None and r is not base and str(r[c]) == str(base[c])
            cells.append("" if same else str(r[c]))
        p = paper.get(r["row"], {})
        cells += [f"{r['params_M']:.2f}", f"{r['ppl']:.2f}", f"{r['bleu']:.2f}", p.get("ppl", ""), p.get("bleu", "")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["row"] for r in rows]
    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(max(6.0, 0.45 * len(rows) + 2), 5.5))
    for ax, key, label in ((top, "bleu", "val BLEU (beam 4)"), (bottom, "ppl", "val perplexity")):
        values = [r[key] for r in rows]
        colors = ["C3" if n == "base" else "C0" for n in names]
        ax.bar(range(len(rows)), values, color=colors)
        if "base" in names:
            ax.axhline(values[names.index("base")], color="C3", lw=0.8, ls="--", label="base")
            ax.legend(loc="upper right", fontsize=8, frameon=False)
        ax.set_ylabel(label)
        ax.grid(axis="y", alpha=0.3)
    bottom.set_xticks(range(len(rows)), names, rotation=60, ha="right", fontsize=8)
    top.set_title(f"Table 3, scaled down: Multi30k EN-DE val, {rows[0]['train_steps']} updates a row (big: 3x)")
    fig.tight_layout()
    with atomic_write(path, "wb") as f:
        fig.savefig(f, format="png", dpi=110)
    plt.close(fig)


def main(work_dir: str, paper_csv: str) -> None:
    work = Path(work_dir)
    paper = {r["row"]: r for r in csv.DictReader(open(paper_csv, encoding="utf-8"))}
    done = {d.name: d for d in sorted((work / "rows").glob("*")) if (d / "val.score.json").exists()}
    order = [n for n in paper if n in done] + sorted(n for n in done if n not in paper)
    rows = [row_of(n, done[n]) for n in order]
    if not rows:
        raise SystemExit(f"{work}/rows: no finished row yet")
    buf = io.StringIO()
    writer = csv.DictWriter(buf, COLUMNS + ["paper_ppl", "paper_bleu"], lineterminator="\n")
    writer.writeheader()
    for r in rows:
        writer.writerow({**r, "paper_ppl": paper.get(r["row"], {}).get("ppl", ""),
                         "paper_bleu": paper.get(r["row"], {}).get("bleu", "")})
    atomic_write_text(work / "table.csv", buf.getvalue())
    table = markdown(rows, paper)
    atomic_write_text(work / "table.md", table)
    print(f"\n{table}\ntable: {work / 'table.md'}, {work / 'table.csv'}")
    try:
        plot(rows, work / "table.png")
        print(f"plot: {work / 'table.png'}")
    except ImportError:
        print("no plot: matplotlib is not installed (pip install 'xformer-cli[plot]')", file=sys.stderr)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit("usage: table.py WORK_DIR PAPER_CSV")
    main(*sys.argv[1:])
