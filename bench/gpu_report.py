"""Collect what bench/gpu.sh has written so far into DIR/results.json and DIR/results.md.

    python bench/gpu_report.py DIR           after every stage: a run cut short still leaves a
                                             readable table of what it measured
    python bench/gpu_report.py --info FILE   the environment: GPU, driver, torch, CUDA, cuDNN,
                                             NCCL, Triton, Python, numpy, the commit

Reads DIR/info.json, DIR/stages.jsonl (one line per stage: name, exit code, seconds, status),
DIR/cuda-tests.xml (pytest's JUnit XML; where pytest was cut short before writing it, the
outcomes in DIR/cuda-tests.log, which pytest -v writes as each test ends) and the rows of every
other DIR/*.json.
"""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def command_output(args: list[str]) -> str:
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return ""


def environment() -> dict:
    """What the figures were measured on. Version-sensitive torch APIs: torch.cuda.nccl.version()
    (a tuple since torch 1.x, an int before) and torch.backends.cudnn.version(): both guarded."""
    import numpy
    import torch

    info = {"torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
            "numpy": numpy.__version__, "cpus": os.cpu_count(), "dry run": os.environ.get("XF_BENCH_DRY_RUN") == "1"}
    commit = command_output(["git", "-C", str(REPO), "describe", "--always", "--dirty"])
    data_commit = Path(os.environ.get("XF_GPU_DATA", REPO / "bench" / "gpu-data")) / "commit.txt"
    info["commit"] = commit or (data_commit.read_text().strip() + " (bench/gpu-data/commit.txt)"
                                if data_commit.exists() else "unknown")
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = "not installed"
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info.update(gpu=p.name, gpu_memory_gib=round(p.total_memory / 2**30, 1), gpus=torch.cuda.device_count(),
                    capability=".".join(map(str, torch.cuda.get_device_capability())),
                    bf16=torch.cuda.is_bf16_supported(),
                    driver=command_output(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]))
        try:
            info["cudnn"] = torch.backends.cudnn.version()
        except Exception as e:  # noqa: BLE001 - a report must not fail on a missing library
            info["cudnn"] = f"unavailable ({e})"
        try:
            nccl = torch.cuda.nccl.version()
            info["nccl"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
        except Exception as e:  # noqa: BLE001
            info["nccl"] = f"unavailable ({e})"
    flags = set(Path("/proc/cpuinfo").read_text().split()) if Path("/proc/cpuinfo").exists() else set()
    info["cpu_flags"] = " ".join(sorted(flags & {"avx2", "avx512f", "avx512_bf16", "amx_bf16"}))
    return info


def test_counts(xml: Path) -> dict:
    if not xml.exists():
        return tests_from_log(xml.with_suffix(".log"))
    try:
        root = ET.parse(xml).getroot()
    except ET.ParseError:
        return tests_from_log(xml.with_suffix(".log"))
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


def tests_from_log(log: Path) -> dict:
    """The outcomes in the log when pytest wrote no JUnit XML: its -rA summary where it got that
    far, else the line pytest -v printed as each test ended (a stage cut short mid-test)."""
    if not log.exists():
        return {}
    text = log.read_text(errors="replace")
    found = re.findall(r"^(PASSED|FAILED|ERROR|SKIPPED)(?: \[\d+\])? (\S+)(?: - (.*))?$", text, re.MULTILINE)
    if not found:  # "tests/test_cuda.py::test_x[bf16] PASSED   [ 25%]"
        found = [(what, name, "")
                 for name, what in re.findall(r"^(\S+::\S+) (PASSED|FAILED|ERROR|SKIPPED)\b", text, re.MULTILINE)]
    cases = [{"name": name, "outcome": "passed" if what == "PASSED" else f"{what.lower()}: {(why or '')[:160]}"}
             for what, name, why in found]
    def count(prefix: str) -> int:
        return sum(c["outcome"].startswith(prefix) for c in cases)

    counts = dict(tests=len(cases), passed=count("passed"), failures=count("failed"), errors=count("error"),
                  skipped=count("skipped"), cases=cases,
                  note="from cuda-tests.log: pytest wrote no JUnit XML (cut short?); the tests that finished")
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
    order = {s["name"]: i for i, s in enumerate(stages)}  # rows in the order their stages ran
    for path in sorted(out.glob("*.json"), key=lambda p: (order.get(p.stem, len(order)), p.name)):
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
    md += ["", "## Stages", "", "| stage | status | exit | seconds | allowed |", "|---|---|---|---|---|"]
    md += [f"| {s['name']} | {s['status']} | {s['rc']} | {s['seconds']} | {s.get('allowed', '')} |" for s in stages]
    if tests:
        md += ["", "## CUDA tests (pytest -m cuda)", ""]
        if "error" in tests:
            md.append(tests["error"])
        else:
            md.append(f"{tests['passed']} passed, {tests['failures']} failed, {tests['errors']} errors, "
                      f"{tests['skipped']} skipped" + (f" ({tests['note']})" if tests.get("note") else ""))
            md += ["", "| test | outcome |", "|---|---|"]
            md += [f"| {c['name']} | {c['outcome']} |" for c in tests["cases"]]
    md += ["", "## Measurements", "", "| bench | case | metric | value | unit | ratio | note |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio = f"{r['ratio']:.2f}x" if r.get("ratio") else ""
        md.append(f"| {r['bench']} | {r['case']} | {r['metric']} | {fmt(r['value'])} | {r.get('unit', '')} | "
                  f"{ratio} | {r.get('note', '')} |")
    (out / "results.md").write_text("\n".join(md) + "\n")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--info"]:
        info = environment()
        Path(sys.argv[2]).write_text(json.dumps(info, indent=1))
        print(info)
    else:
        main(Path(sys.argv[1]))
