"""Options as frozen dataclasses, filled from YAML and command-line flags (flags win).

Every subcommand has one options dataclass (``PreprocessOptions``, ``TrainOptions``, ...). Its
fields are the YAML keys, and the CLI generates one flag per field (``max_tokens`` is
``--max-tokens`` on the command line and ``max_tokens`` or ``max-tokens`` in YAML), so the two can
never drift apart. Unknown keys and wrong types fail loudly, naming the nearest valid key.

A YAML file is either flat (the keys of one subcommand) or split into sections named after the
subcommands, so one file can carry a whole experiment::

    preprocess: {bpe_vocab_size: 8000}
    train: {arch: small, max_update: 4000}
    translate: {beam: 4}
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from pathlib import Path
from typing import Any, Literal, Union

import yaml

from ..base.errors import ConfigError
from ..base.json_input import MAX_DIGITS

INT_MAX = 2**31 - 1  # the largest count any option needs; also what torch's and sentencepiece's int32 arguments hold


@dataclasses.dataclass(frozen=True)
class Range:
    """The values a numeric option takes: ``lo`` to ``hi``, each end closed unless ``*_open``.

    Every int and float option has one (``tests/test_options_ranges.py`` sweeps them all), with a
    finite ``hi``: no option takes nan, inf or 1e30, and no int overflows the int64 arithmetic
    it ends up in (a*|X|+b, token counts, seeds).
    """

    lo: float
    hi: float
    lo_open: bool = False
    hi_open: bool = False

    def problem(self, value: float) -> str | None:
        """Why ``value`` is not in the range (``must be at least 1``), or None when it is."""
        if isinstance(value, float) and not math.isfinite(value):  # an int is finite, and may be past a float's range
            return f"must be a finite number in {self}"
        above = value > self.lo if self.lo_open else value >= self.lo
        below = value < self.hi if self.hi_open else value <= self.hi
        if above and below:
            return None
        if above:  # too large
            return f"must be in {self}" if self.hi != INT_MAX else f"must be at most {INT_MAX}"
        if self.lo == 0:
            return "must be positive" if self.lo_open else "must not be negative"
        return f"must be {'above' if self.lo_open else 'at least'} {_number(self.lo)}"

    def __str__(self) -> str:
        return f"{'(' if self.lo_open else '['}{_number(self.lo)}, {_number(self.hi)}{')' if self.hi_open else ']'}"


def _number(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e16 else f"{x:g}"


REQUIRED = object()  # a file's number with no default: missing is an error


def file_number(data: dict, key: str, where: str, kind: type, valid: Range, default=REQUIRED):
    """The number ``data[key]`` of the file ``where`` (xf.json, meta.json, config.json, a
    calibration, a shortlist's header), by the one rule for numbers read from a file: of ``kind``
    (int: an integer; float: any number; never a bool), finite and in ``valid``; ``default``
    where the key is absent (or null), unless REQUIRED. A ConfigError "WHERE: 'KEY' is VALUE,
    expected ..." otherwise, the value shown short (a 500-digit integer is not printed)."""
    value = data.get(key) if isinstance(data, dict) else None
    if value is None:
        if default is REQUIRED:
            raise ConfigError(f"{where}: '{key}' is missing")
        return default
    wanted = "an integer" if kind is int else "a number"
    is_kind = not isinstance(value, bool) and (isinstance(value, int) if kind is int else isinstance(value, (int, float)))
    if is_kind and valid.problem(value) is None:
        return kind(value)
    raise ConfigError(f"{where}: '{key}' is {_shown(value)}, expected {wanted} in {valid}")


def _shown(value) -> str:
    """A value as a message may quote it: an integer of more than 39 digits by its digit count."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value).bit_length() > 130:
        return f"an integer of {len(str(abs(value))) if abs(value).bit_length() < 14000 else 'thousands of'} digits"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def option_range(cls: type, name: str) -> Range:
    """The Range of option ``name`` of the options dataclass ``cls`` (to quote its ends in a message)."""
    return next(f for f in dataclasses.fields(cls) if f.name == name).metadata["range"]


def check_ranges(options: Any) -> None:
    """ConfigError unless every number of an options dataclass is in its field's ``range``: the
    one numeric rule, called first by every options class's ``__post_init__`` (YAML, flags and
    ``dataclasses.replace`` alike)."""
    for f in dataclasses.fields(options):
        where, value = f.metadata.get("range"), getattr(options, f.name)
        if where is None or value is None:
            continue
        for v in value if isinstance(value, tuple) else (value,):
            problem = where.problem(v)
            if problem:
                got = _shown(v) if isinstance(v, int) else f"{v:g}"
                span = f" (range {where})" if where.hi != INT_MAX and str(where) not in problem else ""
                raise ConfigError(f"--{f.name.replace('_', '-')} {problem}, got {got}{span}")


def option(default: Any = dataclasses.MISSING, help: str = "", **metadata: Any) -> Any:
    """A dataclass field with its help text (shown by ``xf CMD --help``) and CLI hints.

    metadata keys: ``positional`` (a CLI argument, not a flag), ``short`` (e.g. "-s"), ``aliases``
    (old names still accepted as flags and YAML keys, e.g. ``("beam",)`` for ``beam_size``),
    ``range`` (a Range: required for every int and float option, checked by ``check_ranges``),
    ``path`` (a file or directory: ``absolute_paths`` makes it absolute for a config.yaml).
    Mutable defaults are not allowed: list-like options are tuples.
    """
    return dataclasses.field(default=default, metadata={"help": help, **metadata})


def field_types(cls: type) -> dict[str, Any]:
    """The resolved type of every field of an options dataclass."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _is_optional(tp: Any) -> tuple[bool, Any]:
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(tp)) == 2:
            return True, args[0]
    return False, tp


