"""The CLI front end: version, help, one-line errors, YAML equivalents of every flag."""

import dataclasses
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from xformer_cli import __version__
from xformer_cli.cli import COMMANDS, app

runner = CliRunner()


def test_version():
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert __version__ in result.output


@pytest.mark.slow
def test_python_dash_m_works():
    out = subprocess.run([sys.executable, "-m", "xformer_cli", "--version"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == f"xf {__version__}"


EVERY_COMMAND = pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c.words)


@EVERY_COMMAND
def test_every_option_is_a_flag(command):
    cls = command.options
    result = runner.invoke(app, [*command.words.split(), "--help"], env={"COLUMNS": "300"})
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


@pytest.mark.slow
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
# -- usage errors, help, list options ------------------------------------------------------------
@pytest.mark.parametrize("args,message", [
    (["train", "--no-such-flag"], "No such option: --no-such-flag"),
    (["average-checkpoints", "--output", "o.pt", "--num-update-checkpoints", "2", "3"], "unexpected extra argument"),
    (["train", "--max-tokens"], "requires an argument"),
    (["trian"], "No such command 'trian'"),
    (["train", "--max-tokens", "many"], "Invalid value for '--max-tokens'"),
])
def test_usage_errors_are_one_line(args, message):
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("xf: error: ") and message in lines[0], result.output
    assert "--help" in lines[0]  # says where to look


@EVERY_COMMAND
def test_help_at_80_columns_shows_full_names_and_marks_required(command):
    cls = command.options
    result = runner.invoke(app, [*command.words.split(), "--help"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    assert "…" not in result.output and "<bool>" not in result.output
    for f in dataclasses.fields(cls):
        flag = "--" + f.name.replace("_", "-")
        if f.metadata.get("positional"):
            flag = f.name.upper()
        elif f.type == "bool" or "bool" in str(f.type):
            assert f"--no-{flag[2:]}" in result.output
        assert flag in result.output, flag
        if f.default is dataclasses.MISSING:  # required: marked beside its help
            after = result.output[result.output.index("\n  " + flag) + 1:]  # its row, not the usage line or summary
            assert "[required" in after.split("\n  -")[0], flag
    assert max(map(len, result.output.splitlines())) <= 80


def run_capturing(monkeypatch, module: str, function: str, args: list[str]):
    """Invoke ``xf args`` with the library function replaced by one that records its options."""
    seen = []
    monkeypatch.setattr(f"xformer_cli.commands.{module}.{function}", seen.append)
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    (options,) = seen
    return options


def test_list_options_take_space_separated_values(monkeypatch, tmp_path):
    o = run_capturing(monkeypatch, "average", "average_checkpoints",
                      ["average-checkpoints", "--inputs", "a.pt", "b.pt", "c.pt", "--output", "avg.pt"])
    assert o.inputs == ("a.pt", "b.pt", "c.pt") and o.output == "avg.pt"
    # a number list ends at the first word that is not a number: here the positional DATA
    o = run_capturing(monkeypatch, "train", "train", ["train", "--adam-betas", "0.9", "0.98", "data-bin"])
    assert o.adam_betas == (0.9, 0.98) and o.data == "data-bin"
    o = run_capturing(monkeypatch, "train", "train", ["train", "d", "--adam-betas=0.8", "0.9", "--max-update", "3"])
    assert o.adam_betas == (0.8, 0.9) and o.max_update == 3
    # repeating the flag, and the YAML list, still work; flags win over YAML
    o = run_capturing(monkeypatch, "score", "score", ["score", "--ref", "r1", "--ref", "r2", "r3"])
    assert o.ref == ("r1", "r2", "r3")
    cfg = tmp_path / "c.yaml"
    cfg.write_text("train:\n  data: d\n  adam_betas: [0.9, 0.997]\n")
    o = run_capturing(monkeypatch, "train", "train", ["train", "--config", str(cfg)])
    assert o.adam_betas == (0.9, 0.997)
    o = run_capturing(monkeypatch, "train", "train", ["train", "--config", str(cfg), "--adam-betas", "0.5", "0.6"])
    assert o.adam_betas == (0.5, 0.6)


@pytest.mark.parametrize("args, words", [
    (["translate", "--path", "m.pt", "--refill"], "--refill was removed"),
    (["translate", "--path", "m.pt", "--no-refill"], "--refill was removed"),
    (["serve", "--model", "en-de=m.pt", "--refill", "8"], "--workers N decodes batches in parallel"),
    (["translate", "--path", "m.pt", "--compile", "--compile-mode=jit"], "--compile-mode was removed: --compile compiles"),
])
def test_a_removed_option_says_what_replaces_it(args, words):
    """On the command line: one line naming what replaces it, not click's "no such option"."""
    result = subprocess.run([sys.executable, "-m", "xformer_cli", *args], capture_output=True, text=True)
    assert result.returncode == 2 and words in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and result.stderr.startswith("xf: error: ")


@pytest.mark.parametrize("yaml_text, words", [
    ("translate: {path: [m.pt], refill: true}\n", "--refill was removed"),
    ("translate: {path: [m.pt], compile-mode: aot}\n", "--compile-mode was removed"),
])
def test_a_removed_yaml_key_says_what_replaces_it(tmp_path, yaml_text, words):
    from xformer_cli.frame import load_command_options
    from xformer_cli.base.errors import ConfigError
    from xformer_cli.settings.options import TranslateOptions

    (tmp_path / "xf.yaml").write_text(yaml_text)
    with pytest.raises(ConfigError, match=words) as caught:
        load_command_options(TranslateOptions, tmp_path / "xf.yaml", section="translate")
    assert str(caught.value).startswith(str(tmp_path / "xf.yaml")) and "\n" not in str(caught.value)
    # a value that stays is still a value: auto (the plan's rule by the CPU) is the default, x86 or fbgemm an override
    for engine in ("auto", "x86", "fbgemm"):
        (tmp_path / "ok.yaml").write_text(f"translate: {{path: [m.pt], quantize: int8, int8_engine: {engine}}}\n")
        assert load_command_options(TranslateOptions, tmp_path / "ok.yaml", section="translate").int8_engine == engine
