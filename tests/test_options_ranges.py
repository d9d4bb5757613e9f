"""Every numeric option of every command is finite and in its range: nan, inf,
-inf, -1, 0 and 10^30 on every int and float option, from flags and from YAML, are either in the
option's declared range or a one-line error naming the option, before anything is written."""

import dataclasses
import inspect
import math
import os
import re
import typing

import pytest
from typer.testing import CliRunner

from xformer_cli.settings import options as options_module
from xformer_cli import cli
from xformer_cli.cli import app
from xformer_cli.settings.config import ConfigError, Range, _is_optional, build_options, field_types
from xformer_cli.frame import load_command_options

runner = CliRunner()
HOSTILE = (math.nan, math.inf, -math.inf, -1, 0, 1e30)

NUMBERS = (int, float)


def flag(name):
    return "--" + name.replace("_", "-")


def numeric_fields(cls):
    for f in dataclasses.fields(cls):
        inner = _is_optional(field_types(cls)[f.name])[1]
        item = inner.__args__[0] if getattr(inner, "__origin__", None) is tuple else inner
        if item in NUMBERS:
            yield f, item


def required_arguments(cls):
    """Placeholder values for the required options of ``cls``: (command-line words, a dict)."""
    words, values = [], {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            continue
        inner = _is_optional(field_types(cls)[f.name])[1]
        value = typing.get_args(inner)[0] if typing.get_origin(inner) is typing.Literal else "x"
        words += [value] if f.metadata.get("positional") else [flag(f.name), value]
        values[f.name] = (value,) if typing.get_origin(inner) is tuple else value
    return words, values


# every command with a numeric option: its words, its options class, placeholders for what it requires
COMMANDS = {tuple(c.words.split()): (c.options, *required_arguments(c.options)) for c in cli.COMMANDS
            if any(True for _ in numeric_fields(c.options))}


def options_classes():
    return [c for _, c in inspect.getmembers(options_module, inspect.isclass)
            if dataclasses.is_dataclass(c) and c.__module__ == options_module.__name__]


def test_every_numeric_option_has_a_finite_range_holding_its_default():
    with_numbers = set()
    for cls in options_classes():
        for f, _ in numeric_fields(cls):
            with_numbers.add(cls)
            where = f.metadata.get("range")
            assert isinstance(where, Range), f"{cls.__name__}.{f.name} has no range"
            assert math.isfinite(where.lo) and math.isfinite(where.hi) and where.hi < 1e30, (cls, f.name)
            defaults = f.default if isinstance(f.default, tuple) else (f.default,)
            assert all(d is None or where.problem(d) is None for d in defaults), (cls, f.name)
    # every options class with a number is a command's, swept below (ModelConfig's reach it through
    # xf train's, DecodingOptions' through xf translate's and xf serve's)
    assert with_numbers - {options_module.ModelConfig, options_module.DecodingOptions} <= \
        {cls for cls, _, _ in COMMANDS.values()}
    assert {"train", "translate", "preprocess"} <= {" ".join(w) for w in COMMANDS}


def sweep():
    for words, (cls, _, base) in COMMANDS.items():
        for f, item in numeric_fields(cls):
            for value in HOSTILE:
                yield words, cls, base, f, item, value


@pytest.mark.parametrize("words", list(COMMANDS), ids=" ".join)
def test_out_of_range_values_are_refused_naming_the_option_and_in_range_ones_are_not(words):
    cls, _, base = COMMANDS[words]
    swept = 0
    for f, item in numeric_fields(cls):
        extra = {"lr_scheduler": "inverse_sqrt", "lr": 1e-3} if f.name in ("lr", "warmup_init_lr") else {}
        for value in HOSTILE:
            if item is int and isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
                continue  # not an int at all: coerce's type error (swept on the command line below)
            value = int(value) if item is int else value
            values = {**base, **extra, f.name: (value, value) if f.name == "adam_betas" else value}
            swept += 1
            if f.metadata["range"].problem(value) is None:
                try:
                    build_options(cls, values, "sweep")
                except ConfigError as e:  # a rule between options may object, never the range
                    assert f"{flag(f.name)} must" not in str(e), (f.name, value, e)
            else:
                with pytest.raises(ConfigError, match=f"^sweep: {flag(f.name)} must .*, got "):
                    build_options(cls, values, "sweep")
    assert swept > 0


@pytest.mark.slow  # over a second for train (some 200 invocations); the in-process sweep above is fast
@pytest.mark.parametrize("words", list(COMMANDS), ids=" ".join)
def test_the_command_line_refuses_them_in_one_line_before_writing_anything(words, tmp_path, monkeypatch):
    cls, required, _ = COMMANDS[words]
    monkeypatch.chdir(tmp_path)
    for f, item in numeric_fields(cls):
        for value in HOSTILE:
            if item is int and math.isfinite(value):
                value = int(value)  # 10^30 as an int: 1 and 30 zeros
            text = str(value)
            if math.isfinite(value) and f.metadata["range"].problem(value) is None:
                continue  # in range: the command would run
            result = runner.invoke(app, [*words, *required, flag(f.name), text])
            err = result.stderr.strip()
            assert result.exit_code == 2, (f.name, text, result.output)
            assert len(err.splitlines()) == 1 and flag(f.name) in err and "Traceback" not in err, (f.name, text, err)
            assert os.listdir(tmp_path) == [], (f.name, text, os.listdir(tmp_path))


@pytest.mark.parametrize("text,what", [
    ("max_tokens: 100000000000000000000000\n", "--max-tokens must be at most 2147483647, got 100000000000000000000000"),
    ("lr_factor: .nan\n", "--lr-factor must be a finite number in (0, 1000], got nan"),
    ("train:\n  clip_norm: .inf\n", "--clip-norm must be a finite number"),
    ("adam_eps: -1\n", "--adam-eps must be positive, got -1 (range (0, 1])"),
])
def test_yaml_numbers_obey_the_same_ranges(tmp_path, text, what):
    (tmp_path / "c.yaml").write_text(text)
    with pytest.raises(ConfigError, match=re.escape(f"c.yaml: {what}")):
        load_command_options(options_module.TrainOptions, tmp_path / "c.yaml", {"data": "d"}, section="train")
