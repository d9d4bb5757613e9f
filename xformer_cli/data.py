"""Binarized parallel data: the on-disk format, the reader the trainer uses, and token batching.

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
"""

from __future__ import annotations

import hashlib
import itertools
import json
import mmap
import os
import struct
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from .errors import XfError
from .vocab import BOS_ID, EOS_ID, PAD_ID

if TYPE_CHECKING:
    import torch

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
            sizes = _rows(self.sizes, slice(start, start + chunk))
            offsets = _rows(self.offsets, slice(start, start + chunk))
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
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise XfError(f"{meta_path}: unreadable ({e})") from None
        if not isinstance(meta, dict) or "format_version" not in meta:
            raise XfError(f"{meta_path}: not an xf data directory's meta.json (no format_version)")
        version = meta["format_version"]
        if not isinstance(version, int) or isinstance(version, bool):
            raise XfError(f"{meta_path}: format_version is {version!r}, not an integer (the file is damaged)")
        if version != FORMAT_VERSION:
            raise XfError(
                f"{path}: data format version {version}, this xf reads version {FORMAT_VERSION} (re-run xf preprocess)"
            )
        for key, kind in (("source_lang", str), ("target_lang", str), ("vocab_size", int), ("splits", list)):
            if not isinstance(meta.get(key), kind):
                raise XfError(f"{meta_path}: '{key}' is {meta.get(key)!r}, expected a {kind.__name__} (the file is damaged)")
        if not (path / "spm.model").exists():
            raise XfError(f"{path}: spm.model is missing")
        return cls(path, meta)

    @property
    def spm_model_bytes(self) -> bytes:
        return (self.path / "spm.model").read_bytes()

    def split(self, name: str) -> ParallelDataset:
        if name not in self.splits:
            raise XfError(f"{self.path} has no split {name!r} (it has: {', '.join(self.splits) or 'none'})")
        src = TokenArray(self.path / f"{name}.{self.source_lang}")
        tgt = TokenArray(self.path / f"{name}.{self.target_lang}")
        for side in (src, tgt):
            side.verify(self.vocab_size)
        return ParallelDataset(src, tgt, name)

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


