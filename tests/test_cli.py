"""The CLI front end: version, help, one-line errors, YAML equivalents of every flag."""

import dataclasses
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from xformer_cli import __version__
from xformer_cli.cli import app
from xformer_cli.options import AverageOptions, PreprocessOptions, ScoreOptions, TrainOptions, TranslateOptions

runner = CliRunner()


def test_version():
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert __version__ in result.output


def test_python_dash_m_works():
    out = subprocess.run([sys.executable, "-m", "xformer_cli", "--version"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == f"xf {__version__}"


@pytest.mark.parametrize(
    "name,cls",
    [
        ("preprocess", PreprocessOptions),
        ("train", TrainOptions),
        ("average-checkpoints", AverageOptions),
        ("translate", TranslateOptions),
        ("score", ScoreOptions),
    ],
)
def test_every_option_is_a_flag(name, cls):
    result = runner.invoke(app, [name, "--help"], env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    for f in dataclasses.fields(cls):
        if not f.metadata.get("positional"):
            assert "--" + f.name.replace("_", "-") in result.output, f.name
    assert "--config" in result.output


def test_bad_config_is_one_line_error(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("train:\n  data: d\n  warmup: 10\n")
    result = runner.invoke(app, ["train", "--config", str(cfg)])
    assert result.exit_code == 2
    assert "did you mean 'warmup_updates'" in result.output
    assert "Traceback" not in result.output


def test_readme_quick_start_puts_xf_on_the_path():
    """Follow the README's Quick start: after `make venv`, `source .venv/bin/activate` gives `xf`."""
    import os
    import re
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    quick_start = (repo / "README.md").read_text(encoding="utf-8").split("## Quick start", 1)[1].split("\n## ", 1)[0]
    commands = [line.split("#")[0].strip() for block in re.findall(r"```bash\n(.*?)```", quick_start, re.S)
                for line in block.splitlines()]
    assert "make venv" in commands and "source .venv/bin/activate" in commands
    assert re.search(r"^VENV \?= \.venv$", (repo / "Makefile").read_text(), re.M)  # where make puts it
    activate = repo / ".venv" / "bin" / "activate"
    if not activate.exists():
        pytest.skip("no .venv here (xf installed into another environment, not by make)")
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if ".venv" not in p)
    out = subprocess.run(["bash", "-c", "source .venv/bin/activate && command -v xf && xf --version"], cwd=repo,
                         env={**os.environ, "PATH": path}, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [str(repo / ".venv" / "bin" / "xf"), f"xf {__version__}"]
