"""Argos Translate, where LibreTranslate runs: an xf model as an ``.argosmodel`` package.

A package is a zip of one directory (argostranslate 1.11's ``package.Package``)::

    translate-en_de-1_0/
        metadata.json          from_code, to_code, their names, package_version, type "translate"
        model/                 the CTranslate2 model directory (``formats.ctranslate2``)
        sentencepiece.model    the joint sentencepiece model argostranslate tokenizes with
        minisbd/en.onnx        the sentence splitter (below)

argostranslate translates a text paragraph by paragraph ("\\n"), each paragraph sentence by
sentence. It splits with MiniSBD, whose model it takes from the package's ``minisbd/`` folder
where there is one (argostranslate 1.11 also takes a Stanza model from ``stanza/``, and a spaCy
one only under ARGOS_CHUNK_TYPE=SPACY); a package without one gets MiniSBD's model for its
language, downloaded from GitHub on first use (argostranslate 1.11 and LibreTranslate 1.9's
argos-translate-lt alike). So the package carries its own MiniSBD model: not a trained one, but
``sentence_splitter``'s rule as an ONNX graph, so that nothing is downloaded and the split is the
same on every machine.

This module never imports ctranslate2 or onnx at the top: they are the ``argos`` extra.
"""

from __future__ import annotations

import importlib
import io
import json
import os
import re
import stat
import tempfile
import zipfile
from pathlib import Path
from typing import IO

from ..base.errors import XfError
from ..model.transformer import Transformer

# where argostranslate's MiniSBD marks a character (minisbd.modules.inference): 0 inside a
# token, 1 a token's end, 2 a sentence's end
_SENTENCE_END = 2
_CLASSES = 5
SENTENCE_ENDS = ".!?"  # a sentence ends at one of these followed by a space
_UNITS = ["<PAD>", "<UNK>", "<EMPTY>", "<ROOT>", " ", *SENTENCE_ENDS]  # MiniSBD's vocabulary: any other character is <UNK>


def import_argos_extra():
    """The onnx module once ctranslate2 imports too (the package's model and its sentence splitter),
    or a one-line error naming what is missing and the extra that brings it."""
    missing, onnx = [], None
    for name in ("ctranslate2", "onnx"):
        try:
            onnx = importlib.import_module(name)
        except ImportError:
            missing.append(name)
    if missing:
        raise XfError(f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not installed: "
                      "pip install 'xformer-cli[argos]'")
    return onnx


def check_language(code: str, flag: str) -> str:
    """A language code argostranslate can file a package under (it names a directory)."""
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]{0,15}", code):
        raise XfError(f"{flag} {code!r}: not a language code (letters, digits, - and _, e.g. en, de, zh-hant)")
    return code


def check_version(version: str) -> str:
    """A package version argostranslate can compare and name a directory with."""
    if not re.fullmatch(r"[0-9][0-9A-Za-z.+-]{0,31}", version):
        raise XfError(f"--package-version {version!r}: not a version (digits, letters, ., + and -, e.g. 1.0)")
    return version


