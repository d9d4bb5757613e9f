"""The shape of the package: commands over a library.

``xformer_cli/commands/`` holds one module per subcommand; they import the library, never each
other, and no library module imports a command. ``frame.py`` (the command table), ``cli.py``
(the Typer front end that registers it) and ``__main__`` are the only modules that name every
command. Bench scripts import the library for
what they measure and run whole commands through the CLI (``bench/xf_command.py``), never by
importing a command module.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "xformer_cli"
FRONT_END = {"cli", "frame", "__main__"}


def imported_modules(path: Path, source: str | None = None) -> set[str]:
    """Every ``xformer_cli`` module the module at ``path`` imports, as dotted names relative to
    the package (``commands.train``, ``model``), function-level imports included. ``path`` may
    lie outside the package (a bench script): then only its absolute imports count."""
    package = list(path.relative_to(PACKAGE).parts[:-1]) if path.is_relative_to(PACKAGE) else []
    found = set()
    source = path.read_text(encoding="utf-8") if source is None else source
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)] if node.level > 1 else package
                module = ".".join([*base, *([node.module] if node.module else [])])
                names = [module] if node.module else []
                names += [".".join(filter(None, [module, a.name])) for a in node.names]
            elif node.module and node.module.startswith("xformer_cli"):
                module = node.module[len("xformer_cli"):].lstrip(".")
                names = [module] + [".".join(filter(None, [module, a.name])) for a in node.names]
            else:
                continue
            found.update(n for n in names if n)
        elif isinstance(node, ast.Import):
            found.update(a.name[len("xformer_cli."):] for a in node.names if a.name.startswith("xformer_cli."))
    return found


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(PACKAGE).with_suffix("").parts)


def commands() -> list[Path]:
    return sorted(p for p in (PACKAGE / "commands").glob("*.py") if p.name != "__init__.py")


def library() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py")
                  if "commands" not in p.relative_to(PACKAGE).parts and p.stem not in FRONT_END)


def test_every_subcommand_has_its_module_in_commands():
    names = {p.stem for p in commands()}
    assert {"preprocess", "train", "average", "translate", "export", "score", "plot"} <= names


def test_no_library_module_imports_a_command():
    offenders = {module_name(p): sorted(m for m in imported_modules(p) if m.startswith("commands"))
                 for p in library()}
    assert {k: v for k, v in offenders.items() if v} == {}


def test_no_command_imports_another_command():
    offenders = {}
    for p in commands():
        me = module_name(p)
        others = sorted(m for m in imported_modules(p)
                        if m.startswith("commands.") and not (m == me or m.startswith(me + ".")))
        if others:
            offenders[me] = others
    assert offenders == {}


def test_the_checker_sees_command_imports():
    """The check itself can fail: relative, absolute and function-level imports of a command."""
    source = ("from __future__ import annotations\n\ndef f():\n    from .train import train\n"
              "    from ..commands.export import x\n    import xformer_cli.commands.score\n")
    found = imported_modules(PACKAGE / "commands" / "translate.py", source)
    assert {"commands.train", "commands.export", "commands.score"} <= found
    found = imported_modules(PACKAGE / "model" / "transformer.py", "from ..commands import plot\n")
    assert "commands.plot" in found


def test_no_bench_script_imports_a_command():
    offenders = {p.name: sorted(m for m in imported_modules(p) if m.split(".")[0] == "commands")
                 for p in sorted((REPO / "bench").glob("*.py"))}
    assert {k: v for k, v in offenders.items() if v} == {}


def test_the_checker_sees_a_bench_scripts_command_imports():
    source = ("import xformer_cli.commands.train as t\nfrom xformer_cli import commands\n"
              "def f():\n    from xformer_cli.commands.preprocess import preprocess\n")
    found = imported_modules(REPO / "bench" / "x.py", source)
    assert {"commands.train", "commands", "commands.preprocess"} <= found
    assert imported_modules(REPO / "bench" / "x.py", "from xformer_cli.train.setup import set_up\n") == {
        "train.setup", "train.setup.set_up"}


def test_only_the_front_end_names_the_command_modules():
    """The table names each command's module as a string, imported when the command runs; no
    library module does, so that none can reach a command by a path the import check misses."""
    offenders = [module_name(p) for p in library() if '"commands.' in p.read_text(encoding="utf-8")
                 or "'commands." in p.read_text(encoding="utf-8") or "xformer_cli.commands" in p.read_text(encoding="utf-8")]
    assert offenders == []
    assert 'f"xformer_cli.commands.{module}"' in (PACKAGE / "frame.py").read_text(encoding="utf-8")



def import_graph() -> dict[str, set[str]]:
    """Every package module -> the package modules it imports (function-level and type-checking
    imports included: a circle closed inside a function is still a circle)."""
    modules = {module_name(p).removesuffix(".__init__"): p for p in PACKAGE.rglob("*.py")}
    return {m: {n for n in imported_modules(p) if n in modules and n != m} for m, p in modules.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_package_imports_without_circles():
    assert circles(import_graph()) == []


def test_the_circle_finder_sees_a_circle_closed_inside_a_function():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [["a", "b", "c"]]
    source = "def f():\n    from .engines import XfEngine\n"
    assert "decode.engines" in imported_modules(PACKAGE / "decode" / "workers.py", source)


def json_parses(source: str) -> list[int]:
    """The lines where ``source`` parses JSON without the one reader: a call of json.load or
    json.loads (also as ``from json import loads``), or a json.JSONDecoder made."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module == "json" and \
                any(a.name in ("load", "loads", "JSONDecoder") for a in node.names):
            found.append(node.lineno)
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "json" \
                and node.attr in ("load", "loads", "JSONDecoder"):
            found.append(node.lineno)
    return found


