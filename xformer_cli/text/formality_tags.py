"""Formality tags: how a model is told to address its reader formally (Sie) or informally (du).

A model trained on data of ``xf preprocess --formality-tags`` has seen every training source
whose German target addresses its reader start with ``>>formal<<`` or ``>>informal<<``, as the
classifier (``formality.classify``) labelled the target; a target with no address (``none``)
left its source untagged, so an untagged source asks for the corpus's own mix. The tags are
control symbols of the sentencepiece model, as the target-language tags of ``--pairs`` are
(languages.py: no text encodes into them, and decoding never writes them), put in front of the
source by id; with ``--pairs`` the formality tag comes right after the target-language tag
(``>>deu<< >>formal<< ...``), so that a multilingual source still starts with its language.

Where it is recorded: a data directory's meta.json and a checkpoint's ``meta`` hold
``"formality": "de"``, the language whose address the tags choose (the classifier reads German),
beside the languages (``languages.LANGUAGE_KEYS``: average and exports carry it); meta.json's
split stats count the tagged pairs (``"formality": {"formal": n, "informal": n, "untagged": n}``).
``xf translate --formality formal|informal`` (or a jsonl line's ``"formality"``) puts the tag in
front of every source (``source_vocabulary``); a model that records no formality refuses it.
Torch-free.
"""

from __future__ import annotations

from typing import Optional

from ..base.errors import ConfigError, XfError
from .formality import FORMALITIES, LANGUAGE
from .languages import TagFirst, same_language
from .vocab import UNK_ID

TAGS = {formality: f">>{formality}<<" for formality in FORMALITIES}  # >>formal<<, >>informal<<


def tagged_targets(targets: list[str]) -> list[str]:
    """The target languages whose pairs --formality-tags classifies (German ones)."""
    return [t for t in targets if same_language(t, LANGUAGE)]


def tag_ids(sp, where: str) -> dict[str, int]:
    """{"formal": id, "informal": id} of the vocabulary ``sp``; an XfError naming ``where`` when
    a tag is not one piece of it."""
    ids = {}
    for formality, piece in TAGS.items():
        ids[formality] = sp.piece_to_id(piece)
        if ids[formality] == UNK_ID or sp.id_to_piece(ids[formality]) != piece:
            raise XfError(f"{where}: its vocabulary has no piece {piece}, the tag --formality-tags puts before a "
                          "source whose target is formal or informal (learn the vocabulary with it as a control "
                          "symbol, or leave the vocabulary to xf preprocess)")
    return ids


class FormalityVocabulary(TagFirst):
    """A source vocabulary whose non-empty sentences start with one formality tag id. Wrapped in
    turn by a multilingual model's TaggedVocabulary, it follows the target-language tag."""

    def __init__(self, sp, formality: str, tag_id: int):
        super().__init__(sp, tag_id)
        self.formality = formality


def with_formality(sp, formality: Optional[str], model_formality: Optional[str], target_lang: Optional[str],
                   where: str):
    """``sp`` with ``formality``'s tag in front of every source (``sp`` itself for None), for a
    model whose record says ``model_formality`` (the language its tags are for, or None); a
    ConfigError of one line naming the model where it has no formality tags, or where
    ``target_lang`` is another language than its tags'."""
    if formality is None:
        return sp
    if formality not in TAGS:
        raise ConfigError(f"--formality {formality!r}: expected formal or informal")
    if model_formality is None:
        raise ConfigError(f"--formality {formality}: {where} has no formality tags (train it on data of "
                          "xf preprocess --formality-tags)")
    if target_lang is not None and not same_language(target_lang, model_formality):
        raise ConfigError(f"--formality {formality}: {where}'s formality tags choose the address of "
                          f"{model_formality}, not of {target_lang}")
    try:
        return FormalityVocabulary(sp, formality, tag_ids(sp, where)[formality])
    except XfError as e:
        raise ConfigError(str(e)) from None
