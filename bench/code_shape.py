"""The shape of the code, in figures: line counts (package, tests, docs), the wings (subpackage:
modules, lines), the ten longest functions, and the import graph (modules, imports, the longest
import chain, circles).

    python bench/code_shape.py [REPO]

Reads source only; imports nothing of xf. Run it before and after a restructuring and compare.
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path


def lines(paths) -> int:
    return sum(len(p.read_text(encoding="utf-8").splitlines()) for p in paths)


def module_name(package: Path, path: Path) -> str:
    return ".".join(path.relative_to(package).with_suffix("").parts).removesuffix(".__init__")


def imports(package: Path, path: Path, modules: set[str]) -> set[str]:
    """The package modules ``path`` imports, function-level imports included."""
    here = list(path.relative_to(package).parts[:-1])
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - (node.level - 1)]
                module = ".".join([*base, *([node.module] if node.module else [])])
            elif node.module and node.module.startswith("xformer_cli"):
                module = node.module[len("xformer_cli"):].lstrip(".")
            else:
                continue
            for alias in node.names:
                name = ".".join(filter(None, [module, alias.name]))
                found.add(name if name in modules else module)
        elif isinstance(node, ast.Import):
            found.update(a.name[len("xformer_cli."):] for a in node.names if a.name.startswith("xformer_cli."))
    return {m for m in found if m in modules}


def longest_chain(graph: dict[str, set[str]]) -> list[str]:
    """The longest path of imports (the graph has no circles; a circle's modules are skipped)."""
    best: dict[str, list[str]] = {}

    def visit(m: str, seen: frozenset) -> list[str]:
        if m in best:
            return best[m]
        tails = [visit(n, seen | {m}) for n in sorted(graph[m]) if n not in seen]
        best[m] = [m] + max(tails, key=len, default=[])
        return best[m]

    return max((visit(m, frozenset()) for m in sorted(graph)), key=len)


def main(repo: Path) -> None:
    package = repo / "xformer_cli"
    files = sorted(p for p in package.rglob("*.py"))
    modules = {module_name(package, p): p for p in files}
    graph = {m: imports(package, p, set(modules)) - {m} for m, p in modules.items()}
    print(f"package {lines(files)} lines in {len(files)} files; tests {lines((repo / 'tests').rglob('*.py'))}; "
          f"docs {lines((repo / 'docs').rglob('*.md'))} (+ README {lines([repo / 'README.md'])})")
    wings = defaultdict(list)
    for m, p in modules.items():
        parts = p.relative_to(package).parts
        wings[parts[0] if len(parts) > 1 else "(top)"].append(p)
    print("\nwing | modules | lines")
    for wing, paths in sorted(wings.items()):
        names = ", ".join(sorted(p.stem for p in paths if p.stem != "__init__"))
        print(f"{wing} | {names} | {lines(paths)}")
    functions = []
    for m, p in modules.items():
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                functions.append((node.end_lineno - node.lineno + 1, f"{m}.{node.name}"))
    print("\nten longest functions:", "; ".join(f"{name} {n}" for n, name in sorted(functions, reverse=True)[:10]))
    edges = sum(len(v) for v in graph.values())
    chain = longest_chain(graph)
    print(f"\nimport graph: {len(graph)} modules, {edges} imports, longest chain {len(chain)} modules: "
          + " -> ".join(chain))


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parents[1]))