def test_every_json_text_is_read_by_the_one_reader():
    """Only ``json_input.py`` parses JSON: every file, line and body xf reads goes through its
    ``parse_json`` (nesting at most 64 deep, every number finite), never json.loads directly."""
    offenders = {module_name(p): json_parses(p.read_text(encoding="utf-8"))
                 for p in sorted(PACKAGE.rglob("*.py")) if p.name != "json_input.py"}
    assert {k: v for k, v in offenders.items() if v} == {}


def test_the_json_checker_sees_a_direct_parse():
    assert json_parses("import json\nx = json.loads(t)\n") == [2]
    assert json_parses("from json import loads\n") == [1]
    assert json_parses("import json\nf = json.load\n") == [2]
    assert json_parses("import json\njson.dumps(x)\n") == []


def test_no_library_module_imports_the_front_end():
    """The library sits below the command table and the CLI: no library module imports ``cli``,
    ``frame`` or ``__main__`` (the command modules are checked above)."""
    graph = import_graph()
    offenders = {m: sorted(graph[m] & FRONT_END) for m in (module_name(p).removesuffix(".__init__") for p in library())}
    assert {k: v for k, v in offenders.items() if v} == {}


def test_the_search_does_not_import_the_trainer():
    """--compile's helpers live in base/compiling.py: the search and its step import nothing of
    train/update.py, function-level imports included (the search once did, for them)."""
    graph = import_graph()
    step = graph["decode.search"] | graph["decode.decoder_step"]
    assert "train.update" not in step and "base.compiling" in graph["decode.decoder_step"]


def test_test_modules_import_only_the_package_and_helpers():
    """What two test modules share lives in tests/helpers.py: a test module imports from tests/
    nothing but ``helpers`` (conftest.py's fixtures reach them through pytest), so no test depends
    on another test module's collection, fixtures or import side effects."""
    tests = REPO / "tests"
    local = {p.stem for p in tests.glob("*.py")} - {"helpers"}
    offenders = {}
    for path in sorted(tests.glob("*.py")):
        names = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names.add(node.module.split(".")[0])
            elif isinstance(node, ast.Import):
                names.update(a.name.split(".")[0] for a in node.names)
        if names & local:
            offenders[path.name] = sorted(names & local)
    assert offenders == {}


def test_no_function_of_the_package_is_over_80_lines():
    """Functions you can read whole (STYLE.md item 11): the longest, decorators excluded, fit in 80 lines."""
    long = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > 80:
                long.append(f"{module_name(path)}.{node.name}: {node.end_lineno - node.lineno + 1} lines")
    assert long == []


# The wings: which may import which. A wing imports only the wings listed for it (its own modules
# freely); the front end (cli, frame, __main__, the package's __init__) and commands/ import any.
WINGS = {
    "base": set(),
    "text": {"base"},
    "settings": {"base", "text"},
    "model": {"base", "text", "settings"},
    "data": {"base", "text", "settings"},
    "decode": {"base", "text", "settings", "model", "data"},
    "train": {"base", "text", "settings", "model", "data", "decode"},
    "formats": {"base", "text", "settings", "model", "data", "decode"},
    "serve": {"base", "text", "settings", "model", "data", "decode"},
}


def wing_of(module: str) -> str | None:
    head = module.split(".")[0]
    return head if head in WINGS else None


def wing_offences(graph: dict[str, set[str]]) -> dict[str, list[str]]:
    """Each module's imports of a wing its own wing may not import."""
    found = {}
    for module, imported in graph.items():
        wing = wing_of(module)
        if wing is None:
            continue
        bad = sorted(m for m in imported if wing_of(m) not in (None, wing) and wing_of(m) not in WINGS[wing])
        bad += sorted(m for m in imported if wing_of(m) is None and m.split(".")[0] in FRONT_END | {"commands"})
        if bad:
            found[module] = bad
    return found


def test_every_module_lives_in_a_wing():
    """The package's top level holds only the front end; every library module is in a wing, and
    each wing says what it owns in its docstring."""
    top = sorted(p.stem for p in PACKAGE.glob("*.py"))
    assert top == ["__init__", "__main__", "cli", "frame"]
    wings = sorted(p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").is_file())
    assert wings == sorted([*WINGS, "commands"])
    for wing in WINGS:
        doc = ast.get_docstring(ast.parse((PACKAGE / wing / "__init__.py").read_text(encoding="utf-8")))
        assert doc and len(doc) > 60, f"{wing}/__init__.py says what the wing owns"


def test_each_wing_imports_only_the_wings_below_it():
    assert wing_offences(import_graph()) == {}


def test_the_wing_rule_is_a_layering():
    """No two wings may import each other, through any chain of allowed imports."""
    def below(wing, seen=()):
        return set().union(*({w} | below(w, seen + (wing,)) for w in WINGS[wing] if w not in seen))
    assert all(w not in below(w) for w in WINGS)


def test_the_wing_checker_sees_an_upward_import():
    graph = {"text.vocab": {"decode.search", "base.errors"}, "base.errors": {"frame"}, "decode.search": {"model.transformer"}}
    assert wing_offences(graph) == {"text.vocab": ["decode.search"], "base.errors": ["frame"]}
    source = "def f():\n    from ..serve.server import Server\n"
    assert "serve.server" in imported_modules(PACKAGE / "decode" / "search.py", source)
