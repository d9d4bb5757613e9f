"""Collect what bench/gpu.sh has written so far into DIR/results.json and DIR/results.md.

Run after every stage, so a run cut short still leaves a readable table of what it measured.
Reads DIR/info.json, DIR/stages.jsonl (one line per stage: name, exit code, seconds, status),
DIR/cuda-tests.xml (pytest's JUnit XML) and the rows of every other DIR/*.json.
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def test_counts(xml: Path) -> dict:
    if not xml.exists():
        return {}
    try:
        root = ET.parse(xml).getroot()
    except ET.ParseError:
        return {"error": "unreadable JUnit XML (pytest cut short?)"}
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    counts["cases"] = []
    for case in suite.iter("testcase"):
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = f"{child.tag}: {(child.get('message') or '')[:160]}"
        counts["cases"].append({"name": case.get("name"), "outcome": outcome})
    return counts


def fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:,.3g}" if abs(value) < 100 else f"{value:,.0f}"
    return str(value)


def main(out: Path) -> None:
    info = json.loads((out / "info.json").read_text()) if (out / "info.json").exists() else {}
    stages = [json.loads(line) for line in (out / "stages.jsonl").read_text().splitlines()] \
        if (out / "stages.jsonl").exists() else []
    rows = []
    for path in sorted(out.glob("*.json")):
        if path.name in ("info.json", "results.json"):
            continue
        try:
            rows += json.loads(path.read_text())["rows"]
        except (json.JSONDecodeError, KeyError):
            rows.append(dict(bench=path.stem, case="-", metric="unreadable", value="-", note=str(path)))
    tests = test_counts(out / "cuda-tests.xml")
    (out / "results.json").write_text(json.dumps(dict(info=info, stages=stages, tests=tests, rows=rows), indent=1))

    md = ["# xf on a GPU (bench/gpu.sh)", ""]
    md += [f"- {k}: {v}" for k, v in info.items()]
    md += ["", "## Stages", "", "| stage | status | exit | seconds |", "|---|---|---|---|"]
    md += [f"| {s['name']} | {s['status']} | {s['rc']} | {s['seconds']} |" for s in stages]
    if tests:
        md += ["", "## CUDA tests (pytest -m cuda)", ""]
        if "error" in tests:
            md.append(tests["error"])
        else:
            md.append(f"{tests['passed']} passed, {tests['failures']} failed, {tests['errors']} errors, "
                      f"{tests['skipped']} skipped")
            md += ["", "| test | outcome |", "|---|---|"]
            md += [f"| {c['name']} | {c['outcome']} |" for c in tests["cases"]]
    md += ["", "## Measurements", "", "| bench | case | metric | value | unit | ratio | note |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio = f"{r['ratio']:.2f}x" if r.get("ratio") else ""
        md.append(f"| {r['bench']} | {r['case']} | {r['metric']} | {fmt(r['value'])} | {r.get('unit', '')} | "
                  f"{ratio} | {r.get('note', '')} |")
    (out / "results.md").write_text("\n".join(md) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
