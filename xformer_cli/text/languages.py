"""Languages of a model: its translation directions, and the target-language tags of a
multilingual one.

A multilingual model is trained the OPUS-MT way: every source sentence starts with one subword
naming the language to translate into, ``>>deu<<`` (ISO 639-3, as OPUS-MT's tags), a control
symbol of the joint sentencepiece model (reserved: no text ever encodes into it, so a user's
">>deu<<" cannot choose a language, and decoding never writes it). The tag is put in front
of the source by id, never spelled into the text, so ``sp.encode(text)`` stays the sentence's own
subwords; MarianTokenizer does the same with a leading ``>>deu<< `` (its language-code split),
so an exported model translates the same ids.

Where languages are recorded:
- a data directory's meta.json (``xf preprocess --pairs``): ``"pairs": ["en-de", "en-fr"]``;
  its files are then named by the sides, ``train.src.bin`` / ``train.tgt.bin``
  (``source_lang`` "src", ``target_lang`` "tgt"), each split the concatenation of its pairs in
  that order, each split's stats counting the pairs of every direction
  (``"directions": {"en-de": {..., "pairs": 28970}, ...}``, ``DataDir.directions``), and
  ``"sampling_temperature"`` how xf train draws its epochs across them (data/sampling.py); a bilingual
  directory has none of these;
- a checkpoint's ``meta`` (from the data it was trained on): the same "pairs" list beside
  ``source_lang`` / ``target_lang``. A checkpoint with "pairs" is multilingual.

``vocabulary_for`` gives the vocabulary one direction translates with: the model's own for a
bilingual model, a ``TaggedVocabulary`` that starts every source with the target's tag for a
multilingual one. Torch-free.
"""

from __future__ import annotations

import re
from typing import Optional, Sequence

from ..base.errors import XfError
from .vocab import UNK_ID

# ISO 639-1 -> ISO 639-3 (the macrolanguage code OPUS-MT's tags use). A code of three letters is
# taken as it is; a two-letter code missing here is refused with the hint to give three letters.
ISO_639_3 = {
    "af": "afr", "ar": "ara", "az": "aze", "be": "bel", "bg": "bul", "bn": "ben", "bs": "bos", "ca": "cat",
    "cs": "ces", "cy": "cym", "da": "dan", "de": "deu", "el": "ell", "en": "eng", "eo": "epo", "es": "spa",
    "et": "est", "eu": "eus", "fa": "fas", "fi": "fin", "fr": "fra", "ga": "gle", "gl": "glg", "gu": "guj",
    "he": "heb", "hi": "hin", "hr": "hrv", "hu": "hun", "hy": "hye", "id": "ind", "is": "isl", "it": "ita",
    "ja": "jpn", "ka": "kat", "kk": "kaz", "km": "khm", "kn": "kan", "ko": "kor", "lt": "lit", "lv": "lav",
    "mk": "mkd", "ml": "mal", "mn": "mon", "mr": "mar", "ms": "msa", "mt": "mlt", "my": "mya", "nb": "nob",
    "ne": "nep", "nl": "nld", "nn": "nno", "no": "nor", "pa": "pan", "pl": "pol", "pt": "por", "ro": "ron",
    "ru": "rus", "si": "sin", "sk": "slk", "sl": "slv", "sq": "sqi", "sr": "srp", "sv": "swe", "sw": "swa",
    "ta": "tam", "te": "tel", "th": "tha", "tl": "tgl", "tr": "tur", "uk": "ukr", "ur": "urd", "uz": "uzb",
    "vi": "vie", "zh": "zho",
}
_CODE = re.compile(r"[a-z]{2,3}")


def check_code(lang: str, where: str) -> str:
    """``lang`` if it is a language code xf can tag (two letters it knows, or three letters)."""
    if not isinstance(lang, str) or not _CODE.fullmatch(lang) or (len(lang) == 2 and lang not in ISO_639_3):
        raise XfError(f"{where}: {lang!r} is not a language code xf knows: give ISO 639-1 (en, de, fr, ...) or "
                      "ISO 639-3 (eng, deu, fra, ...)")
    return lang


def same_language(a: str, b: str) -> bool:
    """Whether two codes name one language, ISO 639-1 or 639-3 alike (``de`` and ``deu``)."""
    return ISO_639_3.get(a, a) == ISO_639_3.get(b, b)


def two_letters(lang: str) -> str:
    """``lang``'s ISO 639-1 code where it has one (``deu`` -> ``de``), else ``lang``."""
    return next((two for two, three in ISO_639_3.items() if three == lang), lang)


def tag(lang: str) -> str:
    """The target-language tag of ``lang`` (ISO 639-1 or 639-3): ``tag("de") == ">>deu<<"``."""
    return f">>{ISO_639_3.get(lang, lang)}<<"


def parse_pairs(text: str | Sequence[str], where: str = "--pairs") -> list[tuple[str, str]]:
    """``"en-de,en-fr"`` (or a list of ``"en-de"`` items) -> ``[("en", "de"), ("en", "fr")]``:
    each a source and a target code, no pair twice, no pair from a language into itself."""
    items = [p.strip() for p in text.split(",")] if isinstance(text, str) else [str(p).strip() for p in text]
    pairs: list[tuple[str, str]] = []
    for item in items:
        parts = item.split("-")
        if len(parts) != 2 or not all(parts):
            raise XfError(f"{where}: {item!r} is not a pair: expected SOURCE-TARGET, e.g. en-de")
        src, tgt = (check_code(p, f"{where} {item}") for p in parts)
        if src == tgt:
            raise XfError(f"{where}: {item!r} translates {src} into itself")
        if (src, tgt) in pairs:
            raise XfError(f"{where}: {item!r} is given twice")
        pairs.append((src, tgt))
    if not pairs:
        raise XfError(f"{where}: no pair given (expected e.g. en-de,en-fr)")
    return pairs


