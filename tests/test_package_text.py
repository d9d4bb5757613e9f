"""What the package's text may hold: code states rules, docs keep figures (machine names and
measured ratios live in docs/benchmarks.md, never in a rule string or a comment), and
docs/development.md names every module of the tree, and no module that is gone."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "xformer_cli"
MACHINES = re.compile(r"\b(EPYC|Xeon|Ryzen|Threadripper|Sapphire Rapids|Cooper Lake|Ice Lake|Cascade Lake|Skylake|"
                      r"Zen ?\d|Graviton|Apple M\d)\b")
RATIO = re.compile(r"(?<![\w.])\d+(\.\d+)?(-\d+(\.\d+)?)?x(?!\w)")  # 1.4-1.8x, 2x, 0.78x (not 0x7f, 3x3, B x T)
RATE = re.compile(r"\d[\d,.]* ?(sent|sentences|tok|tokens|words|upd)/s\b")  # a measured rate, not a unit printed live


def figures(text: str) -> list[str]:
    return [m.group(0) for pattern in (MACHINES, RATIO, RATE) for m in pattern.finditer(text)]


def test_the_checker_sees_figures():
    assert figures("1.11-1.12x x86 in two runs on the AVX-512 EPYC") == ["EPYC", "1.11-1.12x"]
    assert figures("decoded at 0.78x; 2x faster; 1,200 sent/s on an AMX Xeon") == ["Xeon", "0.78x", "2x", "1,200 sent/s"]
    assert figures('B x T = 4096, 0x7f, a 3x3 grid, "{rate:.1f} sent/s", d_model x heads') == []


def test_no_machine_names_or_measurements_in_package_code():
    found = {str(p.relative_to(REPO)): figures(p.read_text(encoding="utf-8"))
             for p in sorted(PACKAGE.rglob("*.py"))}
    assert {k: v for k, v in found.items() if v} == {}, "move the figures to docs/benchmarks.md; name the rule"


def documented_modules() -> set[str]:
    """The module names docs/development.md's table gives (`x.py`, `commands/`' list)."""
    text = (REPO / "docs" / "development.md").read_text(encoding="utf-8")
    table = [line for line in text.splitlines() if line.startswith("| `")]
    names = {name for line in table for name in re.findall(r"`([\w/]+)\.py`", line.split("|")[1])}
    commands = next(line for line in table if line.startswith("| `commands/`"))
    names |= {f"commands/{name}" for name in re.findall(r"`(\w+)`", commands.split("|")[2])}
    return names


def test_development_md_names_every_module_of_the_tree():
    tree = {str(p.relative_to(PACKAGE).with_suffix("")) for p in PACKAGE.rglob("*.py") if p.stem != "__init__"}
    documented = documented_modules()
    assert sorted(tree - documented) == [], "modules docs/development.md does not name"
    assert sorted(documented - tree) == [], "docs/development.md names modules that are gone"
