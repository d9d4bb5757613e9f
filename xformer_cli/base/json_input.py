"""The one JSON reader: every JSON file, line and body xf reads goes through ``parse_json``.

Python's json parser recurses once per nested array or object and raises RecursionError near
1,000 levels (a traceback, no file named), so the text's nesting is counted first, outside its
strings, without recursing: more than ``MAX_DEPTH`` levels is refused. Every number is finite:
NaN and Infinity (which Python takes, JSON does not), a float past a double's range (1e999) and
an integer of more than ``MAX_DIGITS`` digits (past any double) are refused, each with its line;
a number's type and range are the reader's (``config.file_number``). Every refusal is one
XfError naming where the text came from and, in a text of several lines, the line.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Optional, Union

from .errors import XfError

MAX_DEPTH = 64  # far above the few levels of what xf reads: its own files, MarianMT's, a jsonl line
# a string, or what is left of its line when it does not end there (JSON strings never span lines:
# a raw LF is invalid); taking that rest keeps the scan linear where a string that never ends would
# otherwise be tried again from each of its quotes
_STRING = re.compile(r'"[^"\\\n]*(?:\\.[^"\\\n]*)*"?')
_NOT_BRACKET = re.compile(r"[^\[\]{}\n]+")
# the key a value is written under ("key": VALUE, or an element of "key": [1, VALUE]), to name it
_KEY_BEFORE = re.compile(r'"((?:[^"\\\n]|\\.)*)"\s*:\s*(?:\[[^\[\]{}"]*)?$')
MAX_DIGITS = 308  # an integer beyond a double's range is no number xf reads (a count, a size, a weight)


class _NotFinite(ValueError):
    """A number refused while parsing; ``token``: its text as written (to find its line)."""

    def __init__(self, token: str, why: str):
        super().__init__(why)
        self.token = token


def _refuse_constant(name: str):
    raise _NotFinite(name, f"{name}, not a finite number")


def _finite_float(token: str) -> float:
    value = float(token)
    if not math.isfinite(value):
        raise _NotFinite(token, f"{token[:20]}{'...' if len(token) > 20 else ''}, beyond a finite number")
    return value


def _bounded_int(token: str) -> int:
    digits = len(token.lstrip("-"))
    if digits > MAX_DIGITS:
        raise _NotFinite(token[:40], f"an integer of {digits:,} digits, beyond a finite number")
    return int(token)


def too_deep(text: str) -> Optional[int]:
    """The line (from 1) where ``text`` opens its array or object number MAX_DEPTH + 1 within the
    others, or None. Brackets inside strings do not count; a broken text is left to the parser."""
    depth, line = 0, 1
    for c in _NOT_BRACKET.sub("", _STRING.sub("", text)):
        if c == "\n":
            line += 1
        elif c in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                return line
        else:
            depth -= 1
    return None


def _refusal(where: str, why: str, hint: str) -> XfError:
    return XfError(f"{where}: {why}{f'; {hint}' if hint else ''}")


def parse_json(text: str, where: str, hint: str = ""):
    """The value of JSON ``text``, or an XfError "WHERE[: line N]: why[; HINT]" (the line only when
    ``text`` has more than one: a jsonl caller puts its line in ``where``)."""
    several = "\n" in text.strip()

    def at(line: int) -> str:
        return f"{where}: line {line}" if several else where

    line = too_deep(text)
    if line is not None:
        raise _refusal(at(line), f"nests arrays or objects deeper than {MAX_DEPTH} levels, more than xf reads", hint)
    try:
        return json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float, parse_int=_bounded_int)
    except json.JSONDecodeError as e:
        raise _refusal(at(e.lineno), f"not JSON: {e.msg} (column {e.colno})", hint) from None
    except _NotFinite as e:  # the parser gives no position: the first place the token is written
        found = max(text.find(e.token), 0)
        key = _KEY_BEFORE.search(text, 0, found)
        named = f"'{key.group(1)}' is {e}" if key else str(e)
        raise _refusal(at(text.count("\n", 0, found) + 1), f"not JSON xf reads: {named}", hint) from None


def read_json(path: Union[str, Path], hint: str = ""):
    """The JSON value in the file ``path`` (UTF-8), or an XfError naming it (and the line)."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise _refusal(str(path), "missing", hint) from None
    except OSError as e:
        raise XfError(f"{path}: cannot read ({e.strerror})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _refusal(str(path), f"not UTF-8 text ({e.reason} at byte {e.start})", hint) from None
    return parse_json(text, str(path), hint)
