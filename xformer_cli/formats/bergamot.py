"""What Bergamot's WebAssembly engine (npm ``@browsermt/bergamot-translator``, Marian inside) loads:
a Marian binary model (``.bin``) whose matrices are int8 as marian-conv writes them
(``--gemm-type intgemm8``), a binary lexical shortlist, and the sentencepiece model as it is.

The layouts are Marian's (browsermt/marian-dev):

* ``.bin`` (src/common/binary.cpp, ``saveItems``/``loadItems``): uint64 version 1, uint64 item
  count, one header per item (uint64 name length with its NUL, type, shape rank, data bytes),
  the NUL-terminated names, the int32 shapes, a uint64 pad length and zeros up to a 256-byte
  boundary, then each item's data padded to 256 bytes. The model's YAML config is the int8 item
  ``special:model.yml`` (src/common/io.cpp, ``addMetaToItems``); Marian merges it into its options
  (src/translator/scorers.cpp, ``createScorers``).
* intgemm8 (src/tensors/cpu/expression_graph_packable.h, ``packAndSave``): a weight of Marian's
  shape (in, out) stored transposed, row-major (out, in), as int8 round(w * q) with one
  q = 127 / max|w| for the whole matrix, then q as a float32. ``Wemb`` is stored untransposed
  and turned back into float32 on load (integer_common.h, ``unquantizeWemb``).
* shortlist (src/data/shortlist.h/.cpp, ``BinaryShortlistGenerator``): a header of six uint64
  (magic, checksum, firstNum, bestNum, offsets length V+1, lists length), uint64 offsets of each
  source id's list, the uint32 target ids of the lists, each sorted; the checksum is
  ``util::hashMem`` (boost's hash_combine over std::hash, the identity for uint64) of the uint64
  words after the first two.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import struct
from importlib import resources
from pathlib import Path
from typing import Mapping, Optional

import numpy as np
import yaml

from ..base.errors import XfError
from ..base.json_input import read_json
from ..decode.shortlist import NUM_SPECIALS, Shortlist
from ..text.languages import two_letters
from ..text.vocab import EOS_ID, UNK_ID

BINARY_FILE_VERSION = 1
ALIGNMENT = 256  # each item's data starts on this boundary (binary.cpp)
# Marian's Type codes (src/common/types.h): type class | bytes per element
FLOAT32, INT8, INTGEMM8 = 0x0400 + 4, 0x0100 + 1, 0x4000 + 0x0100 + 1
CONFIG_ITEM = "special:model.yml"
SHORTLIST_MAGIC = 0xF11A48D5013417F5
MASK64 = (1 << 64) - 1


def is_gemm_weight(name: str) -> bool:
    """Whether marian-conv --gemm-type intgemm8 stores ``name`` as int8: the matrices of the
    affine layers (``..._W``, ``..._Wq``, ``..._W1``) and the embeddings (``Wemb``), by its
    own test on the name (expression_graph_packable.h)."""
    first = name.find("_W")
    return first in (len(name) - 3, len(name) - 2) or "Wemb" in name


def intgemm8(name: str, weight: np.ndarray) -> bytes:
    """``weight`` (Marian's shape) as marian-conv's intgemm8 item data: int8, transposed unless
    it is an embedding, then its quantization multiplier as float32."""
    weight = np.asarray(weight, np.float32)
    peak = float(np.abs(weight).max())
    scale = 127.0 / peak if peak > 0 else 1.0
    rows = weight if "Wemb" in name else weight.reshape(-1, weight.shape[-1]).T
    # np.rint rounds half to even, as intgemm's _mm_cvtps_epi32 does; |w| * scale <= 127 by construction
    quantized = np.clip(np.rint(rows * np.float32(scale)), -127, 127).astype(np.int8)
    return quantized.tobytes() + struct.pack("<f", scale)


def binary_model(params: Mapping[str, np.ndarray], config: Mapping, int8: bool = True) -> bytes:
    """Marian's ``.bin`` of ``params`` (name -> float32 array, Marian's names and shapes) with
    ``config`` as its special:model.yml; the gemm weights intgemm8 when ``int8``."""
    items = []  # (name, type, shape, data): sorted by name, as marian-conv's std::map has them
    for name in sorted(params):
        array = np.ascontiguousarray(params[name], np.float32)
        if int8 and is_gemm_weight(name):
            items.append((name, INTGEMM8, array.shape, intgemm8(name, array)))
        else:
            items.append((name, FLOAT32, array.shape, array.tobytes()))
    meta = yaml.safe_dump(dict(config), sort_keys=False).encode("utf-8") + b"\0"
    items.append((CONFIG_ITEM, INT8, (len(meta),), meta))
    padded = [data + bytes(-len(data) % ALIGNMENT) for _, _, _, data in items]
    head = [struct.pack("<QQ", BINARY_FILE_VERSION, len(items))]
    head += [struct.pack("<QQQQ", len(name.encode()) + 1, kind, len(shape), len(data))
             for (name, kind, shape, _), data in zip(items, padded)]
    head += [name.encode() + b"\0" for name, _, _, _ in items]
    head += [struct.pack(f"<{len(shape)}i", *shape) for _, _, shape, _ in items]
    pos = sum(map(len, head))
    pad = (pos + 8) // ALIGNMENT * ALIGNMENT + ALIGNMENT - pos - 8  # binary.cpp's formula, byte for byte
    return b"".join(head) + struct.pack("<Q", pad) + bytes(pad) + b"".join(padded)


def hash_mem(words: np.ndarray) -> int:
    """Marian's util::hashMem<uint64_t, uint64_t> over ``words`` (uint64): boost's hash_combine
    with std::hash, which is the identity for integers in libstdc++ (where marian-conv runs)."""
    seed = 0
    for v in words.tolist():
        seed ^= (v + 0x9E3779B9 + (seed << 6) + (seed >> 2)) & MASK64
    return seed


def shortlist_lists(shortlist: Shortlist) -> list[np.ndarray]:
    """The target ids Marian adds for each source id, sorted: a source piece's top-k (the eos
    padding dropped) and, on eos's row, the always-candidates: unk, eos and the frequent pieces.

    Marian adds the *first* firstNum ids of the vocabulary for every batch (shortlist.cpp,
    ``generate``), which are xf's frequent pieces only in a vocabulary ordered by frequency; every
    source sentence ends in eos, so eos's list carries them instead (firstNum 0). The specials'
    own rows are empty, as xf ignores them (``Shortlist.candidates``)."""
    lists = []
    for source, row in enumerate(shortlist.per_source):
        if source == EOS_ID:
            ids = np.concatenate([shortlist.frequent, [UNK_ID, EOS_ID]])
        elif source < NUM_SPECIALS:
            ids = np.zeros(0, np.int64)
        else:
            ids = row[row != EOS_ID]
        lists.append(np.unique(ids).astype(np.uint32))
    return lists


def binary_shortlist(shortlist: Shortlist) -> bytes:
    """``shortlist`` as Marian's binary shortlist (BinaryShortlistGenerator)."""
    lists = shortlist_lists(shortlist)
    offsets = np.concatenate([[0], np.cumsum([len(ids) for ids in lists])]).astype(np.uint64)
    targets = np.concatenate(lists).astype(np.uint32)
    body = struct.pack("<QQQQ", 0, shortlist.k, len(offsets), len(targets)) + offsets.tobytes() + targets.tobytes()
    # hashed as whole uint64 words: an odd count of uint32 ids leaves the last one out, as Marian does
    checksum = hash_mem(np.frombuffer(body[: len(body) // 8 * 8], np.uint64))
    return struct.pack("<QQ", SHORTLIST_MAGIC, checksum) + body


# -- the directory: model, shortlist, vocabulary, the engine and the page ------------------------
NPM_PACKAGE, NPM_VERSION = "@browsermt/bergamot-translator", "0.4.9"  # the engine these files are tested with
INSTALL = "make bergamot (npm install --prefix .bergamot @browsermt/bergamot-translator@0.4.9)"
ENGINE_FILES = ("translator.js", "worker/translator-worker.js", "worker/bergamot-translator-worker.js",
                "worker/bergamot-translator-worker.wasm")
PAGE_FILES = ("index.html", "page.js")


def direction_name(source_lang: str, target_lang: str) -> str:
    """Bergamot's name of a direction, ``ende``: the npm package reads a registry key's first two
    letters as the source language and the next two as the target (translator.js). An ISO 639-3
    code is taken as its ISO 639-1 one (deu: de; its first two letters were taken, spa: sp)."""
    codes = [two_letters(lang.lower()) for lang in (source_lang, target_lang)]
    if not all(len(code) == 2 and code.isascii() and code.isalpha() for code in codes):
        raise XfError(f"xf export bergamot: --source-lang {source_lang} --target-lang {target_lang}: Bergamot names "
                      "languages by two letters (en, de)")
    return "".join(codes)


def engine_package(directory: str | Path) -> Path:
    """The npm package's directory, checked: version 0.4.9 and its engine files; else one line
    naming the command that installs it."""
    root = Path(directory)
    try:
        version = read_json(root / "package.json").get("version")
    except (XfError, AttributeError):
        raise XfError(f"{root}: no npm package {NPM_PACKAGE} there; install it with {INSTALL}, "
                      "or name its directory with --bergamot-package") from None
    if version != NPM_VERSION:
        raise XfError(f"{root}: {NPM_PACKAGE} {version}, xf writes for {NPM_VERSION}; install it with {INSTALL}")
    missing = [name for name in ENGINE_FILES if not (root / name).is_file()]
    if missing:
        raise XfError(f"{root}: {NPM_PACKAGE} lacks {', '.join(missing)}; install it again with {INSTALL}")
    return root


def worker_options(beam_size: int, normalize: float) -> dict:
    """The Marian options of the page's search, as registry.json's ``config`` gives them to the
    worker (translator.js merges them over the worker's defaults, translator-worker.js).

    The 0.4.9 worker defaults to ``skip-cost: true``, which loads the model as
    ``models::usage::raw`` (Marian's src/translator/scorers.cpp): its scores are logits with no
    log-softmax. Greedy picks the same word either way, so beam 1 keeps the cheaper default; a wider
    beam ranks hypotheses by sums of those logits, not log-probabilities (Marian's help: "not
    recommended for beam-size > 1"), and so searches otherwise than Marian and xf do."""
    return {"beam-size": beam_size, "normalize": normalize, "skip-cost": beam_size == 1,
            "allow-unk": True}  # unk: as xf


def write_directory(directory: Path, model: bytes, int8: bool, shortlist: Optional[bytes], spm_model: bytes,
                    package: Path, direction: str, decoding: Mapping) -> dict[str, str]:
    """Fill ``directory`` with what the page loads: the model (``int8``: intgemm8 weights), the
    shortlist (if any: without one the worker passes an empty one, which Bergamot skips) and the
    vocabulary under Bergamot's names, registry.json (their sha256, checked by the browser, and
    ``decoding``: Marian options the worker passes on), the engine's files and the page. Returns
    the registry's file names."""
    files = dict(model=(f"model.{direction}.{'intgemm8.' if int8 else ''}bin", model),
                 lex=(f"lex.{direction}.s2t.bin", shortlist), vocab=(f"vocab.{direction}.spm", spm_model))
    names = {part: name for part, (name, data) in files.items() if data is not None}
    entry = {}
    for part, name in names.items():
        data = files[part][1]
        (directory / name).write_bytes(data)
        entry[part] = dict(name=name, size=len(data), expectedSha256Hash=hashlib.sha256(data).hexdigest())
    # int8shiftAll: the WASM build multiplies int8 shifted only, and the worker's default
    # (int8shiftAlphaAll) wants precomputed activation scales (..._QuantMultA) this model lacks
    entry["config"] = {"gemm-precision": "int8shiftAll" if int8 else "float32", **decoding}
    (directory / "registry.json").write_text(json.dumps({direction: entry}, indent=2) + "\n", encoding="utf-8")
    for name in ENGINE_FILES:
        (directory / name).parent.mkdir(exist_ok=True)
        shutil.copyfile(package / name, directory / name)
    page = resources.files("xformer_cli.formats") / "bergamot_page"
    for name in PAGE_FILES:
        (directory / name).write_bytes((page / name).read_bytes())
    return names


def int8_shape_problem(cfg) -> str:
    """Why the WASM engine cannot multiply the model's matrices in int8 ("" if it can): its gemm
    interface needs the inner dimension a multiple of 64 and the output columns a multiple of 8
    (marian-dev src/tensors/cpu/wasm_intgemm_interface.h, lines 9-18)."""
    head_dim = cfg.head_dim or cfg.d_model // cfg.heads
    widths = {"d_model": cfg.d_model, "d_ff": cfg.d_ff, "heads x head_dim": cfg.heads * head_dim}
    bad = [f"{name} {value}" for name, value in widths.items() if value % 64]
    if cfg.vocab_size % 8:
        bad.append(f"a vocabulary of {cfg.vocab_size} (not a multiple of 8)")
    return (f"Bergamot's int8 engine needs widths that are multiples of 64 and a vocabulary that is a multiple "
            f"of 8; this model has {', '.join(bad)}") if bad else ""


def check_int8_shapes(cfg) -> None:
    """Refuse, in one line, a model whose matrices the WASM engine cannot multiply in int8."""
    problem = int8_shape_problem(cfg)
    if problem:
        raise XfError(f"xf export bergamot: {problem}")
