"""The vocabulary: the special token ids, the one sentencepiece loader, the one line decoder.

A joint sentencepiece BPE model (``spm.model`` in a data directory, its bytes in every
checkpoint) turns text into ids. xf trains it with fixed special ids, and every part that
builds or reads token tensors (data, model, loss, search) takes them from here. Torch-free.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Union

from .errors import XfError

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3  # sentencepiece is trained with these (preprocess)


def load_sentencepiece(model: Union[Path, bytes], where: Optional[str] = None):
    """A SentencePieceProcessor from a model file or a model's bytes (a checkpoint's), with xf's
    special ids checked. ``where`` names the source in errors (default: the file)."""
    import sentencepiece as spm

    where = where or str(model)
    sp = spm.SentencePieceProcessor()
    try:
        if isinstance(model, bytes):
            sp.LoadFromSerializedProto(model)
        else:
            sp.Load(str(model))
    except (OSError, RuntimeError, TypeError) as e:
        raise XfError(f"{where}: not a readable sentencepiece model ({e})") from None
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
