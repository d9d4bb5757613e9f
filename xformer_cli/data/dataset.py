"""Binarized parallel data: the on-disk format and the reader the trainer uses (batching is
``data/batching.py``).

A data directory written by ``xf preprocess`` holds, for each split (train, valid, valid1, ...,
test, test1, ...) and language, two files:

``{split}.{lang}.bin``
    the token ids of every sentence, concatenated, WITHOUT bos/eos, in the smallest unsigned
    dtype that fits the vocabulary (uint8, uint16 or uint32).
``{split}.{lang}.idx``
    a 24-byte little-endian header -- magic ``b"XFIDX\\0\\0\\0"``, format version (uint32), dtype
    code (uint32), sentence count N (uint64) -- then N offsets (int64, in tokens, where each
    sentence starts in the .bin) and N sizes (int32, tokens per sentence).

Both are read through ``np.memmap``, so opening a 36M-pair corpus costs no memory until it is
read. This is fairseq's MMapIndexedDataset idea, with offsets in tokens instead of bytes.

A multilingual directory (``xf preprocess --pairs en-de,en-fr``, text/languages.py) names its files by
side, ``{split}.src.bin`` / ``{split}.tgt.bin`` (meta.json's source_lang "src", target_lang
"tgt"); each split is the concatenation of its directions in the order of ``"pairs"``, every
source sentence led by its target's tag id. meta.json then also holds
``"pairs": ["en-de", "en-fr"]``, ``"sampling_temperature"`` (how xf train draws an epoch across
the directions: data/sampling.py) and, in each split's stats, ``"directions": {"en-de": {"src_file",
"tgt_file", "pairs_in", "pairs"}, ...}``: the pairs each direction kept, in order, so that
direction i is the rows that follow those of the directions before it (``DataDir.directions``).
A bilingual directory has none of these keys.
"""

from __future__ import annotations

import hashlib
import itertools
import mmap
import os
import struct
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from ..base.errors import XfError
from ..base.json_input import read_json
from ..settings.config import INT_MAX, Range, file_number, option_range
from ..settings.options import ModelConfig, PreprocessOptions
from ..text.vocab import BOS_ID, EOS_ID, PAD_ID, UNK_ID, load_sentencepiece

MAGIC = b"XFIDX\x00\x00\x00"
INDEX_VERSION = 1  # of the .idx/.bin pair; bump and add an upgrade path on any layout change
FORMAT_VERSION = 1  # of the data directory as a whole (meta.json "format_version")
_HEADER = struct.Struct("<8sIIQ")  # magic, index version, dtype code, sentence count
DTYPE_CODES = {1: np.uint8, 2: np.uint16, 3: np.uint32}
_CODE_OF = {np.dtype(v): k for k, v in DTYPE_CODES.items()}


def smallest_dtype(vocab_size: int) -> np.dtype:
    """The smallest unsigned dtype holding ids 0 .. vocab_size-1."""
    for dtype in DTYPE_CODES.values():
        if vocab_size - 1 <= np.iinfo(dtype).max:
            return np.dtype(dtype)
    raise XfError(f"vocabulary of {vocab_size} does not fit in uint32")


# --------------------------------------------------------------------------- writing


def _with(prefix: Path, suffix: str) -> Path:
    return prefix.parent / (prefix.name + suffix)  # not with_suffix: "train.en" would lose ".en"


