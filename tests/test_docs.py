"""The manual: a short README over a docs tree, an option reference generated from the code, and
links that lead somewhere."""

from __future__ import annotations

import re
from pathlib import Path

from xformer_cli.cli import COMMANDS, options_reference

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"


def test_the_option_reference_is_current():
    """docs/options.md is what `make docs` writes from the options classes today."""
    assert (DOCS / "options.md").read_text(encoding="utf-8") == options_reference(), \
        "docs/options.md is stale: run `make docs`"


def test_the_option_reference_names_every_field_of_every_command():
    import dataclasses

    text = options_reference()
    for command in COMMANDS:
        part = text.split(f"## xf {command.words}\n", 1)[1].split("\n## ", 1)[0]
        assert f"YAML section: `{command.section}:`" in part
        for f in dataclasses.fields(command.options):
            assert f"| `{f.name}` |" in part, (command.words, f.name)


def test_the_reference_would_see_a_new_option(monkeypatch):
    """The staleness test can fail: a field added to an options class changes the reference."""
    import dataclasses

    from xformer_cli.settings.config import option

    extended = dataclasses.make_dataclass("Extended", [("brand_new", int, option(7, "a new knob"))],
                                          bases=(COMMANDS[0].options,), frozen=True)
    assert "| `--brand-new` | `brand_new` | int | 7 | a new knob |" in options_reference(
        [dataclasses.replace(COMMANDS[0], options=extended)])


def anchors(path: Path) -> set[str]:
    """GitHub's anchors of a Markdown file's headings."""
    out, in_code = set(), False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if not in_code and re.match(r"^#{1,6} ", line):
            title = line.lstrip("#").strip().lower()
            out.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return out


def test_readme_is_short_and_every_link_of_the_manual_leads_somewhere():
    readme = REPO / "README.md"
    assert len(readme.read_text(encoding="utf-8").splitlines()) <= 300
    broken = []
    for page in [readme, *sorted(DOCS.glob("*.md"))]:
        text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"^[a-z]+://", target):
                continue
            file, _, anchor = target.partition("#")
            dest = (page.parent / file).resolve() if file else page
            if not dest.exists():
                broken.append(f"{page.name}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{page.name}: {target} (no such heading)")
    assert broken == []


def test_no_page_speaks_of_the_machines_it_was_built_on():
    for page in [REPO / "README.md", *DOCS.glob("*.md")]:
        text = page.read_text(encoding="utf-8")
        assert "these machines" not in text and "the machines here" not in text, page.name
    assert "../shared" not in (REPO / "README.md").read_text(encoding="utf-8")


def test_no_page_test_or_comment_cites_an_internal_issue():
    """The manual and the code speak to users: the tracker's numbers are not theirs (a public
    project's own bug numbers, 'fairseq #4332', are fine: they name the project)."""
    internal = re.compile(r"\b[Ii]ssues? (?:#)?\d+|(?<![\w-])#\d+\b(?!\])")
    public = re.compile(r"[A-Za-z][\w.-]*(?:/[\w.-]+)? #\d+")  # "fairseq #4332", "marian-dev #931"
    offenders = []
    for path in [REPO / "README.md", *DOCS.glob("*.md"), *(REPO / "xformer_cli").rglob("*.py"),
                 *(REPO / "tests").glob("*.py"), *(REPO / "bench").glob("*.py"), *(REPO / "recipes").rglob("*.sh")]:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            hits = [m.group(0) for m in internal.finditer(public.sub("", line))]
            if hits and path.name != "test_docs.py":
                offenders.append(f"{path.relative_to(REPO)}:{number}: {hits}")
    assert offenders == []
