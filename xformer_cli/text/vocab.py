"""The vocabulary: the special token ids, the one sentencepiece loader, the one line decoder.

A joint sentencepiece BPE model (``spm.model`` in a data directory, its bytes in every
checkpoint) turns text into ids. xf trains it with fixed special ids, and every part that
builds or reads token tensors (data, model, loss, search) takes them from here. Torch-free.

An imported MarianMT model (``formats/huggingface.py``) has two sentencepiece models, source and target,
whose pieces share one id space through a piece list (its vocab.json). Its ``spm.model`` bytes
are then a mapped-vocabulary bundle (``MappedVocabulary.to_bytes``), which ``load_sentencepiece``
reads as it reads a sentencepiece model; the piece list is put in xf's id layout at import (pad 0,
unk 1, bos 2, eos 3), so that the ids below stay constants for every model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional, Union

from ..base.errors import XfError
from ..base.json_input import parse_json

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3  # sentencepiece is trained with these (preprocess)


MAPPED_MAGIC = b"xf-mapped-vocabulary\n"


def spm_processor(model: bytes, where: str):
    """A SentencePieceProcessor of a model's bytes, its ids as trained (``load_sentencepiece``
    checks xf's), or a one-line error naming ``where``."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor()
    try:
        sp.LoadFromSerializedProto(model)
    except (OSError, RuntimeError, TypeError) as e:
        raise XfError(f"{where}: not a readable sentencepiece model ({e})") from None
    return sp


class MappedVocabulary:
    """Source and target sentencepiece models over one id space (a MarianMT vocabulary).

    Text is cut into pieces by the source model (``encode``) or the target model
    (``encode_target``), and a piece's id is its index in ``pieces`` (a piece not there is unk);
    ``decode`` joins target pieces with the target model. The methods are those of
    SentencePieceProcessor that xf calls, so either serves as a vocabulary.
    """

    def __init__(self, source_spm: bytes, target_spm: bytes, pieces: list[str], where: str = "vocabulary"):
        if len(pieces) < 4 or len(set(pieces)) != len(pieces):
            raise XfError(f"{where}: the piece list needs at least 4 distinct pieces")
        self.source_spm, self.target_spm, self.pieces = source_spm, target_spm, list(pieces)
        self.source, self.target = spm_processor(source_spm, f"{where} (source)"), spm_processor(target_spm, f"{where} (target)")
        self.ids = {piece: i for i, piece in enumerate(self.pieces)}

    def to_bytes(self) -> bytes:
        header = {"version": 1, "pieces": self.pieces, "source_spm": len(self.source_spm),
                  "target_spm": len(self.target_spm)}
        return MAPPED_MAGIC + json.dumps(header, ensure_ascii=False).encode("utf-8") + b"\n" + self.source_spm + self.target_spm

    @classmethod
    def from_bytes(cls, data: bytes, where: str) -> "MappedVocabulary":
        try:
            line, rest = data[len(MAPPED_MAGIC):].split(b"\n", 1)
            header = parse_json(line.decode("utf-8"), f"{where}: the mapped vocabulary's header")
            n, m = header["source_spm"], header["target_spm"]
            if header["version"] != 1 or len(rest) != n + m:
                raise ValueError("sizes")
            return cls(rest[:n], rest[n:], header["pieces"], where)
        except (ValueError, KeyError, TypeError, UnicodeDecodeError):
            raise XfError(f"{where}: a corrupt mapped vocabulary (source/target sentencepiece models and pieces)") from None

    def _ids(self, sp, text):
        if isinstance(text, list):
            return [self._ids(sp, t) for t in text]
        code = []  # a leading language code (">>fra<<", multilingual OPUS-MT) is one piece, as MarianTokenizer has it
        if text.startswith(">>") and "<<" in text:
            end = text.index("<<") + 2
            code, text = [text[:end]], text[end:]
        return [self.ids.get(p, UNK_ID) for p in code + sp.encode(text, out_type=str)]

    def encode(self, text, out_type=int, num_threads=None):
        """Source text (a str or a list of them) -> ids."""
        return self._ids(self.source, text)

    def encode_target(self, text, out_type=int, num_threads=None):
        return self._ids(self.target, text)

    def decode(self, ids) -> str:
        specials = (PAD_ID, BOS_ID, EOS_ID)
        return self.target.decode_pieces([self.pieces[i] for i in ids if i not in specials])

    def id_to_piece(self, i: int) -> str:
        return self.pieces[i]

    def piece_to_id(self, piece: str) -> int:
        return self.ids.get(piece, UNK_ID)

    def get_piece_size(self) -> int:
        return len(self.pieces)

    def get_score(self, i: int) -> float:
        return 0.0  # the pieces' scores live in the two models; the id space has none


def encode_target(sp, text, **kwargs):
    """Target-side ids of ``text``: the target model of a MappedVocabulary, else the joint model."""
    return sp.encode_target(text, **kwargs) if isinstance(sp, MappedVocabulary) else sp.encode(text, **kwargs)


def load_sentencepiece(model: Union[Path, bytes], where: Optional[str] = None):
    """A SentencePieceProcessor from a model file or a model's bytes (a checkpoint's), with xf's
    special ids checked; a MappedVocabulary for a mapped-vocabulary bundle. ``where`` names the
    source in errors (default: the file)."""
    where = where or str(model)
    if not isinstance(model, bytes):
        try:
            model = Path(model).read_bytes()
        except OSError as e:
            raise XfError(f"{where}: not a readable sentencepiece model ({e.strerror})") from None
    if model.startswith(MAPPED_MAGIC):
        return MappedVocabulary.from_bytes(model, where)
    sp = spm_processor(model, where)
    ids = (sp.pad_id(), sp.unk_id(), sp.bos_id(), sp.eos_id())
    if ids != (PAD_ID, UNK_ID, BOS_ID, EOS_ID):
        raise XfError(
            f"{where}: special ids pad/unk/bos/eos are {ids}, xf needs {(PAD_ID, UNK_ID, BOS_ID, EOS_ID)} "
            "(train it with --pad_id=0 --unk_id=1 --bos_id=2 --eos_id=3)"
        )
    return sp


def decode_line(line: bytes, where: Union[str, Path], lineno: int, invalid: str = "error") -> Optional[str]:
    """One line as text, without its LF or CRLF (and a UTF-8 byte-order mark on line 1: it is not
    part of the sentence).

    invalid: what to do with invalid UTF-8: "error" (XfError naming file and line), "skip"
    (return None) or "replace" (U+FFFD for the bad bytes).
    """
    line = line.rstrip(b"\r\n")
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as e:
        if invalid == "error":
            raise XfError(
                f"{where}:{lineno}: invalid UTF-8 ({e.reason} at byte {e.start}); fix the file or pass --skip-invalid"
            ) from None
        if invalid == "skip":
            return None
        text = line.decode("utf-8", errors="replace")
    return text.removeprefix("\ufeff") if lineno == 1 else text
