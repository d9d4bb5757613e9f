"""Every number xf reads from a file, by one rule (``json_input`` and ``config.file_number``):
finite, of the right type, in range, or refused in one line naming the file and the key (or the
line), never with a message about Python's internals (``sys.set_int_max_str_digits``).

The walk: each reader (a CTranslate2 directory's xf.json, a data directory's meta.json, a
MarianMT config.json, a calibration, a shortlist's header, a YAML options file) with each bad
value (huge, NaN, infinite, negative, of the wrong type) written where a number belongs.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from xformer_cli.settings.config import Range, build_options, file_number, read_yaml
from xformer_cli.decode.confidence import Calibration
from xformer_cli.decode.ctranslate2_engine import read_exported_model
from xformer_cli.data.dataset import DataDir
from xformer_cli.base.errors import XfError
from xformer_cli.base.json_input import parse_json
from xformer_cli.formats.huggingface import read_marian
from xformer_cli.settings.options import TrainOptions
from xformer_cli.decode.shortlist import Shortlist

# each bad value as it is written in the file (JSON; YAML writes NaN and infinity its own way)
BAD = {"huge": "9" * 500, "huger than int() takes": "9" * 5000, "NaN": "NaN", "infinite": "Infinity",
       "minus infinite": "-Infinity", "past a double": "1e999", "negative": "-3", "a string": '"12"',
       "a bool": "true", "a list": "[1]", "a fraction": "2.5"}
YAML = {**BAD, "NaN": ".nan", "infinite": ".inf", "minus infinite": "-.inf", "a string": "'12'"}


def ct2_dir(root: Path, value: str) -> Path:
    (root / "config.json").write_text("{}", encoding="utf-8")
    (root / "xf.json").write_text('{"format": "xf-ctranslate2", "version": 1,\n "max_positions": %s\n}' % value,
                                  encoding="utf-8")
    (root / "spm.model").write_bytes(b"")
    return root / "xf.json"


def meta(key: str):
    def write(root: Path, value: str) -> Path:
        fields = {"format_version": "1", "source_lang": '"en"', "target_lang": '"de"', "vocab_size": "200",
                  "splits": "[]", key: value}
        (root / "meta.json").write_text("{\n" + ",\n".join(f' "{k}": {v}' for k, v in fields.items()) + "\n}",
                                        encoding="utf-8")
        return root / "meta.json"
    return write


def marian(root: Path, value: str) -> Path:
    (root / "config.json").write_text('{"model_type": "marian", "vocab_size": %s}' % value, encoding="utf-8")
    return root / "config.json"


def calibration(key: str):
    def write(root: Path, value: str) -> Path:
        numbers = {"weights": "[1, 0.5]", "bias": "0.1", key: f"[1, {value}]" if key == "weights" else value}
        text = ('{"format": "xf-confidence", "version": 1, "scores": ["forward", "reverse"], '
                f'"weights": {numbers["weights"]}, "bias": {numbers["bias"]}, "reverse": false}}')
        (root / "c.json").write_text(text, encoding="utf-8")
        return root / "c.json"
    return write


def shortlist(key: str):
    def write(root: Path, value: str) -> Path:
        fields = {"format": '"xf-shortlist"', "format_version": "1", "vocab_size": "8", "iterations": "5", key: value}
        header = "{" + ", ".join(f'"{k}": {v}' for k, v in fields.items()) + "}"
        np.savez(root / "s.npz", header=np.frombuffer(header.encode("utf-8"), np.uint8),
                 frequent=np.array([4], np.int32), per_source=np.zeros((8, 1), np.int32))
        return root / "s.npz"
    return write


def yaml_options(key: str):
    def write(root: Path, value: str) -> Path:
        (root / "c.yaml").write_text(f"train:\n  {key}: {value}\n", encoding="utf-8")
        return root / "c.yaml"
    return write


def train_options(path: Path):
    return build_options(TrainOptions, {"data": "d", **read_yaml(path, "train", ["train"])}, str(path))


# (what writes the file, the key, how xf reads it, the bad values a valid file may hold there)
READERS = {
    "xf.json max_positions": (ct2_dir, "max_positions", lambda p: read_exported_model(p.parent), ()),
    "meta.json vocab_size": (meta("vocab_size"), "vocab_size", lambda p: DataDir.open(p.parent), ()),
    "meta.json sampling_temperature": (meta("sampling_temperature"), "sampling_temperature",
                                       lambda p: DataDir.open(p.parent), ("a fraction",)),
    "config.json vocab_size": (marian, "vocab_size", lambda p: read_marian(p.parent), ()),
    "calibration weights": (calibration("weights"), "weights", lambda p: Calibration.load(str(p)),
                            ("negative", "a fraction")),
    "calibration bias": (calibration("bias"), "bias", lambda p: Calibration.load(str(p)), ("negative", "a fraction")),
    "shortlist vocab_size": (shortlist("vocab_size"), "vocab_size", lambda p: Shortlist.load(p), ()),
    "shortlist iterations": (shortlist("iterations"), "iterations", lambda p: Shortlist.load(p), ()),
    "YAML max_update": (yaml_options("max_update"), "max_update", train_options, ()),
    "YAML label_smoothing": (yaml_options("label_smoothing"), "label_smoothing", train_options, ("a fraction",)),
}


@pytest.mark.parametrize("value", list(BAD))
@pytest.mark.parametrize("reader", list(READERS))
def test_every_number_read_from_a_file_is_checked(tmp_path, reader, value):
    """A 500-digit max_positions in xf.json was an OverflowError, a NaN sampling_temperature in
    meta.json a ValueError in xf train, a 400-digit calibration weight an OverflowError, and three
    messages told the user to call sys.set_int_max_str_digits()."""
    write, key, read, allowed = READERS[reader]
    written = (YAML if reader.startswith("YAML") else BAD)[value]
    path = write(tmp_path, written)
    if value in allowed:  # a fraction where a float belongs, a negative weight: a value the file may hold
        try:
            read(path)
        except XfError as e:  # another check of the reader's, never this number's
            assert key not in str(e), str(e)
        return
    with pytest.raises(XfError) as e:
        read(path)
    message = str(e.value)
    assert str(path) in message and "\n" not in message, message
    named = message.replace(str(path), "")
    assert key in named or key.replace("_", "-") in named or "line" in named, message
    assert "set_int_max_str_digits" not in message and "Python" not in message, message


def test_a_number_is_shown_short():
    with pytest.raises(XfError, match=r"f.json: 'n' is an integer of 60 digits, expected an integer in \[1, 8\]$"):
        file_number({"n": 10**59}, "n", "f.json", int, Range(1, 8))
    assert file_number({}, "n", "f.json", float, Range(0, 1), 0.5) == 0.5


@settings(max_examples=200, deadline=None)
@given(value=st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=5),
                       st.lists(st.integers(), max_size=2)))
def test_file_number_takes_what_is_in_range_and_refuses_the_rest_in_one_line(value):
    """The property of the rule itself: a value comes back as the number it is, or the refusal
    is one XfError naming the file and the key."""
    valid = Range(0, 100)
    try:
        got = file_number({"n": value}, "n", "f.json", float, valid, 7.0)
    except XfError as e:
        assert str(e).startswith("f.json: 'n' is ") and "\n" not in str(e)
        assert isinstance(value, (bool, str, list)) or valid.problem(value) is not None
    else:
        assert got == (7.0 if value is None else value) and isinstance(got, float)


NUMBER_TEXT = st.one_of(st.integers().map(str), st.floats(allow_nan=True, allow_infinity=True).map(repr),
                        st.integers(0, 6000).map(lambda n: "9" * max(n, 1)), st.sampled_from(
                            ["NaN", "Infinity", "-Infinity", "1e999", "-1e999", "1e-999", "-0", "0.0"]))


@settings(max_examples=300, deadline=None)
@given(number=NUMBER_TEXT)
def test_a_json_number_is_finite_or_refused_with_its_key(number):
    """json_input's rule: any number written in a file comes back finite, or is refused in one
    line naming the key it is written under (never a message about Python's int() limit)."""
    text = '{"a": 1,\n "key": %s}' % number.replace("inf", "Infinity").replace("nan", "NaN")
    try:
        value = parse_json(text, "f.json")["key"]
    except XfError as e:
        assert str(e).startswith("f.json: line 2: not JSON xf reads: 'key' is ") and "\n" not in str(e), str(e)
        assert "set_int_max_str_digits" not in str(e)
    else:
        assert not isinstance(value, float) or math.isfinite(value)


@settings(max_examples=150, deadline=None)
@given(number=NUMBER_TEXT)
def test_a_yaml_number_is_finite_in_range_or_refused_in_one_line(number, tmp_path_factory):
    """The same in a YAML options file: the option's value, or one ConfigError naming the file."""
    path = tmp_path_factory.mktemp("yaml") / "c.yaml"
    path.write_text(f"train:\n  max_update: {number}\n", encoding="utf-8")
    try:
        options = train_options(path)
    except XfError as e:
        assert str(path) in str(e) and "\n" not in str(e) and "set_int_max_str_digits" not in str(e), str(e)
    else:
        assert isinstance(options.max_update, int) and 0 <= options.max_update <= 2**31 - 1