class TokenArrayWriter:
    """Appends sentences to ``PREFIX.bin`` and writes ``PREFIX.idx`` on close.

    Memory stays flat whatever the corpus size: tokens go straight to the .bin file, the sizes to
    a side file, and the offsets are computed from the sizes in chunks when the index is written.
    """

    def __init__(self, prefix: str | Path, dtype: np.dtype):
        self.prefix = Path(prefix)
        self.dtype = np.dtype(dtype)
        if self.dtype not in _CODE_OF:
            raise ValueError(f"unsupported dtype {self.dtype}")
        self._bin = open(_with(self.prefix, ".bin"), "wb")
        self._sizes_path = _with(self.prefix, ".sizes.tmp")
        self._sizes = open(self._sizes_path, "wb")
        self.count = 0
        self.num_tokens = 0

    def add(self, sentences: Sequence[Sequence[int]]) -> None:
        """Append a chunk of sentences (lists or arrays of ids), in order."""
        sizes = np.fromiter(map(len, sentences), dtype=np.int32, count=len(sentences))
        tokens = np.fromiter(itertools.chain.from_iterable(sentences), dtype=self.dtype, count=int(sizes.sum()))
        self.add_flat(tokens, sizes)

    def add_flat(self, tokens: np.ndarray, sizes: np.ndarray) -> None:
        """Append sentences given as their concatenated ids and their sizes (what workers send)."""
        self._bin.write(np.ascontiguousarray(tokens, dtype=self.dtype).tobytes())
        self._sizes.write(np.ascontiguousarray(sizes, dtype=np.int32).tobytes())
        self.count += len(sizes)
        self.num_tokens += len(tokens)

    def close(self, chunk: int = 1 << 20) -> None:
        self._bin.flush()
        os.fsync(self._bin.fileno())  # the directory is renamed into place next: data first
        self._bin.close()
        self._sizes.close()

        def size_chunks():  # plain reads, not a memmap: mapped pages would count as resident memory
            with open(self._sizes_path, "rb") as sizes:
                while len(part := np.fromfile(sizes, np.int32, chunk)):
                    yield part

        with open(_with(self.prefix, ".idx"), "wb") as f:
            f.write(_HEADER.pack(MAGIC, INDEX_VERSION, _CODE_OF[self.dtype], self.count))
            start = 0
            for part in size_chunks():  # offsets = exclusive cumsum of sizes, chunk by chunk
                ends = np.cumsum(part, dtype=np.int64) + start
                f.write((ends - part).tobytes())
                start = int(ends[-1])
            for part in size_chunks():
                f.write(part.tobytes())
            f.flush()
            os.fsync(f.fileno())
        self._sizes_path.unlink()


# --------------------------------------------------------------------------- reading


