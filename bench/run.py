"""make bench: run every bench/bench_*.py and bench/decode.py and print one table.

Each module has ``rows() -> list[dict]`` with keys: bench, case, metric, value, unit and optionally
ratio (against a reference measured in the same run) and note. Benchmarks measure; they never
pass or fail on a time. Select modules with BENCH=model,preprocess (default: all); results are
also written to bench/results.json (ignored by git).
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

HERE = Path(__file__).resolve().parent


def main() -> None:
    wanted = {w for w in os.environ.get("BENCH", "").split(",") if w}
    console = Console(stderr=True)
    rows: list[dict] = []
    for path in [*sorted(HERE.glob("bench_*.py")), HERE / "decode.py"]:
        name = path.stem.removeprefix("bench_")
        if wanted and name not in wanted:
            continue
        console.print(f"[bold]running {path.name}[/bold]")
        spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[path.stem] = module
        spec.loader.exec_module(module)
        start = time.perf_counter()
        rows.extend(module.rows())
        console.print(f"  {path.name}: {time.perf_counter() - start:.0f}s")

    import torch

    machine = f"{platform.machine()}, {os.cpu_count()} cpus, torch {torch.__version__}, {torch.get_num_threads()} threads"
    table = Table(title=f"xf benchmarks ({machine})")
    for col in ("bench", "case", "metric", "value", "unit", "ratio", "note"):
        table.add_column(col, justify="right" if col in ("value", "ratio") else "left")
    for r in rows:
        value = r["value"]
        shown = f"{value:,.3g}" if isinstance(value, float) and abs(value) < 100 else f"{value:,.0f}" if isinstance(value, (int, float)) else str(value)
        ratio = r.get("ratio")
        table.add_row(r["bench"], r["case"], r["metric"], shown, r.get("unit", ""), f"{ratio:.2f}x" if ratio else "", r.get("note", ""))
    Console(width=200).print(table)
    (HERE / "results.json").write_text(json.dumps({"machine": machine, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
