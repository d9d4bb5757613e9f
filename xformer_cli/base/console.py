"""What xf writes on stderr, for people and for machines.

On a terminal: rich's live progress and tables. Anywhere else (a cluster log, a pipe, a file):
one line per record, never wrapped at 80 columns, and tables flattened into one line each
(``title | name value | name value``), so that ``grep`` finds whole records. Rich's own switches
ask for the terminal output anyway: ``TTY_COMPATIBLE=1`` or ``FORCE_COLOR=1``.
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text


def stderr_console(quiet: bool = False) -> Console:
    """The console of a command's messages: stderr, and no wrapping unless stderr is a terminal."""
    console = Console(stderr=True, quiet=quiet)
    console.soft_wrap = not console.is_terminal
    return console


def table_line(table: Table) -> str:
    """A table as one line: its title, then each row, the cells named by their column headers."""
    headed = table.show_header and any(str(c.header) for c in table.columns)
    parts = [Text.from_markup(str(table.title)).plain] if table.title else []
    for i in range(table.row_count):
        cells = [_plain(list(c.cells)[i]) for c in table.columns]
        if headed:
            parts.append(", ".join(f"{c.header} {cell}".strip() for c, cell in zip(table.columns, cells) if cell))
        else:
            parts.append(" ".join(cell for cell in cells if cell))
    return " | ".join(parts)


def _plain(cell) -> str:
    return Text.from_markup(cell).plain if isinstance(cell, str) else Text.assemble(cell).plain if isinstance(cell, Text) else str(cell)


def print_table(console: Console, table: Table) -> None:
    """The table on a terminal; its one-line form anywhere else."""
    if console.is_terminal:
        console.print(table)
    else:
        console.print(table_line(table), markup=False, highlight=False, soft_wrap=True)


def print_summary(console: Console, title: str, rows: list[tuple[str, str]], values: str = "left") -> None:
    """A command's closing summary: a two-column table of (name, value) rows, printed as print_table
    does; ``values`` justifies the value column ("right" for columns of figures)."""
    table = Table(title=title, show_header=False)
    table.add_column()
    table.add_column(justify=values)
    for name, value in rows:
        table.add_row(name, value)
    print_table(console, table)


def warn(message: str) -> None:
    """A warning on stderr, one line, whatever the console: ``xf: warning: ...``."""
    import sys

    print(f"xf: warning: {' '.join(message.split())}", file=sys.stderr, flush=True)


def invalid_utf8_warning(where: str, count: int, first: int) -> None:
    """The warning of a reader that replaced invalid UTF-8 with U+FFFD (``vocab.decode_line``)."""
    if count:
        warn(f"{where}: {count} line(s) had invalid UTF-8, replaced with U+FFFD (first: line {first})")