def describe_type(tp: Any) -> str:
    optional, inner = _is_optional(tp)
    origin = typing.get_origin(inner)
    if origin is Literal:
        text = " | ".join(str(a) for a in typing.get_args(inner))
    elif origin is tuple:
        text = f"list of {describe_type(typing.get_args(inner)[0])}"
    else:
        text = getattr(inner, "__name__", str(inner))
    return f"{text} or null" if optional else text


def coerce(value: Any, tp: Any, where: str) -> Any:
    """Check ``value`` against the field type ``tp``; return it normalized (lists become tuples)."""
    optional, inner = _is_optional(tp)
    if value is None:
        if optional:
            return None
        raise ConfigError(f"{where}: expected {describe_type(tp)}, got null")
    origin = typing.get_origin(inner)
    if origin is Literal:
        choices = typing.get_args(inner)
        if value not in choices:
            raise ConfigError(
                f"{where}: {value!r} is not one of {', '.join(map(str, choices))}"
            )
        return value
    if origin is tuple:
        (item_type, _ellipsis) = typing.get_args(inner)
        items = value if isinstance(value, (list, tuple)) else [value]
        return tuple(coerce(v, item_type, where) for v in items)
    if inner is bool:
        if isinstance(value, bool):
            return value
    elif inner is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif inner is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif inner is str:
        if isinstance(value, (str, Path)):
            return str(value)
    else:  # pragma: no cover - a programming error in an options class
        raise TypeError(f"unsupported option type {tp!r} at {where}")
    raise ConfigError(f"{where}: expected {describe_type(tp)}, got {value!r}")


# Options and values that were removed, with what replaces them: a config file or a command line
# that still names one gets this one line instead of "unknown option" (``removed``).
REMOVED_OPTIONS = {
    "refill": "--refill was removed (slower in xf translate and no gain in xf serve: docs/benchmarks.md); "
              "--workers N decodes batches in parallel",
    "compile_mode": "--compile-mode was removed: --compile compiles the decoder step ahead of time on the CPU "
                    "(its jit mode measured no gain)",
}
REMOVED_VALUES: dict = {}  # (option, value) -> the line, as REMOVED_OPTIONS


def removed(key: str, value: Any = None) -> str | None:
    """The one line for an option (YAML key or flag name, dashes or underscores, ``no_`` of a
    switch included) or a value of it that xf no longer has; None for anything else."""
    key = key.replace("-", "_")
    found = REMOVED_OPTIONS.get(key) or REMOVED_OPTIONS.get(key.removeprefix("no_"))
    return found or (REMOVED_VALUES.get((key, value)) if isinstance(value, str) else None)


def _nearest(key: str, valid: typing.Iterable[str]) -> str:
    match = difflib.get_close_matches(key, list(valid), n=1, cutoff=0.5)
    return f" (did you mean '{match[0]}'?)" if match else ""