def sentence_splitter(lang: str) -> bytes:
    """MiniSBD's model file for ``lang``: an ONNX graph that marks a sentence end at a character of
    SENTENCE_ENDS followed by a space (MiniSBD itself ends the paragraph's last sentence). Its
    inputs are MiniSBD's: ``units`` (B, T) character ids of ``_UNITS``, ``features`` (B, T, 0)
    unused; its output (B, T, 5) one-hot scores of MiniSBD's classes."""
    onnx = import_argos_extra()
    from onnx import TensorProto, helper

    ends = [1.0 if u in SENTENCE_ENDS else 0.0 for u in _UNITS]
    space = [1.0 if u == " " else 0.0 for u in _UNITS]
    inside = [1.0] + [0.0] * (_CLASSES - 1)
    to_end = [-1.0] + [0.0] * (_CLASSES - 1)
    to_end[_SENTENCE_END] = 1.0
    const = lambda name, values, dtype=TensorProto.FLOAT: helper.make_tensor(name, dtype, [len(values)], values)  # noqa: E731
    nodes = [
        helper.make_node("Gather", ["ends", "units"], ["is_end"]),  # (B, T)
        helper.make_node("Gather", ["space", "units"], ["is_space"]),
        helper.make_node("Slice", ["is_space", "one", "last", "one"], ["space_after"]),  # (B, T-1)
        helper.make_node("Slice", ["is_space", "zero", "one", "one"], ["first"]),  # (B, 1)
        helper.make_node("Mul", ["first", "nought"], ["none_after"]),  # the last character: nothing follows
        helper.make_node("Concat", ["space_after", "none_after"], ["followed"], axis=1),  # (B, T)
        helper.make_node("Mul", ["is_end", "followed"], ["boundary"]),
        helper.make_node("Unsqueeze", ["boundary", "two"], ["boundary3"]),  # (B, T, 1)
        helper.make_node("Mul", ["boundary3", "to_end"], ["shift"]),
        helper.make_node("Add", ["shift", "inside"], ["scores"]),  # (B, T, 5)
    ]
    graph = helper.make_graph(
        nodes, "xf-sentence-splitter",
        [helper.make_tensor_value_info("units", TensorProto.INT64, ["batch", "time"]),
         helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", "time", "features"])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["batch", "time", _CLASSES])],
        [const("ends", ends), const("space", space), const("inside", inside), const("to_end", to_end),
         const("nought", [0.0]), const("zero", [0], TensorProto.INT64), const("one", [1], TensorProto.INT64),
         const("two", [2], TensorProto.INT64), const("last", [2**62], TensorProto.INT64)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], producer_name="xf")
    model.ir_version = 8  # ONNX 1.10's: onnx writes its newest by default, more than an older onnxruntime reads
    vocab = {"lang": lang, "idx": 0, "cutoff": 0, "lower": False, "_id2unit": _UNITS,
             "_unit2id": {u: i for i, u in enumerate(_UNITS)}}
    helper.set_model_props(model, {"lang_code": lang, "config": json.dumps({"feat_funcs": [], "max_seqlen": 1000}),
                                   "vocab": json.dumps(vocab), "lexicon": "null"})
    onnx.checker.check_model(model)
    return model.SerializeToString()


def package_directory(source_lang: str, target_lang: str, version: str) -> str:
    """The package's one directory, named as argospm names packages: ``translate-en_de-1_0``."""
    return f"translate-{source_lang}_{target_lang}-{version.replace('.', '_')}"


class _Stream:
    """A file written as a pipe is (write and flush only): zipfile then writes each member's
    sizes after it instead of seeking back to its header. A character device (/dev/null) says it
    can seek, but tells 0 after any write: zipfile's offsets came out negative (struct.error)."""

    def __init__(self, out: IO[bytes]):
        self.write, self.flush = out.write, out.flush


def _regular_file(out: IO[bytes]) -> bool:
    """Whether ``out`` is a regular file (what the output rule replaces), not a FIFO or a device
    (what it streams to: ``fileio.output_route``); an in-memory buffer counts as a file."""
    try:
        return stat.S_ISREG(os.fstat(out.fileno()).st_mode)
    except (AttributeError, OSError, io.UnsupportedOperation):
        return True


def write_package(out: IO[bytes], model: Transformer, spm_model: bytes, *, source_lang: str, target_lang: str,
                  source_name: str, target_name: str, version: str, quantization: str = "float32",
                  source: str = "checkpoint") -> dict:
    """Write the .argosmodel zip of ``model`` (its sentencepiece model ``spm_model``) to ``out``;
    ``source`` (the checkpoint's path) names it in errors. Returns metadata.json's dict."""
    from .ctranslate2 import write_model_directory

    if source_lang == target_lang:
        raise XfError(f"--source-lang and --target-lang are both {source_lang!r}: an Argos package translates "
                      "between two languages")
    splitter = sentence_splitter(source_lang)
    metadata = {"package_version": version, "argos_version": "1.11", "type": "translate",
                "from_code": source_lang, "from_name": source_name, "to_code": target_lang, "to_name": target_name,
                "links": []}
    root = package_directory(source_lang, target_lang, version)
    with tempfile.TemporaryDirectory(prefix="xf-argos-") as tmp:
        model_dir = Path(tmp) / "model"
        write_model_directory(model_dir, model, spm_model, quantization, source)
        # ZIP_STORED: model.bin is floats that deflate barely shrinks, at seconds per 100 MB
        with zipfile.ZipFile(out if _regular_file(out) else _Stream(out), "w", zipfile.ZIP_STORED) as z:
            z.writestr(f"{root}/metadata.json", json.dumps(metadata, indent=1) + "\n")
            for f in sorted(model_dir.iterdir()):
                z.write(f, f"{root}/model/{f.name}")
            z.writestr(f"{root}/sentencepiece.model", spm_model)
            z.writestr(f"{root}/minisbd/{source_lang}.onnx", splitter)
    return metadata
