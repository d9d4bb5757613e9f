"""``xf`` commands from a bench script, run as a user runs them: through the CLI entry (the YAML
section and flags, the frame's output guard, one-line errors), in this process.

Bench scripts import the library for what they measure and run whole commands only this way,
never by importing a command module (tests/test_layout.py checks it).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's xformer_cli


def xf(*args: object) -> None:
    """Run ``xf ARGS...``; a failing command exits the script with its code (and its one-line
    error, already printed), as ``set -e`` would in a shell script."""
    from xformer_cli.cli import app

    try:
        app([str(a) for a in args], prog_name="xf")
    except SystemExit as e:  # the CLI always exits, 0 included
        if e.code not in (0, None):
            raise


def write_report(text: str, out: Path | None, name: str) -> None:
    """Print a bench's Markdown report and write it to OUT/NAME (OUT: a new temporary folder when None)."""
    import tempfile
    out = out or Path(tempfile.mkdtemp(prefix="xf-bench-out-"))
    out.mkdir(parents=True, exist_ok=True)
    (out / name).write_text(text, encoding="utf-8")
    print(text)
    print(f"written: {out / name}")
