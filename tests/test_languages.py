"""text/languages.py: pair lists, tags, and the vocabulary one direction of a model translates with."""

import pytest

from xformer_cli.base.errors import XfError
from xformer_cli.text.languages import (TaggedVocabulary, parse_pairs, same_language, tag, target_languages, two_letters,
                                   vocabulary_for)


class FakeVocabulary:
    """Pieces: specials, a tag for German, then one piece a character."""

    pieces = ["<pad>", "<unk>", "<s>", "</s>", ">>deu<<", "a", "b"]

    def encode(self, text, out_type=int, **kwargs):
        if isinstance(text, list):
            return [self.encode(t, out_type) for t in text]
        ids = [self.pieces.index(c) if c in self.pieces else 1 for c in text if not c.isspace()]
        return [self.pieces[i] for i in ids] if out_type is str else ids

    def id_to_piece(self, i):
        return self.pieces[i]

    def piece_to_id(self, piece):
        return self.pieces.index(piece) if piece in self.pieces else 1


def test_tags_are_iso_639_3_as_opus_mt_has_them():
    assert tag("de") == ">>deu<<" and tag("fr") == ">>fra<<" and tag("en") == ">>eng<<" and tag("deu") == ">>deu<<"


@pytest.mark.parametrize("text, message", [
    ("en-de,en-de", "given twice"), ("en-en", "into itself"), ("ende", "not a pair"), ("en-xx", "not a language code"),
    ("", "not a pair"), ("en-de,", "not a pair"), ("EN-DE", "not a language code"),
])
def test_bad_pair_lists_are_one_line_errors(text, message):
    with pytest.raises(XfError, match=message):
        parse_pairs(text)


def test_pairs_parse_from_text_or_a_list():
    assert parse_pairs("en-de, en-fr") == parse_pairs(["en-de", "en-fr"]) == [("en", "de"), ("en", "fr")]


def test_a_multilingual_vocabulary_puts_the_tag_first_and_leaves_targets_and_empty_lines_alone():
    meta = {"pairs": ["en-de", "fr-de"], "source_lang": "src", "target_lang": "tgt"}
    assert target_languages(meta) == ["de"]
    v = vocabulary_for(FakeVocabulary(), meta, "de")
    assert isinstance(v, TaggedVocabulary)
    assert v.encode(["ab", "", "b"]) == [[4, 5, 6], [], [4, 6]]
    assert v.encode("ab", out_type=str) == [">>deu<<", "a", "b"]
    assert v.encode_target("ab") == [5, 6] and v.id_to_piece(5) == "a"


def test_choosing_a_target_the_model_lacks_is_refused():
    multi = {"pairs": ["en-de", "en-fr"], "source_lang": "src", "target_lang": "tgt"}
    with pytest.raises(XfError, match="choose the language"):
        vocabulary_for(FakeVocabulary(), multi, None)
    with pytest.raises(XfError, match="translates into de, fr, not it"):
        vocabulary_for(FakeVocabulary(), multi, "it")
    with pytest.raises(XfError, match="no tag >>fra<<"):  # the fake vocabulary has only German's tag
        vocabulary_for(FakeVocabulary(), multi, "fr")
    bilingual = {"source_lang": "en", "target_lang": "de"}
    assert isinstance(vocabulary_for(FakeVocabulary(), bilingual, "de"), FakeVocabulary)
    assert isinstance(vocabulary_for(FakeVocabulary(), bilingual, None), FakeVocabulary)
    with pytest.raises(XfError, match="bilingual and translates into de only"):
        vocabulary_for(FakeVocabulary(), bilingual, "fr")


def test_iso_639_1_and_639_3_codes_name_one_language_alike():
    """docs/decoding.md says --target-lang takes either; deu was refused ("translates into de only")."""
    bilingual = {"source_lang": "en", "target_lang": "de"}
    assert isinstance(vocabulary_for(FakeVocabulary(), bilingual, "deu"), FakeVocabulary)
    with pytest.raises(XfError, match="bilingual and translates into de only"):
        vocabulary_for(FakeVocabulary(), bilingual, "fra")
    multi = {"pairs": ["en-de", "fr-de"], "source_lang": "src", "target_lang": "tgt"}
    assert vocabulary_for(FakeVocabulary(), multi, "deu").encode("ab", out_type=str) == [">>deu<<", "a", "b"]
    assert same_language("de", "deu") and same_language("deu", "deu") and not same_language("de", "fra")
    assert two_letters("deu") == "de" and two_letters("de") == "de" and two_letters("xyz") == "xyz"