# a checkpoint meta's record of its languages, and of the language whose address its formality tags choose
# (formality_tags.py)
LANGUAGE_KEYS = ("source_lang", "target_lang", "pairs", "formality")


def languages_of(meta: dict) -> dict:
    """The keys of ``meta`` that say what a model translates (what an average or export carries)."""
    return {key: meta[key] for key in LANGUAGE_KEYS if meta.get(key) is not None}


def describe(languages: dict) -> str:
    """``languages_of``'s record in words: "en-de, en-fr" (multilingual), "en-de", or "no recorded languages";
    "en-de with formality tags" for a model of xf preprocess --formality-tags."""
    tags = " with formality tags" if languages.get("formality") else ""
    if languages.get("pairs"):
        return ", ".join(languages["pairs"]) + tags
    if languages.get("source_lang") or languages.get("target_lang"):
        return f"{languages.get('source_lang', '?')}-{languages.get('target_lang', '?')}{tags}"
    return "no recorded languages" + tags


def pair_names(pairs: Sequence[tuple[str, str]]) -> list[str]:
    return [f"{s}-{t}" for s, t in pairs]


def model_pairs(meta: dict) -> Optional[list[tuple[str, str]]]:
    """The directions a multilingual checkpoint (or data directory) was trained on; None for a
    bilingual one."""
    pairs = meta.get("pairs")
    return parse_pairs(pairs, "the checkpoint's pairs") if pairs else None


def target_languages(meta: dict) -> list[str]:
    """The languages a model translates into, in the order its pairs name them."""
    pairs = model_pairs(meta)
    if pairs is None:
        return [meta["target_lang"]] if meta.get("target_lang") else []
    return list(dict.fromkeys(t for _, t in pairs))


class TagFirst:
    """A vocabulary whose source sentences start with one tag id (``tag_id``): ``encode`` adds it
    to every non-empty sentence; everything else (target text, decoding, pieces) is the wrapped
    vocabulary's (``sp``). Wrappers nest: the outermost tag comes first."""

    def __init__(self, sp, tag_id: int):
        self.sp, self.tag_id = sp, tag_id

    def encode(self, text, out_type=int, **kwargs):
        """Source text (a str or a list of them) -> ids (or pieces), the tag first; an empty
        sentence stays empty (nothing to translate)."""
        if isinstance(text, list):
            return [self.encode(t, out_type, **kwargs) for t in text]
        ids = self.sp.encode(text, out_type=out_type, **kwargs)
        if not ids:
            return ids
        return [self.sp.id_to_piece(self.tag_id) if out_type is str else self.tag_id] + list(ids)

    def __getattr__(self, name):  # decode, id_to_piece, piece_to_id, get_piece_size, ...
        return getattr(self.sp, name)


class TaggedVocabulary(TagFirst):
    """What a multilingual model translates into ``target_lang``: its target's tag first."""

    def __init__(self, sp, target_lang: str, tag_id: int):
        super().__init__(sp, tag_id)
        self.target_lang = target_lang

    def encode_target(self, text, **kwargs):
        from .vocab import encode_target

        return encode_target(self.sp, text, **kwargs)


def vocabulary_for(sp, meta: dict, target_lang: Optional[str], where: str = "the model"):
    """The vocabulary translating into ``target_lang`` with a model of checkpoint ``meta``.

    Bilingual: ``sp`` itself; a ``target_lang`` other than the model's own is refused (None or
    the model's: fine). Multilingual: a ``TaggedVocabulary``; ``target_lang`` is required, must be
    one of the model's targets, and its tag must be one piece of the vocabulary."""
    pairs = model_pairs(meta)
    if pairs is None:
        own = meta.get("target_lang")
        if target_lang is not None and own and not same_language(target_lang, own):
            raise XfError(f"--target-lang {target_lang}: {where} is bilingual and translates into {own} only")
        return sp
    targets = target_languages(meta)
    if target_lang is None:
        raise XfError(f"{where} is multilingual ({', '.join(pair_names(pairs))}): choose the language to translate "
                      f"into with --target-lang ({', '.join(targets)})")
    target_lang = next((t for t in targets if same_language(t, target_lang)), target_lang)  # deu: the model's de
    if target_lang not in targets:
        raise XfError(f"--target-lang {target_lang}: {where} translates into {', '.join(targets)}, not {target_lang}")
    piece = tag(target_lang)
    tag_id = sp.piece_to_id(piece)
    if tag_id == UNK_ID or sp.id_to_piece(tag_id) != piece:
        raise XfError(f"{where}: its vocabulary has no tag {piece} for {target_lang} (a corrupt multilingual "
                      "checkpoint, or a vocabulary from another model)")
    return TaggedVocabulary(sp, target_lang, tag_id)


def source_languages(meta: dict) -> list[str]:
    pairs = model_pairs(meta)
    if pairs is None:
        return [meta["source_lang"]] if meta.get("source_lang") else []
    return list(dict.fromkeys(s for s, _ in pairs))