def file_sha256(path: Path, block: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(block):
            h.update(chunk)
    return h.hexdigest()


# --------------------------------------------------------------------------- batching


def batch_by_size(
    src_sizes: Sequence[int],
    tgt_sizes: Sequence[int] | None = None,
    max_tokens: int | None = None,
    max_sentences: int | None = None,
    seed: int | None = None,
    longest_first: bool = False,
) -> list[np.ndarray]:
    """Group sentence indices into batches of similar length under a token or sentence budget.

    Indices are sorted by the longer side's length, then source length, then target length
    (stable; with ``seed``, pairs of equal lengths are shuffled first, so ties come in a random but
    reproducible order); shortest first, or longest first. Batches are cut greedily along that order so that, on each side, ``batch
    size * longest padded length <= max_tokens`` (None: no token budget), where the padded length
    counts the eos (source, target) or bos (decoder input): ``size + 1``, and so that a batch
    holds at most ``max_sentences``. A pair longer than ``max_tokens`` on its own gets a batch of
    its own (and a warning). Returns a list of index arrays (int32: views of one array of
    4 bytes a pair); the caller shuffles the order of batches.

    Source-only mode (``tgt_sizes`` None: translation, validation BLEU) batches by source length
    alone, and an oversize sentence is batched alone without a warning (every line is translated).

    Memory: the returned order (4 bytes a pair) and the list's views (under 1 byte a pair at
    4096 tokens a batch), besides them a chunk of pairs and a table of lengths (``length_order``);
    sizes in a TokenArray's memory map are read from its file, so they do not stay resident.
    """
    if tgt_sizes is not None and len(tgt_sizes) != len(src_sizes):
        raise ValueError(f"{len(src_sizes)} source sizes but {len(tgt_sizes)} target sizes")
    if max_tokens is not None and max_tokens < 1:
        raise ValueError("max_tokens must be positive")
    if max_tokens is None and not max_sentences:
        raise ValueError("batch_by_size needs max_tokens or max_sentences")
    n = len(src_sizes)
    perm = None if seed is None else np.random.default_rng(seed).permutation(n)
    order, run_starts, run_lengths = length_order(src_sizes, tgt_sizes, descending=longest_first, perm=perm)
    del perm

    def longest(start: int, stop: int) -> np.ndarray:
        """The padded length of the longer side of pairs order[start:stop] (int64)."""
        first = int(np.searchsorted(run_starts, start, side="right")) - 1
        last = int(np.searchsorted(run_starts, stop, side="left"))
        return np.repeat(run_lengths[first:last], np.diff(np.clip(run_starts[first : last + 1], start, stop)))

    cap = min(max_sentences or n, max_tokens or n, n) if n else 0
    batches, oversize, start = [], 0, 0
    while start < n:
        if max_tokens is None:
            k = min(cap, n - start)
        else:
            run = int(np.searchsorted(run_starts, start, side="right")) - 1
            length = int(run_lengths[run])
            per = min(cap, max(1, max_tokens // length))  # no batch starting here holds more pairs
            if not longest_first and length <= max_tokens:
                # Shortest first, the length never decreases: inside a run of pairs of this length
                # every batch the greedy cut makes is ``per`` pairs. Cut them all at once (one step
                # per distinct length, not per batch: 36M pairs make some 10^5 batches).
                full = (int(run_starts[run + 1]) - start) // per
                if full > 1:
                    batches.extend(order[i : i + per] for i in range(start, start + full * per, per))
                    start += full * per
                    continue
            # Sizes of the candidate batches order[start:start+k] for k = 1..per; the cost k * max
            # length only grows with k, so the batch ends before the first k over budget.
            window = longest(start, min(start + per, n))
            cost = np.maximum.accumulate(window) * np.arange(1, len(window) + 1)
            k = int(np.searchsorted(cost, max_tokens, side="right"))
            if k == 0:
                k, oversize = 1, oversize + 1
        batches.append(order[start : start + k])
        start += k
    if oversize and tgt_sizes is not None:
        warnings.warn(f"{oversize} pair(s) longer than max_tokens={max_tokens} got a batch of their own", stacklevel=2)
    return batches


def length_order(
    src_sizes: Sequence[int],
    tgt_sizes: Sequence[int] | None = None,
    descending: bool = False,
    perm: np.ndarray | None = None,
    chunk: int = 1 << 20,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pair indices sorted by padded length (``size + 1``) of the longer side, then of the
    source, then of the target (source only: ``tgt_sizes`` None), stable: ties keep index order,
    or with ``perm``, a permutation, the order they have in it.

    Returns ``(order, run_starts, run_lengths)``: the indices (int32 below 2^31 pairs: 4 bytes a
    pair), and the runs of equal longer-side length along ``order``: run r covers
    ``order[run_starts[r]:run_starts[r + 1]]`` (R + 1 starts, the last n) and has padded length
    ``run_lengths[r]`` (R, int64).

    A counting sort, a chunk of pairs at a time. The keys are a function of the two padded
    lengths, so a table of (source, target) lengths holds each key's rank: the first pass counts
    the pairs of each length pair, the second writes each chunk's indices to their places. Besides
    ``order`` it holds one chunk and the table: (longest source + 1) x (longest target + 1)
    entries, 63,504 after ``xf preprocess``'s default --max-len 250. (Sorting all pairs at once --
    one radix pass per key, each gathering and argsorting the whole corpus -- peaked at some 27
    bytes a pair, 1 GB for 36M pairs.) Tables over 2^22 entries (sentences of thousands of
    subwords) sort all pairs at once instead.
    """
    src_sizes, tgt_sizes = (s if s is None or isinstance(s, np.ndarray) else np.asarray(s, np.int64)
                            for s in (src_sizes, tgt_sizes))
    n = len(src_sizes)
    spans = [slice(start, min(start + chunk, n)) for start in range(0, n, chunk)]
    width = [max((int(_rows(s, span).max()) + 2 for span in spans), default=1) if s is not None else 1
             for s in (src_sizes, tgt_sizes)]  # padded lengths 0 .. longest + 1 on each side
    if width[0] * width[1] > 1 << 22:
        return _length_order_at_once(src_sizes, tgt_sizes, descending, perm)

    def chunks():  # (the pairs' indices, their length pair src * width[1] + tgt), in the order ties keep
        for span in spans:
            rows = span if perm is None else np.asarray(perm[span])
            code = _rows(src_sizes, rows).astype(np.int64) + 1
            if tgt_sizes is not None:
                code *= width[1]
                code += _rows(tgt_sizes, rows)
                code += 1
            yield rows, code

    counts = np.zeros(width[0] * width[1], np.int64)
    for _, code in chunks():
        counts += np.bincount(code, minlength=len(counts))
    present = np.flatnonzero(counts)  # the length pairs that occur, sorted by key:
    src, tgt = (present, present) if tgt_sizes is None else (present // width[1], present % width[1])
    longer = np.maximum(src, tgt)
    present = present[np.lexsort((tgt, src, longer))[:: -1 if descending else 1]]
    rank = np.zeros(len(counts), np.uint16 if len(present) <= 1 << 16 else np.int64)  # uint16: a radix sort
    rank[present] = np.arange(len(present))
    counts = counts[present]
    free = np.cumsum(counts) - counts  # where the next pair of each key goes
    order = np.empty(n, np.int32 if n < 2**31 else np.int64)
    for rows, code in chunks():
        ranks = rank[code]
        by_rank = np.argsort(ranks, kind="stable")
        here = np.bincount(ranks, minlength=len(present))
        # a pair's place: its key's next free slot + the pairs of its key before it in this chunk
        place = (free - (np.cumsum(here) - here))[ranks[by_rank]]
        place += np.arange(len(place))
        order[place] = by_rank + rows.start if perm is None else rows[by_rank]
        free += here
    longer = (present if tgt_sizes is None else np.maximum(present // width[1], present % width[1])).astype(np.int64)
    return (order, *_runs(longer, counts))


def _runs(longer: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(run_starts, run_lengths)`` of groups of ``counts[i]`` pairs of longer-side length
    ``longer[i]``, in order: consecutive groups of one length make one run."""
    first = np.flatnonzero(np.concatenate([[True], longer[1:] != longer[:-1]])) if len(longer) else np.zeros(0, np.int64)
    starts = np.concatenate([[0], np.cumsum(counts)])[np.concatenate([first, [len(longer)]])]
    return starts.astype(np.int64), longer[first]


def _length_order_at_once(src_sizes, tgt_sizes, descending, perm):
    """``length_order`` for lengths too long for its table: np.lexsort of the whole corpus at once."""
    src = np.asarray(src_sizes, np.int64) + 1
    tgt = src if tgt_sizes is None else np.asarray(tgt_sizes, np.int64) + 1
    longer = np.maximum(src, tgt)
    order = np.arange(len(src)) if perm is None else np.asarray(perm)
    sign = -1 if descending else 1
    order = order[np.lexsort([sign * k[order] for k in (tgt, src, longer)])]
    return (order.astype(np.int32 if len(src) < 2**31 else np.int64), *_runs(longer[order], np.ones(len(src), np.int64)))


def _rows(array: Sequence[int], rows: slice | np.ndarray) -> np.ndarray:
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


def epoch_order(num_batches: int, seed: int, epoch: int) -> np.ndarray:
    """The order of the length-grouped batches in ``epoch``: shuffled, reproducibly from the seed."""
    return np.random.default_rng([seed, epoch]).permutation(num_batches)


def rank_share(chunk: np.ndarray, order: np.ndarray, rank: int, world_size: int) -> np.ndarray:
    """This rank's micro-batches of one update: every world_size-th batch of ``chunk``.

    The last update of an epoch may have fewer batches than ranks; it borrows batches from the
    start of the epoch so that every rank takes part in the gradient all-reduce.
    """
    if len(chunk) < world_size:
        chunk = np.concatenate([chunk, order[: world_size - len(chunk)]])
    return chunk[rank::world_size]


def update_batches(order: np.ndarray, offset: int, update_freq: int, rank: int, world_size: int) -> np.ndarray:
    """The batches (indices into the batch list) of this rank's micro-batches for the update that
    starts at ``offset`` of the epoch's ``order``: update_freq of them (the last update of an
    epoch may have fewer)."""
    chunk = order[offset : offset + update_freq * world_size]
    return rank_share(chunk, order, rank, world_size)


def collate(samples: Sequence[tuple[np.ndarray, np.ndarray]]) -> dict[str, Any]:
    """Pad a list of ``(src_ids, tgt_ids)`` into a training batch.

    Returns LongTensors ``src`` (B, S) = ids + [eos], ``prev_output`` (B, T) = [bos] + tgt ids and
    ``target`` (B, T) = tgt ids + [eos], right-padded with pad 0, plus the ints ``ntokens`` (non-pad
    target tokens), ``nsentences`` (B) and ``src_tokens`` (non-pad source tokens).
    """
    import torch  # here, so that xf preprocess never pays for importing torch

    b = len(samples)
    src_lens = [len(s) + 1 for s, _ in samples]
    tgt_lens = [len(t) + 1 for _, t in samples]
    prev = np.full((b, max(tgt_lens, default=0)), PAD_ID, dtype=np.int64)
    target = np.full_like(prev, PAD_ID)
    for i, (_, t) in enumerate(samples):
        prev[i, 0] = BOS_ID
        prev[i, 1 : len(t) + 1] = t
        target[i, : len(t)] = t
        target[i, len(t)] = EOS_ID
    return {
        "src": collate_source([s for s, _ in samples]),
        "prev_output": torch.from_numpy(prev),
        "target": torch.from_numpy(target),
        "target_rows": torch.from_numpy(np.flatnonzero(target.reshape(-1) != PAD_ID)),
        "ntokens": sum(tgt_lens),
        "nsentences": b,
        "src_tokens": sum(src_lens),
    }


def collate_source(sentences: Sequence[Sequence[int]]) -> torch.Tensor:
    """The encoder's input: a LongTensor (B, S) of ids + [eos], right-padded with pad."""
    import torch  # here, so that xf preprocess never pays for importing torch

    src = np.full((len(sentences), max((len(s) + 1 for s in sentences), default=0)), PAD_ID, dtype=np.int64)
    for i, s in enumerate(sentences):
        src[i, : len(s)] = s
        src[i, len(s)] = EOS_ID
    return torch.from_numpy(src)
