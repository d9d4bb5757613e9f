"""Glossaries: the TSV reader's errors (file and line) and term matching (word boundaries, case,
longest first), by hand."""

import pytest

from xformer_cli.base.errors import ConfigError
from xformer_cli.text.glossary import Glossary, find_terms


def load(tmp_path, text: str) -> Glossary:
    path = tmp_path / "terms.tsv"
    path.write_text(text, encoding="utf-8")
    return Glossary.load(str(path))


def test_terms_match_whole_words_case_insensitively_longest_first(tmp_path):
    glossary = load(tmp_path, "cat\tKatze|Katzen\nbike\tFahrrad\nmountain bike\tMountainbike\n\nC++\tC++\n")
    assert glossary.constraints("A Cat rides a MOUNTAIN bike.") == [["Katze", "Katzen"], ["Mountainbike"]]
    assert glossary.constraints("catalogue of bikes") == []  # not inside a longer word
    assert glossary.constraints("a bike, a cat, another cat") == [["Fahrrad"], ["Katze", "Katzen"]]  # once each
    assert glossary.constraints("I like C++.") == [["C++"]]


def test_a_term_whose_lowercase_is_longer_is_found(tmp_path):
    """'İ' lowercases to 'i' and a combining dot: the term, lowercased, was never found in a line
    that wrote it as the file does (found by tests/test_fuzz.py)."""
    assert load(tmp_path, "İ\tcat\n").constraints("İ") == [["cat"]]
    glossary = load(tmp_path, "İstanbul\tIstanbul\n")
    assert glossary.constraints("We flew to İSTANBUL.") == [["Istanbul"]]
    assert find_terms("İstanbul", [glossary]) == [("i\u0307stanbul", ["Istanbul"], 0)]


@pytest.mark.parametrize("text,message", [
    ("cat\n", "line 1: expected two tab-separated fields"),
    ("cat\tKatze\tx\n", "line 1: expected two tab-separated fields"),
    ("cat\tKatze\n\n\t Hund\n", "line 3: an empty source term"),
    ("cat\tKatze|\n", "line 1: an empty target term"),
    ("cat\tKatze\nCat\tMieze\n", "line 2: the source term 'Cat' is given twice"),
    ("\n\n", "the glossary has no entries"),
])
def test_bad_glossaries_name_the_file_and_line(tmp_path, text, message):
    with pytest.raises(ConfigError, match="terms.tsv: " + message):
        load(tmp_path, text)


def test_a_glossary_that_is_not_utf8_or_not_there(tmp_path):
    (tmp_path / "terms.tsv").write_bytes(b"cat\tKatze\ndog\t\xff\n")
    with pytest.raises(ConfigError, match="terms.tsv: line 2: not UTF-8"):
        Glossary.load(str(tmp_path / "terms.tsv"))
    with pytest.raises(ConfigError, match="nope.tsv: cannot read the glossary"):
        Glossary.load(str(tmp_path / "nope.tsv"))


def test_a_byte_order_mark_is_not_part_of_the_first_term(tmp_path):
    """Regression: a file saved with a BOM (Notepad, Excel's UTF-8 CSV) lost its first term to it."""
    (tmp_path / "terms.tsv").write_bytes("\ufeffcat\tKatze\ndog\tHund\n".encode("utf-8"))
    glossary = Glossary.load(str(tmp_path / "terms.tsv"))
    assert glossary.entries == {"cat": ["Katze"], "dog": ["Hund"]}
    assert glossary.constraints("a cat and a dog") == [["Katze"], ["Hund"]]
    (tmp_path / "terms.tsv").write_bytes(b"\xef\xbb\xbfcat\tKatze\ndog\t\xff\n")
    with pytest.raises(ConfigError, match="terms.tsv: line 2: not UTF-8"):
        Glossary.load(str(tmp_path / "terms.tsv"))
