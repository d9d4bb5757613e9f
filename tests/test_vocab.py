"""The vocabulary module: the special ids, the one sentencepiece loader, the one line decoder."""

import pytest
import sentencepiece as spm

from xformer_cli.base.errors import XfError
from xformer_cli.text.vocab import BOS_ID, EOS_ID, PAD_ID, UNK_ID, decode_line, load_sentencepiece

TEXT = ["a small house by the river", "the dog runs in the park", "two men play football on grass"] * 20


def train_spm(tmp_path, name, **ids):
    (tmp_path / "text.txt").write_text("\n".join(TEXT) + "\n")
    spm.SentencePieceTrainer.train(input=str(tmp_path / "text.txt"), model_prefix=str(tmp_path / name),
                                   vocab_size=40, model_type="bpe", minloglevel=2, **ids)
    return tmp_path / f"{name}.model"


def test_load_sentencepiece_from_a_file_and_from_bytes(tmp_path):
    path = train_spm(tmp_path, "xf", pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID)
    a, b = load_sentencepiece(path), load_sentencepiece(path.read_bytes(), "checkpoint.pt")
    assert a.encode("the dog") == b.encode("the dog") and a.get_piece_size() == 40
    assert (a.pad_id(), a.unk_id(), a.bos_id(), a.eos_id()) == (0, 1, 2, 3)


def test_load_sentencepiece_refuses_other_special_ids_and_garbage(tmp_path):
    other = train_spm(tmp_path, "other")  # sentencepiece's defaults: unk 0, bos 1, eos 2, no pad
    with pytest.raises(XfError, match=r"other\.model: special ids pad/unk/bos/eos are \(-1, 0, 1, 2\)"):
        load_sentencepiece(other)
    with pytest.raises(XfError, match=r"^ck\.pt: not a readable sentencepiece model"):
        load_sentencepiece(b"not a model", "ck.pt")


def test_decode_line_endings_bom_and_invalid_utf8():
    assert decode_line("\ufeffHaus\r\n".encode(), "f", 1) == "Haus"  # a BOM on line 1 is not text
    assert decode_line("\ufeffHaus\n".encode(), "f", 2) == "\ufeffHaus"  # elsewhere it is kept
    with pytest.raises(XfError, match=r"^f:7: invalid UTF-8"):
        decode_line(b"a\xffb\n", "f", 7)
    assert decode_line(b"a\xffb\n", "f", 7, "skip") is None
    assert decode_line(b"a\xffb\n", "f", 7, "replace") == "a\ufffdb"