class TokenArray:
    """Read-only view of one ``PREFIX.bin`` / ``PREFIX.idx`` pair through memory maps."""

    def __init__(self, prefix: str | Path):
        self.prefix = prefix = Path(prefix)
        idx, bin_ = _with(prefix, ".idx"), _with(prefix, ".bin")
        try:
            with open(idx, "rb") as f:
                header = f.read(_HEADER.size)
            bin_bytes = bin_.stat().st_size
        except OSError as e:
            raise XfError(f"cannot read {e.filename}: {e.strerror}") from None
        if len(header) < _HEADER.size or header[:8] != MAGIC:
            raise XfError(f"{idx}: not an xf index file (bad magic number)")
        magic, version, code, count = _HEADER.unpack(header)
        if version != INDEX_VERSION:
            raise XfError(f"{idx}: index format version {version}, this xf reads version {INDEX_VERSION}")
        if code not in DTYPE_CODES:
            raise XfError(f"{idx}: unknown dtype code {code}")
        self.dtype = np.dtype(DTYPE_CODES[code])
        expected = _HEADER.size + count * 12
        if idx.stat().st_size != expected:
            raise XfError(f"{idx}: truncated or corrupt ({idx.stat().st_size} bytes, expected {expected})")
        if count:
            self.offsets = np.memmap(idx, np.int64, "r", offset=_HEADER.size, shape=(count,))
            self.sizes = np.memmap(idx, np.int32, "r", offset=_HEADER.size + 8 * count, shape=(count,))
            num_tokens = int(self.offsets[-1]) + int(self.sizes[-1])
        else:
            self.offsets, self.sizes, num_tokens = np.zeros(0, np.int64), np.zeros(0, np.int32), 0
        if bin_bytes != num_tokens * self.dtype.itemsize:
            raise XfError(f"{bin_}: truncated or corrupt ({bin_bytes} bytes, index says {num_tokens} tokens)")
        # np.memmap cannot map an empty file (a split of empty sentences only)
        self.tokens = np.memmap(bin_, self.dtype, "r") if num_tokens else np.zeros(0, self.dtype)

    def verify(self, vocab_size: int, chunk: int = 1 << 20) -> None:
        """Check what the header cannot: each sentence starts where the one before it ends (so
        offsets are monotonic, inside the .bin and consistent with the sizes) and every id is
        below ``vocab_size``. Vectorized, a chunk at a time, the index and the .bin by plain reads
        (pages touched through the maps would stay resident: 24 bytes a pair for the index of both
        sides), the .bin into one small buffer: see bench/bench_data.py."""
        idx, bin_ = _with(self.prefix, ".idx"), _with(self.prefix, ".bin")
        end = 0  # where the sentence before the chunk ends
        for start in range(0, len(self.sizes), chunk):
            sizes = read_rows(self.sizes, slice(start, start + chunk))
            offsets = read_rows(self.offsets, slice(start, start + chunk))
            if sizes.min() < 0:
                i = start + int(np.argmax(sizes < 0))
                raise XfError(f"{idx}: corrupt: sentence {i} has size {int(self.sizes[i])}")
            ends = np.cumsum(sizes, dtype=np.int64)
            ends += end
            if offsets[0] != end or not np.array_equal(offsets[1:], ends[:-1]):
                wrong = np.flatnonzero(offsets != np.concatenate(([end], ends[:-1])))[0]
                i = start + int(wrong)
                should = end if wrong == 0 else int(ends[wrong - 1])
                raise XfError(f"{idx}: corrupt: sentence {i} starts at token {int(self.offsets[i])} instead of "
                              f"{should} (where the one before it ends)")
            end = int(ends[-1])
        if not len(self.tokens) or np.iinfo(self.dtype).max < vocab_size:  # every id it can hold is valid
            return
        largest = 0
        buffer = np.empty(chunk, self.dtype)
        with open(bin_, "rb", buffering=0) as f:
            while read := f.readinto(memoryview(buffer).cast("B")):
                largest = max(largest, int(buffer[: read // self.dtype.itemsize].max()))
        if largest >= vocab_size:
            raise XfError(f"{bin_}: corrupt: token id {largest} is outside the vocabulary of {vocab_size}")

    def __len__(self) -> int:
        return len(self.sizes)

    def __getitem__(self, i: int) -> np.ndarray:
        start = int(self.offsets[i])
        return np.array(self.tokens[start : start + int(self.sizes[i])], dtype=np.int64)  # a copy, not a map


class ParallelDataset:
    """Aligned source/target sentences of one split: ``src_ids, tgt_ids = ds[i]`` (int64 arrays)."""

    def __init__(self, src: TokenArray, tgt: TokenArray, name: str = ""):
        if len(src) != len(tgt):
            raise XfError(f"split {name!r}: {len(src)} source but {len(tgt)} target sentences")
        self.src, self.tgt, self.name = src, tgt, name

    @property
    def src_sizes(self) -> np.ndarray:
        return self.src.sizes

    @property
    def tgt_sizes(self) -> np.ndarray:
        return self.tgt.sizes

    def __len__(self) -> int:
        return len(self.src)

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        return self.src[i], self.tgt[i]


class DataDir:
    """A complete data directory written by ``xf preprocess``; open it with ``DataDir.open``."""

    def __init__(self, path: Path, meta: dict[str, Any]):
        self.path = path
        self.meta = meta
        self.source_lang: str = meta["source_lang"]
        self.target_lang: str = meta["target_lang"]
        self.vocab_size: int = int(meta["vocab_size"])
        self.splits: list[str] = list(meta["splits"])

    @classmethod
    def open(cls, path: str | Path) -> "DataDir":
        path = Path(path)
        if not path.is_dir():
            raise XfError(f"data directory {path} does not exist (run xf preprocess first)")
        meta_path = path / "meta.json"
        if not meta_path.exists():
            raise XfError(f"{path} is not a complete xf data directory (no meta.json; was xf preprocess interrupted?)")
        meta = read_json(meta_path)
        if not isinstance(meta, dict) or "format_version" not in meta:
            raise XfError(f"{meta_path}: not an xf data directory's meta.json (no format_version)")
        version = meta["format_version"]
        if not isinstance(version, int) or isinstance(version, bool):
            raise XfError(f"{meta_path}: format_version is {version!r}, not an integer (the file is damaged)")
        if version != FORMAT_VERSION:
            raise XfError(
                f"{path}: data format version {version}, this xf reads version {FORMAT_VERSION} (re-run xf preprocess)"
            )
        for key, kind in (("source_lang", str), ("target_lang", str), ("splits", list)):
            if not isinstance(meta.get(key), kind):
                raise XfError(f"{meta_path}: '{key}' is {meta.get(key)!r}, expected a {kind.__name__} (the file is damaged)")
        # its numbers by the one rule for a file's numbers, in the ranges of the options that wrote them
        file_number(meta, "vocab_size", str(meta_path), int, option_range(ModelConfig, "vocab_size"))
        file_number(meta, "sampling_temperature", str(meta_path), float,
                    option_range(PreprocessOptions, "sampling_temperature"), 1.0)
        if not (path / "spm.model").exists():
            raise XfError(f"{path}: spm.model is missing")
        check_meta_against_files(path, meta)
        return cls(path, meta)

    @property
    def pairs(self) -> Optional[list[str]]:
        """The directions of a multilingual directory (["en-de", "en-fr"]); None for a bilingual one."""
        return list(self.meta["pairs"]) if self.meta.get("pairs") else None

    def directions(self, split: str) -> Optional[dict[str, int]]:
        """The pairs each direction has in ``split``, in the order of its rows ({"en-de": 28970,
        "en-fr": 28950}); None for a bilingual directory."""
        if not self.pairs:
            return None
        try:
            kept = {name: file_number(d, "pairs", f"{self.path / 'meta.json'}: stats.{split}.directions.{name}", int,
                                      Range(0, INT_MAX))
                    for name, d in self.meta["stats"][split]["directions"].items()}
        except (KeyError, TypeError, AttributeError):
            raise XfError(f"{self.path / 'meta.json'}: split {split!r} does not record its directions' pairs "
                          "(the file is damaged; re-run xf preprocess)") from None
        if list(kept) != self.pairs:
            raise XfError(f"{self.path / 'meta.json'}: split {split!r} has the directions {', '.join(kept)}, "
                          f"its pairs are {', '.join(self.pairs)} (the file is damaged; re-run xf preprocess)")
        return kept

    @property
    def sampling_temperature(self) -> float:
        return float(self.meta.get("sampling_temperature") or 1.0)  # checked by open

    @property
    def spm_model_bytes(self) -> bytes:
        return (self.path / "spm.model").read_bytes()

    def split(self, name: str) -> ParallelDataset:
        if name not in self.splits:
            raise XfError(f"{self.path} has no split {name!r} (it has: {', '.join(self.splits) or 'none'})")
        src = TokenArray(self.path / f"{name}.{self.source_lang}")
        tgt = TokenArray(self.path / f"{name}.{self.target_lang}")
        for side in (src, tgt):
            if "dtype" in self.meta and side.dtype.name != self.meta["dtype"]:
                raise XfError(f"{_with(side.prefix, '.idx')}: its header says {side.dtype.name}, meta.json says "
                              f"{self.meta['dtype']} (one of them was edited or replaced; re-run xf preprocess)")
            side.verify(self.vocab_size)
        dataset = ParallelDataset(src, tgt, name)
        directions = self.directions(name)
        if directions is not None and sum(directions.values()) != len(dataset):
            raise XfError(f"{self.path / 'meta.json'}: the directions of split {name!r} add up to "
                          f"{sum(directions.values())} pairs, its index holds {len(dataset)} (re-run xf preprocess)")
        return dataset

    def verify_checksums(self) -> list[str]:
        """The files whose sha256 differs from meta.json's ``files`` (missing ones included).

        Reads every byte (``xf preprocess --verify``); opening a split checks structure only."""
        recorded = self.meta.get("files")
        if not isinstance(recorded, dict):
            raise XfError(f"{self.path / 'meta.json'}: no file checksums (written by an older xf preprocess)")
        bad = []
        for name, digest in sorted(recorded.items()):
            try:
                if file_sha256(self.path / name) != digest:
                    bad.append(f"{name} (content changed)")
            except FileNotFoundError:
                bad.append(f"{name} (missing)")
        return bad


def check_meta_against_files(path: Path, meta: dict[str, Any]) -> None:
    """meta.json must agree with what it describes (``DataDir.open``, so also ``--verify``): its
    spm_sha256 with spm.model's bytes, its vocab_size with spm.model's pieces, its special_ids with
    xf's, its dtype with the vocabulary (and, per split, with the index headers: ``split``)."""
    where = path / "meta.json"
    spm_bytes = (path / "spm.model").read_bytes()
    recorded = meta.get("spm_sha256")
    if recorded is not None and recorded != hashlib.sha256(spm_bytes).hexdigest():
        raise XfError(f"{where}: its spm_sha256 is not spm.model's (one of them was edited or replaced; "
                      "re-run xf preprocess)")
    pieces = load_sentencepiece(spm_bytes, str(path / "spm.model")).get_piece_size()
    if meta["vocab_size"] != pieces:
        raise XfError(f"{where}: vocab_size is {meta['vocab_size']} but spm.model has {pieces} pieces (the file was "
                      "edited; re-run xf preprocess)")
    special = dict(pad=PAD_ID, unk=UNK_ID, bos=BOS_ID, eos=EOS_ID)
    if "special_ids" in meta and meta["special_ids"] != special:
        raise XfError(f"{where}: special_ids are {meta['special_ids']}, xf's (and spm.model's) are {special} "
                      "(the file was edited; re-run xf preprocess)")
    if "dtype" in meta and meta["dtype"] != smallest_dtype(pieces).name:
        raise XfError(f"{where}: dtype is {meta['dtype']!r}, but a vocabulary of {pieces} is stored as "
                      f"{smallest_dtype(pieces).name} (the file was edited; re-run xf preprocess)")


def check_trainable(data: DataDir, train: ParallelDataset, valid: ParallelDataset, max_positions: int) -> None:
    """Refuse at start-up what would otherwise fail or mislead later: an empty training or
    validation split (a loss of 0 on no data would choose checkpoint_best.pt), and a pair longer
    than the model's positions (it would stop training at the first batch that holds it). The
    lengths are in the index: nothing is read but the sizes."""
    for split in (train, valid):
        if len(split) == 0:
            raise XfError(f"{data.path}: the {split.name or 'training'} split is empty (re-run xf preprocess "
                          f"with {'--validpref' if split is valid else '--trainpref'} files that hold pairs)")
    for split in (train, valid):
        for side, sizes in ((data.source_lang, split.src_sizes), (data.target_lang, split.tgt_sizes)):
            i = int(np.argmax(sizes))
            if int(sizes[i]) + 1 > max_positions:  # + eos (source) or bos (target input)
                raise XfError(f"{data.path}: {split.name} pair {i + 1} has {int(sizes[i])} {side} subwords, "
                              f"{int(sizes[i]) + 1} positions with eos/bos, more than --max-positions "
                              f"{max_positions}; raise --max-positions to at least {int(sizes[i]) + 1} or "
                              f"re-run xf preprocess with --max-len {max_positions - 1}")


def file_sha256(path: Path, block: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(block):
            h.update(chunk)
    return h.hexdigest()


def read_rows(array: Sequence[int], rows: slice | np.ndarray) -> np.ndarray:
    """``array[rows]`` as a plain array. A contiguous slice of a whole-file np.memmap (a
    TokenArray's sizes or offsets) is read from the file: pages touched through the map would
    stay resident in this process, counted in its memory (4 bytes a pair a side for the sizes)."""
    if isinstance(rows, slice) and isinstance(array, np.memmap) and isinstance(array.base, mmap.mmap):
        start, stop, _ = rows.indices(len(array))
        count = max(0, stop - start)
        return np.fromfile(array.filename, array.dtype, count, offset=array.offset + start * array.itemsize)
    if not isinstance(array, np.ndarray):
        array = np.asarray(array, dtype=np.int64)
    return array[rows]
