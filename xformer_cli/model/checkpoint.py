"""Self-contained, versioned checkpoints that load without executing code.

A checkpoint is a plain dict of tensors and plain Python data, saved with torch.save and read
with ``torch.load(weights_only=True)``, so a malicious pickle is refused instead of run:

    format            "xf-checkpoint"
    version           CHECKPOINT_VERSION
    model_config      dict of ModelConfig fields
    model             state dict (tied weights stored once, shared on load)
    spm_model         bytes of the sentencepiece model, or of a mapped vocabulary (source and
                      target sentencepiece models over one piece list: an imported MarianMT
                      model's); translation needs nothing else
    spm_sha256        hex digest of spm_model's bytes (vocabularies are compared by content:
                      ``same_vocabulary``)
    train_state       optional: optimizer, scheduler, scaler, RNG, data position, options, ...
    meta              optional plain dict (epoch, num_updates, validation loss, ...)
"""

from __future__ import annotations

import hashlib
import pickle
import struct
import zipfile
from pathlib import Path
from typing import Any, Optional, Sequence

import torch

from ..base.checkpoint_names import checkpoint_numbers
from ..base.errors import ConfigError, XfError
from ..base.fileio import atomic_write
from ..settings.options import CONVENTIONS, PRESETS, REGULARIZATION
from ..text.vocab import MAPPED_MAGIC, load_sentencepiece
from .transformer import ModelConfig, Transformer, config_from_dict, config_to_dict

CHECKPOINT_FORMAT = "xf-checkpoint"
CHECKPOINT_VERSION = 2


def upgrade_v1(ckpt: dict) -> dict:
    """Version 2 adds two model options, stated in every checkpoint: scale_embedding (version 1
    models all scale by sqrt(d_model)) and output_bias (none had one); and ``spm_model`` may hold
    a mapped vocabulary (``vocab.MappedVocabulary``, imported MarianMT models) instead of a
    sentencepiece model."""
    config = {**ckpt["model_config"], "scale_embedding": True, "output_bias": False} if "model_config" in ckpt else None
    return {**ckpt, "version": 2, **({"model_config": config} if config is not None else {})}


# One function per version change: UPGRADES[v] turns a version-v dict into version v + 1.
UPGRADES: dict[int, Any] = {1: upgrade_v1}


def remove_old_checkpoints(save_dir: Path, keep: int) -> None:
    """Keep the ``keep`` newest checkpoint_<epoch>_<update>.pt (0 keeps all)."""
    if keep <= 0:
        return
    numbered = []
    for p in save_dir.glob("checkpoint_*_*.pt"):
        numbers = checkpoint_numbers(p)
        if numbers:
            numbered.append((numbers[1], numbers[0], p))
    for _, _, p in sorted(numbered)[:-keep]:
        p.unlink(missing_ok=True)


def spm_digest(spm_model: bytes) -> str:
    return hashlib.sha256(spm_model).hexdigest()


def make_checkpoint(
    model: Transformer,
    spm_model: bytes,
    train_state: Optional[dict] = None,
    meta: Optional[dict] = None,
) -> dict:
    """The checkpoint dict of ``model`` (unwrapped from DDP/compile by the caller)."""
    return {
        "format": CHECKPOINT_FORMAT,
        "version": CHECKPOINT_VERSION,
        "model_config": config_to_dict(model.cfg),
        "model": model.state_dict(),
        "spm_model": spm_model,
        "spm_sha256": spm_digest(spm_model),
        "train_state": train_state,
        "meta": dict(meta or {}),
    }


def save_checkpoint(path: str | Path, checkpoint: dict) -> None:
    """Atomic save: temporary file, fsync, rename. The previous file survives any crash, and a
    failed write (a full disk) is an XfError naming the file and the cause (fileio.atomic_write)."""
    with atomic_write(path, "wb") as f:
        torch.save(checkpoint, f)


def _sniff(path: Path) -> Optional[str]:
    """Why ``path`` cannot be a checkpoint without reading it as one, or None. Checkpoints are
    PyTorch zip archives; a text or random file would otherwise reach the legacy unpickler, whose
    error blames weights_only and suggests the unsafe weights_only=False."""
    with open(path, "rb") as f:
        head = f.read(4)
    if not head:
        return "an empty file"
    if head != b"PK\x03\x04":
        return "not a zip archive, as PyTorch checkpoints are"
    if not zipfile.is_zipfile(path):
        return "a truncated zip archive (the copy or save did not finish?)"
    return None


