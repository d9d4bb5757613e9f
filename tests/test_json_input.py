"""json_input: the one JSON reader. Nesting deeper than MAX_DEPTH is refused before the parser
recurses (json's C scanner raises RecursionError near 1,000 levels, a traceback); every refusal is
one line naming the file and the line."""

import pytest

from xformer_cli.base.errors import XfError
from xformer_cli.base.json_input import MAX_DEPTH, parse_json, read_json, too_deep


def refusal(text: str, where: str = "f.json") -> str:
    with pytest.raises(XfError) as e:
        parse_json(text, where)
    assert "\n" not in str(e.value)
    return str(e.value)


def test_nesting_up_to_the_limit_parses_and_deeper_is_one_line_naming_the_line():
    assert parse_json("[" * MAX_DEPTH + "]" * MAX_DEPTH, "f.json") == eval("[" * MAX_DEPTH + "]" * MAX_DEPTH)
    assert refusal("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1)) == (
        f"f.json: nests arrays or objects deeper than {MAX_DEPTH} levels, more than xf reads")
    deep = '{\n "a": 1,\n "b": ' + '{"c": ' * 100_000 + "1" + "}" * 100_000 + "\n}"
    assert refusal(deep).startswith("f.json: line 3: nests arrays or objects deeper than")


def test_brackets_inside_strings_are_not_nesting():
    text = '{"a": "' + "[{" * 1000 + '", "b\\"[": ["]"]}'
    assert parse_json(text, "f.json") == {"a": "[{" * 1000, 'b"[': ["]"]}
    # a string that never ends is the rest of its line: counted once, not again from each quote
    assert too_deep('\\"' * 200_000) is None and too_deep('"[[\n' + "[" * 65) == 2


def test_bad_json_is_one_line_with_its_line_and_column():
    assert refusal('{"a": 1,\n "b": }').startswith("f.json: line 2: not JSON: Expecting value (column 7)")
    assert refusal('{"a": ', "in.jsonl: line 4") == "in.jsonl: line 4: not JSON: Expecting value (column 7)"
    assert "not JSON xf reads" in refusal("[" + "9" * 5000 + "]")  # over Python's integer digits limit


def test_every_number_is_finite_and_refused_with_its_line_and_key():
    """NaN and Infinity (Python's json takes them), 1e999 (inf) and an integer past a double were
    numbers xf read, or a message naming sys.set_int_max_str_digits."""
    assert refusal('{"a": 1,\n "b": NaN}') == "f.json: line 2: not JSON xf reads: 'b' is NaN, not a finite number"
    assert refusal('{"w": [1, -Infinity]}') == "f.json: not JSON xf reads: 'w' is -Infinity, not a finite number"
    assert refusal('[1e999]') == "f.json: not JSON xf reads: 1e999, beyond a finite number"
    assert refusal("[" + "9" * 5000 + "]") == "f.json: not JSON xf reads: an integer of 5,000 digits, beyond a finite number"
    assert parse_json("[" + "9" * 308 + ", -1e308]", "f.json") == [int("9" * 308), -1e308]  # the largest kept


def test_read_json_names_a_missing_unreadable_or_bad_file(tmp_path):
    with pytest.raises(XfError, match="missing"):
        read_json(tmp_path / "none.json")
    (tmp_path / "latin1.json").write_bytes(b'{"a": "\xe9"}')
    with pytest.raises(XfError, match="latin1.json: not UTF-8"):
        read_json(tmp_path / "latin1.json")
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(XfError, match=f"deep.json: nests arrays or objects deeper than {MAX_DEPTH}"):
        read_json(tmp_path / "deep.json")
    (tmp_path / "ok.json").write_text('{"a": [1, 2]}\n')
    assert read_json(tmp_path / "ok.json") == {"a": [1, 2]}