class _Loader(yaml.SafeLoader):
    """yaml.safe_load's loader, but an integer of more than MAX_DIGITS digits is refused at its
    line (Python's int() refuses 4,300 with a message about its own internals)."""


def _bounded_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    digits = len(node.value.lstrip("+-").replace("_", ""))
    if digits > MAX_DIGITS:
        raise yaml.constructor.ConstructorError(None, None, f"an integer of {digits:,} digits, beyond a finite number",
                                                node.start_mark)
    return loader.construct_yaml_int(node)


_Loader.add_constructor("tag:yaml.org,2002:int", _bounded_int)


def read_yaml(path: str | Path, section: str | None, sections: typing.Sequence[str] = ()) -> dict[str, Any]:
    """Read a YAML options file; return the keys for ``section`` (a subcommand name) of a file
    split into ``sections`` (every command's: ``frame.sections()``, which the caller passes, since
    the command table is above this module)."""
    path = Path(path)
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=_Loader)
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot read config file: {e}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f" line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{path}:{line} invalid YAML: {getattr(e, 'problem', e)}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of option names to values")
    data = {str(k).replace("-", "_"): v for k, v in data.items()}
    SECTIONS = tuple(sections)
    # No option takes a mapping: a key holding one is a section, maybe a misspelled one (without
    # ``sections`` to check them against, every key of a sectioned file is taken for one)
    if any(k in SECTIONS or isinstance(v, dict) for k, v in data.items()):
        for key in data:
            if SECTIONS and key not in SECTIONS:
                raise ConfigError(
                    f"{path}: unknown section '{key}'{_nearest(key, SECTIONS)}; "
                    f"a sectioned file holds only {', '.join(SECTIONS)}"
                )
        data = data.get(section, {}) if section else {}
        if data is None:
            return {}
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: section '{section}' must be a mapping")
        data = {str(k).replace("-", "_"): v for k, v in data.items()}
    return data


def build_options(cls: type, values: dict[str, Any], source: str) -> Any:
    """Make an options dataclass from a dict, rejecting unknown keys and wrong types."""
    types_by_name = field_types(cls)
    aliases = {a: f.name for f in dataclasses.fields(cls) for a in f.metadata.get("aliases", ())}
    checked = {}
    for key, value in values.items():
        key = aliases.get(key, key)
        gone = removed(key, value)
        if gone:
            raise ConfigError(f"{source}: {gone}")
        if key not in types_by_name:
            raise ConfigError(f"{source}: unknown option '{key}'{_nearest(key, types_by_name)}")
        checked[key] = coerce(value, types_by_name[key], f"{source}: option '{key}'")
    missing = [
        f.name
        for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
        and f.name not in checked
    ]
    if missing:
        raise ConfigError(f"{source}: missing required option '{missing[0]}'")
    try:
        return cls(**checked)
    except ValueError as e:  # __post_init__ validation
        raise ConfigError(f"{source}: {e}") from None


def load_options(
    cls: type,
    config: str | Path | None = None,
    overrides: dict[str, Any] | None = None,
    section: str | None = None,
    sections: typing.Sequence[str] = (),
) -> Any:
    """Options from an optional YAML file (its ``section`` of ``sections``, ``read_yaml``), then
    flag ``overrides`` on top (flags win)."""
    values: dict[str, Any] = {}
    source = "options"
    if config is not None:
        values.update(read_yaml(config, section, sections))
        source = str(config)
    if overrides:
        values.update({k: v for k, v in overrides.items() if v is not None})
    return build_options(cls, values, source)


def to_dict(options: Any) -> dict[str, Any]:
    """Plain-Python dict of an options dataclass (tuples become lists): YAML- and checkpoint-safe."""
    out = {}
    for f in dataclasses.fields(options):
        value = getattr(options, f.name)
        out[f.name] = list(value) if isinstance(value, tuple) else value
    return out


def absolute_paths(cls: type, values: dict[str, Any]) -> dict[str, Any]:
    """``values`` (a ``to_dict`` of ``cls``) with the options marked ``path`` made absolute, so that
    a config file written from them works from any directory."""
    paths = {f.name for f in dataclasses.fields(cls) if f.metadata.get("path")}
    return {k: str(Path(v).absolute()) if k in paths and v is not None else v for k, v in values.items()}