def load_checkpoint(path: str | Path, mmap: bool = False) -> dict:
    """Load and validate an xf checkpoint; refuse anything else with a clear error. mmap: the
    tensors mapped from the file, not read (to look at its meta without loading the model)."""
    path = Path(path)
    if path.is_dir() and (path / "model.bin").exists():
        raise XfError(f"{path}: a CTranslate2 model directory, not an xf checkpoint (translate it with "
                      "--engine ctranslate2)")
    if path.is_dir():
        raise XfError(f"{path}: a directory, not a checkpoint file (e.g. {path / 'checkpoint_best.pt'})")
    if not path.is_file():
        raise XfError(f"{path}: checkpoint not found")
    try:
        why = _sniff(path)
        if why is None:
            ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError:
        why = ("it holds Python objects other than tensors and plain data, which xf never writes; "
               "they were not loaded, as loading them could run code")
    # Corrupt bytes fail deep inside the zip reader or unpickler with almost any error.
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError, ValueError, struct.error, IndexError, KeyError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0].split(". ")[0]
        why = f"corrupt: {first}"
    if why is not None:
        raise XfError(f"{path}: not an xf checkpoint ({why})")
    if not isinstance(ckpt, dict) or ckpt.get("format") != CHECKPOINT_FORMAT:
        raise XfError(f"{path}: not an xf checkpoint (a PyTorch file without the xf header "
                      f"'format: {CHECKPOINT_FORMAT}')")
    version = ckpt.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise XfError(f"{path}: corrupt xf checkpoint: its format version is {version!r}, not a positive integer")
    if version > CHECKPOINT_VERSION:
        raise XfError(
            f"{path}: checkpoint format version {version} is newer than this xf "
            f"(reads up to {CHECKPOINT_VERSION}); upgrade xf"
        )
    while version < CHECKPOINT_VERSION:
        ckpt = UPGRADES[version](ckpt)
        version = ckpt["version"]
    for key in ("model_config", "model", "spm_model"):
        if key not in ckpt:
            raise XfError(f"{path}: xf checkpoint is missing '{key}'")
    return ckpt


def load_last_checkpoint(path: Path) -> dict:
    """``checkpoint_last.pt`` to resume from; when it is unreadable, the error names the newest
    numbered checkpoint beside it that loads."""
    try:
        return load_checkpoint(path)
    except XfError as e:
        newest = newest_intact_checkpoint(path.parent)
        hint = (f"; the newest intact checkpoint is {newest}: copy it to {path} to resume from it"
                if newest else "; no intact numbered checkpoint is beside it")
        raise XfError(f"{e}{hint}") from None


def newest_intact_checkpoint(save_dir: Path) -> Optional[Path]:
    """The checkpoint_<epoch>_<update>.pt with the highest update number that loads, or None."""
    numbered = [p for p in save_dir.glob("checkpoint_*_*.pt") if checkpoint_numbers(p)]
    for p in sorted(numbered, key=lambda p: checkpoint_numbers(p)[::-1], reverse=True):
        try:
            ckpt = load_checkpoint(p)
        except XfError:
            continue
        if ckpt.get("train_state"):
            return p
    return None


def vocab_digest(spm_model: bytes) -> str:
    """The identity of a vocabulary: sha256 of its pieces, scores and types in id order.

    Two sentencepiece models can differ in bytes (trainer settings or file paths recorded in
    them) and still be the same vocabulary; resuming, averaging and ensembling need only that.
    """
    import sentencepiece

    if spm_model.startswith(MAPPED_MAGIC):  # its bytes are its identity: pieces and both models, in order
        return "mapped:" + spm_digest(spm_model)
    sp = sentencepiece.SentencePieceProcessor()
    try:
        sp.LoadFromSerializedProto(spm_model)
    except (RuntimeError, OSError, TypeError):
        return "unreadable:" + spm_digest(spm_model)
    h = hashlib.sha256()
    for i in range(sp.get_piece_size()):  # the score orders BPE merges, so it is part of the vocabulary
        kind = "c" if sp.is_control(i) else "u" if sp.is_unknown(i) else "n"
        h.update(f"{i}\t{sp.id_to_piece(i)}\t{sp.get_score(i)!r}\t{kind}\n".encode("utf-8"))
    return h.hexdigest()


def same_vocabulary(a: bytes, b: bytes) -> bool:
    return a == b or vocab_digest(a) == vocab_digest(b)


def model_from_checkpoint(ckpt: dict, path: str | Path = "checkpoint") -> Transformer:
    """Rebuild the model of a loaded checkpoint with its weights."""
    try:
        cfg: ModelConfig = config_from_dict(ckpt["model_config"])
        model = Transformer(cfg)
        model.load_state_dict(ckpt["model"])
    except (XfError, RuntimeError, TypeError) as e:  # load_state_dict's message spans lines: one line here
        raise XfError(f"{path}: model does not match its configuration: {' '.join(str(e).split())}") from None
    return model


