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