def load_initial_model(path: str | Path, data_vocabulary: bytes, data_path: Path, given: dict,
                       arch: Optional[str] = None, convert: bool = False) -> tuple[ModelConfig, dict]:
    """(model configuration, weights) of checkpoint ``path`` to fine-tune from (xf train --init-from).

    ``given``: the model options set on the command line or in YAML (None: not set); one that
    differs from the checkpoint's is an error, except the dropouts (``REGULARIZATION``) and, with
    ``convert`` (--init-from-convert), the conventions (``CONVENTIONS``), one of which must then
    differ; so is a preset ``arch`` whose shape is not the checkpoint's. The data must have the
    checkpoint's vocabulary (``data_vocabulary``, the bytes of data_path/spm.model)."""
    ckpt = load_checkpoint(path)
    if not same_vocabulary(ckpt["spm_model"], data_vocabulary):
        raise XfError(f"{data_path}/spm.model: the data's vocabulary is not that of --init-from {path}; write the data "
                      f"with xf preprocess --vocab-from {path}")
    values = dict(ckpt["model_config"])
    for name, value in (PRESETS[arch] if arch else {}).items():  # the preset's shape, as the options given change it
        if name not in REGULARIZATION and given.get(name) is None and value != values.get(name):
            raise ConfigError(f"--arch {arch} conflicts with --init-from {path}, whose model has {name.replace('_', '-')} "
                              f"{values.get(name)} ({arch}: {value}); the model comes from the checkpoint (leave out --arch)")
    changeable = REGULARIZATION + (CONVENTIONS if convert else ())
    for name, value in given.items():
        if value is None or value == values.get(name):
            continue
        if name not in changeable:
            hint = "; --init-from-convert lets --sinusoids and --decoder-start change" if name in CONVENTIONS else ""
            raise ConfigError(f"--{name.replace('_', '-')} {value} conflicts with --init-from {path}, whose model has "
                              f"{values.get(name)} (the model options come from the checkpoint{hint})")
        values[name] = value
    cfg, trained = config_from_dict(values), config_from_dict(ckpt["model_config"])
    if convert and all(getattr(cfg, name) == getattr(trained, name) for name in CONVENTIONS):
        raise ConfigError(f"--init-from-convert changes nothing: --init-from {path} has --sinusoids {cfg.sinusoids} "
                          f"--decoder-start {cfg.decoder_start} already; give the ones to convert to")
    model_from_checkpoint(ckpt, path)  # its weights fit its configuration
    return cfg, ckpt["model"]


def load_ensemble(paths: Sequence[str], device: torch.device, dtype: torch.dtype = torch.float32):
    """Models of ``paths`` in eval mode on ``device`` and the sentencepiece model they share
    (``load_models`` without the meta)."""
    models, sp, _ = load_models(paths, device, dtype)
    return models, sp


def load_models(paths: Sequence[str], device: torch.device, dtype: torch.dtype = torch.float32):
    """(models, sentencepiece model, meta): the models of ``paths`` in eval mode on ``device``,
    the vocabulary they share and the first checkpoint's meta (its languages: ``text/languages.py``).

    An ensemble must share one vocabulary (the same sentencepiece pieces and ids) and one set of
    directions: multilingual members the same pairs, never a bilingual member beside a
    multilingual one; and formality tags in every member or in none.
    """
    from ..text.languages import model_pairs, pair_names

    if not paths:
        raise ConfigError("give a checkpoint with --path")
    models: list[Transformer] = []
    sp, first_spm, meta = None, None, {}
    for path in paths:
        ckpt = load_checkpoint(path)
        if sp is None:
            sp, first_spm = load_sentencepiece(ckpt["spm_model"], str(path)), ckpt["spm_model"]
            meta = dict(ckpt.get("meta") or {})
        elif not same_vocabulary(ckpt["spm_model"], first_spm):
            raise XfError(
                f"{path}: its vocabulary (sentencepiece model) differs from {paths[0]}'s; "
                "an ensemble needs checkpoints trained on the same vocabulary"
            )
        else:
            mine, first = model_pairs(ckpt.get("meta") or {}), model_pairs(meta)
            if mine != first:
                said = lambda p: "bilingual" if p is None else f"multilingual ({', '.join(pair_names(p))})"  # noqa: E731
                raise XfError(f"{path} is {said(mine)} but {paths[0]} is {said(first)}: an ensemble's models "
                              "translate the same directions")
            tags = (ckpt.get("meta") or {}).get("formality")
            if tags != meta.get("formality"):  # text/formality_tags.py
                with_tags, without = (path, paths[0]) if tags else (paths[0], path)
                raise XfError(f"{with_tags} has formality tags but {without} has none: an ensemble's models read the "
                              "same tags")
        model = model_from_checkpoint(ckpt, path)
        if model.cfg.vocab_size != sp.get_piece_size():
            raise XfError(
                f"{path}: model vocabulary {model.cfg.vocab_size} != sentencepiece vocabulary {sp.get_piece_size()}"
            )
        models.append(model.to(device=device, dtype=dtype).eval())
        del ckpt
    return models, sp, meta
