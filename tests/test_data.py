"""The binary format (round trip through the memory map), DataDir, batching (batch_by_size, the
epoch order, each rank's share of an update) and collate."""

import itertools
import json
import warnings

import numpy as np
import pytest
import torch

from xformer_cli.data.batching import batch_by_size, collate, collate_source, epoch_order, length_order, rank_share, update_batches
from xformer_cli.data.dataset import FORMAT_VERSION, DataDir, TokenArray, TokenArrayWriter, smallest_dtype
from xformer_cli.base.errors import XfError

from helpers import learn_spm

SENTENCES = [[5, 6, 7], [], [300, 4], [9], [65535, 0, 1, 2, 3]]


def write_array(prefix, sentences, dtype=np.uint16, chunk=2):
    w = TokenArrayWriter(prefix, dtype)
    for i in range(0, len(sentences), 2):  # several add() calls, as preprocess does
        w.add(sentences[i : i + 2])
    w.close(chunk=chunk)  # small chunks: the chunked offset computation must carry over


def test_smallest_dtype():
    assert smallest_dtype(256) == np.uint8
    assert smallest_dtype(257) == np.uint16
    assert smallest_dtype(65536) == np.uint16
    assert smallest_dtype(65537) == np.uint32


def test_format_round_trip_through_memmap(tmp_path):
    write_array(tmp_path / "train.en", SENTENCES)
    arr = TokenArray(tmp_path / "train.en")
    assert isinstance(arr.tokens, np.memmap) and arr.dtype == np.uint16
    assert len(arr) == len(SENTENCES)
    assert arr.sizes.tolist() == [3, 0, 2, 1, 5]
    assert arr.offsets.tolist() == [0, 3, 3, 5, 6]
    for i, s in enumerate(SENTENCES):
        assert arr[i].tolist() == s and arr[i].dtype == np.int64
    assert (tmp_path / "train.en.bin").stat().st_size == 11 * 2  # 11 tokens of 2 bytes
    assert not (tmp_path / "train.en.sizes.tmp").exists()


def test_empty_array_and_empty_sentences(tmp_path):
    write_array(tmp_path / "a", [])
    assert len(TokenArray(tmp_path / "a")) == 0
    write_array(tmp_path / "b", [[], []], dtype=np.uint8)
    b = TokenArray(tmp_path / "b")
    assert len(b) == 2 and b[1].tolist() == []


def test_bad_magic_version_and_truncation(tmp_path):
    write_array(tmp_path / "x", SENTENCES)
    idx, bin_ = tmp_path / "x.idx", tmp_path / "x.bin"
    good = idx.read_bytes()
    idx.write_bytes(b"NOTXF\x00\x00\x00" + good[8:])
    with pytest.raises(XfError, match="bad magic"):
        TokenArray(tmp_path / "x")
    idx.write_bytes(good[:8] + (99).to_bytes(4, "little") + good[12:])
    with pytest.raises(XfError, match="version 99"):
        TokenArray(tmp_path / "x")
    idx.write_bytes(good)
    bin_.write_bytes(bin_.read_bytes()[:-2])
    with pytest.raises(XfError, match="truncated"):
        TokenArray(tmp_path / "x")
    bin_.unlink()
    with pytest.raises(XfError, match="cannot read"):
        TokenArray(tmp_path / "x")


def small_spm() -> bytes:
    """A real 14-piece sentencepiece model: DataDir.open checks meta.json's vocab_size against it."""
    text = " ".join("".join(p) for p in itertools.permutations("abcdefgh", 3))
    return learn_spm([text[i:i + 40] for i in range(0, 4000, 40)], 14)


def make_datadir(path, pairs, splits=("train",)):
    path.mkdir()
    (path / "spm.model").write_bytes(small_spm())
    for split in splits:
        write_array(path / f"{split}.en", [s for s, _ in pairs])
        write_array(path / f"{split}.de", [t for _, t in pairs])
    meta = dict(format_version=FORMAT_VERSION, source_lang="en", target_lang="de", vocab_size=14,
                splits=list(splits))
    (path / "meta.json").write_text(json.dumps(meta))
    return path


def test_datadir(tmp_path):
    pairs = [([4, 5], [6]), ([7], [8, 9, 10])]
    dd = DataDir.open(make_datadir(tmp_path / "d", pairs, ("train", "valid")))
    assert (dd.source_lang, dd.target_lang, dd.vocab_size) == ("en", "de", 14)
    assert dd.splits == ["train", "valid"] and dd.spm_model_bytes == small_spm()
    ds = dd.split("valid")
    assert len(ds) == 2 and ds.src_sizes.tolist() == [2, 1] and ds.tgt_sizes.tolist() == [1, 3]
    src, tgt = ds[1]
    assert src.tolist() == [7] and tgt.tolist() == [8, 9, 10]
    with pytest.raises(XfError, match="no split 'test'"):
        dd.split("test")


def test_datadir_errors(tmp_path):
    with pytest.raises(XfError, match="does not exist"):
        DataDir.open(tmp_path / "nope")
    d = make_datadir(tmp_path / "d", [([4], [5])])
    meta = json.loads((d / "meta.json").read_text())
    (d / "meta.json").write_text(json.dumps({**meta, "format_version": 0}))
    with pytest.raises(XfError, match="format version 0"):
        DataDir.open(d)
    for wrong in ("1", 1.0, True, None):  # never "version 1, this xf reads version 1"
        (d / "meta.json").write_text(json.dumps({**meta, "format_version": wrong}))
        with pytest.raises(XfError, match=r"meta\.json: format_version is .*, not an integer") as e:
            DataDir.open(d)
        assert f"version {FORMAT_VERSION}, this xf reads version {FORMAT_VERSION}" not in str(e.value)
    (d / "meta.json").write_text(json.dumps({**meta, "vocab_size": "14"}))
    with pytest.raises(XfError, match="'vocab_size' is '14', expected an integer in"):
        DataDir.open(d)
    (d / "meta.json").unlink()
    with pytest.raises(XfError, match="no meta.json"):
        DataDir.open(d)


def corrupt(path, dtype, index, value):
    """Overwrite one element of a file in place (its size unchanged)."""
    data = np.fromfile(path, dtype)
    data[index] = value
    data.tofile(path)


def test_opening_a_split_finds_corruption_that_keeps_file_sizes(tmp_path):
    pairs = [([4, 5, 6], [7]), ([8], [9, 10]), ([11, 12], [13])]
    d = make_datadir(tmp_path / "d", pairs)
    DataDir.open(d).split("train")  # intact: ids 4..13 < 14
    header, n = 24, len(pairs)  # .idx: header, n int64 offsets, n int32 sizes (as int32 pairs below)
    idx = d / "train.en.idx"
    good = idx.read_bytes()
    # offsets [0, 3, 4] (the last one is checked against the .bin's size when the index is read)
    for i, value, starts in ((1, 0, "sentence 1 starts at token 0 instead of 3"),  # out of order
                             (1, 5, "sentence 1 starts at token 5 instead of 3"),
                             (0, 1, "sentence 0 starts at token 1 instead of 0")):
        data = bytearray(good)
        data[header + 8 * i : header + 8 * i + 8] = np.int64(value).tobytes()
        idx.write_bytes(bytes(data))
        with pytest.raises(XfError, match=f"train.en.idx: corrupt: {starts}"):
            DataDir.open(d).split("train")
    # sizes [3, 1, 2] -> [4, -1, 2]: they still add up to the .bin's 6 tokens
    data = bytearray(good)
    data[header + 8 * n : header + 8 * n + 8] = np.array([4, -1], np.int32).tobytes()
    idx.write_bytes(bytes(data))
    with pytest.raises(XfError, match="train.en.idx: corrupt: sentence 1 has size -1"):
        DataDir.open(d).split("train")
    idx.write_bytes(good)
    corrupt(d / "train.de.bin", np.uint16, 2, 14)  # an id the vocabulary does not have
    with pytest.raises(XfError, match="train.de.bin: corrupt: token id 14 is outside the vocabulary of 14"):
        DataDir.open(d).split("train")


@pytest.mark.slow
def test_verify_is_chunked_without_losing_the_boundaries(tmp_path):
    rng = np.random.default_rng(0)
    sentences = [rng.integers(0, 50, rng.integers(0, 6)).tolist() for _ in range(1000)]
    write_array(tmp_path / "x", sentences)
    arr = TokenArray(tmp_path / "x")
    for chunk in (1, 7, 999, 1000, 4096):
        arr.verify(50, chunk=chunk)
    with pytest.raises(XfError, match="outside the vocabulary of 49"):
        arr.verify(49, chunk=7)
    offsets = np.fromfile(tmp_path / "x.idx", np.int64, 1000, offset=24)
    bad = int(np.flatnonzero(np.diff(offsets))[500]) + 1  # a sentence after a non-empty one, past chunk 7's edge
    corrupt_at = np.fromfile(tmp_path / "x.idx", np.uint8)
    corrupt_at[24 + 8 * bad : 24 + 8 * bad + 8] = np.frombuffer(np.int64(offsets[bad] - 1).tobytes(), np.uint8)
    corrupt_at.tofile(tmp_path / "x.idx")
    for chunk in (1, 7, bad, 4096):
        with pytest.raises(XfError, match=f"sentence {bad} starts at token {offsets[bad] - 1} instead of {offsets[bad]}"):
            TokenArray(tmp_path / "x").verify(50, chunk=chunk)


def test_batch_by_size_hand_checked():
    # padded lengths (size + 1): src [4,2,5,2,6], tgt [3,8,2,3,4]; longer side [4,8,5,3,6]
    # sorted by the longer side (then src, then tgt): 3 (3), 0 (4), 2 (5), 4 (6), 1 (8)
    # budget 12: [3,0] costs 2*4=8 (adding 2 would cost 3*5=15); [2,4] costs 2*6=12; [1] costs 8
    src, tgt = np.array([3, 1, 4, 1, 5]), np.array([2, 7, 1, 2, 3])
    batches = batch_by_size(src, tgt, max_tokens=12)
    assert [b.tolist() for b in batches] == [[3, 0], [2, 4], [1]]
    assert [b.tolist() for b in batch_by_size(src, tgt, 12, max_sentences=1)] == [[3], [0], [2], [4], [1]]
    with pytest.warns(UserWarning, match="1 pair"):  # pair 1 (8 > 7) gets its own batch
        batches = batch_by_size(src, tgt, max_tokens=7)
    assert [b.tolist() for b in batches] == [[3], [0], [2], [4], [1]]


def test_batch_by_size_equals_the_plain_greedy_cut():
    """The cut that jumps over runs of equal lengths makes the batches a pair-by-pair greedy
    cut along the same order makes."""
    rng = np.random.default_rng(2)
    src, tgt = rng.integers(0, 30, 3000), rng.integers(0, 30, 3000)
    for max_tokens, max_sentences in ((64, None), (200, None), (200, 7), (31, None)):
        order = np.concatenate(batch_by_size(src, tgt, max_tokens, max_sentences))
        expected, batch = [], []
        for i in order:
            grown = batch + [i]
            longest = max(max(src[j], tgt[j]) + 1 for j in grown)
            if batch and (len(grown) * longest > max_tokens or len(grown) > (max_sentences or len(order))):
                expected.append(batch)
                grown = [i]
            batch = grown
        expected.append(batch)
        assert [b.tolist() for b in batch_by_size(src, tgt, max_tokens, max_sentences)] == expected


def batch_by_size_before(src_sizes, tgt_sizes=None, max_tokens=None, max_sentences=None, seed=None,
                         longest_first=False):
    """batch_by_size as it was before its chunked counting sort (commit 265804b; the reference):
    the whole corpus sorted at once, one stable radix pass per key, then the same greedy cut."""

    def padded(sizes):
        sizes = np.asarray(sizes)
        fits = len(sizes) == 0 or int(sizes.max()) < (1 << 16) - 1
        return np.add(sizes, 1, dtype=np.uint16 if fits else np.int64, casting="unsafe")

    def sort(keys, descending, perm):
        n = len(keys[0])
        order = np.arange(n, dtype=np.int32) if perm is None else np.asarray(perm, dtype=np.int32)
        if all(n == 0 or int(k.max()) < 1 << 16 for k in keys):
            for key in keys:
                k = key.astype(np.uint16, copy=False)[order]
                order = order[np.argsort(~k if descending else k, kind="stable")]
            return order
        sign = -1 if descending else 1
        return order[np.lexsort([sign * np.asarray(k)[order] for k in keys])]

    src_len = padded(src_sizes)
    tgt_len = src_len if tgt_sizes is None else padded(tgt_sizes)
    n = len(src_len)
    longest_len = np.maximum(src_len, tgt_len)
    perm = None if seed is None else np.random.default_rng(seed).permutation(n)
    order = sort([tgt_len, src_len, longest_len], longest_first, perm)
    longest = longest_len[order]
    cap = min(max_sentences or n, max_tokens or n, n) if n else 0
    batches, start = [], 0
    while start < n:
        if max_tokens is None:
            k = min(cap, n - start)
        else:
            per = min(cap, max(1, max_tokens // int(longest[start])))
            window = longest[start : start + per]
            cost = np.maximum.accumulate(window) * np.arange(1, len(window) + 1)
            k = max(1, int(np.searchsorted(cost, max_tokens, side="right")))
        batches.append(order[start : start + k])
        start += k
    return batches


def assert_same_batches(ours, reference):
    assert len(ours) == len(reference)
    for a, b in zip(ours, reference):
        assert a.dtype == b.dtype and np.array_equal(a, b)


@pytest.mark.slow
@pytest.mark.parametrize("hi", [3, 12, 60, 260, 70_000])  # 3: nearly all ties; 70,000: beyond uint16
def test_batch_by_size_equals_the_former_whole_corpus_sort(hi):
    rng = np.random.default_rng(hi)
    for trial in range(12):
        n = int(rng.integers(0, 300))
        src, tgt = rng.integers(0, hi, n), rng.integers(0, hi, n)
        if trial % 4 == 0:  # skewed: a long tail, as real corpora
            src, tgt = rng.geometric(0.15, n) - 1, rng.geometric(0.12, n) - 1
        smallest = int(np.maximum(src, tgt).min()) + 1 if n else 1
        budgets = [(None, int(rng.integers(1, 20))), (int(rng.integers(1, 4 * hi)), None),
                   (int(rng.integers(1, 4 * hi)), int(rng.integers(1, 20))), (1, None),  # every pair oversize
                   (smallest, None), (smallest - 1 or 1, None), (10**9, None)]  # one length fits / one batch
        for max_tokens, max_sentences in budgets:
            for seed in (None, trial):
                for tgt_sizes, longest_first in ((tgt, False), (None, False), (None, True), (tgt, True)):
                    if tgt_sizes is not None and longest_first and hi > 60_000:
                        continue  # the former sort overflowed there (-1 * uint16); no caller sorts pairs longest first
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")  # oversize pairs
                        ours = batch_by_size(src, tgt_sizes, max_tokens, max_sentences, seed, longest_first)
                    assert_same_batches(ours, batch_by_size_before(src, tgt_sizes, max_tokens, max_sentences, seed,
                                                                   longest_first))


def test_length_order_chunk_by_chunk_equals_the_whole_corpus_sort():
    rng = np.random.default_rng(5)
    for n in (0, 1, 9, 250):
        src, tgt = rng.integers(0, 6, n), rng.integers(0, 6, n)  # many ties across chunks
        for perm in (None, rng.permutation(n)):
            for tgt_sizes, descending in ((tgt, False), (tgt, True), (None, False), (None, True)):
                reference = np.concatenate(batch_by_size_before(src, tgt_sizes, max_sentences=1, longest_first=descending,
                                                                seed=None) or [np.zeros(0, np.int32)])
                if perm is not None:  # ties in the order of perm
                    both = np.maximum(src, src if tgt_sizes is None else tgt)
                    keys = [k[perm] for k in ((src if tgt_sizes is None else tgt), src, both)]
                    reference = perm[np.lexsort([-k if descending else k for k in keys])]
                for chunk in (1, 7, 64, 1 << 20):
                    order, run_starts, run_lengths = length_order(src, tgt_sizes, descending, perm, chunk=chunk)
                    assert order.dtype == np.int32 and np.array_equal(order, reference)
                    longer = np.maximum(src, src if tgt_sizes is None else tgt)[order] + 1
                    assert np.array_equal(np.repeat(run_lengths, np.diff(run_starts)), longer)
                    assert run_starts[0] == 0 and run_starts[-1] == n and (np.diff(run_lengths) != 0).all()


@pytest.mark.slow
def test_batch_by_size_many_distinct_length_pairs_and_long_sentences():
    """Over 2^16 distinct (source, target) lengths (ranks beyond uint16), and sentences long enough
    that the length table would exceed 2^22 entries (the whole-corpus sort)."""
    rng = np.random.default_rng(3)
    src, tgt = rng.integers(0, 1500, 150_000), rng.integers(0, 1500, 150_000)
    assert len(np.unique(src * 1501 + tgt)) > 1 << 16
    assert_same_batches(batch_by_size(src, tgt, 3000), batch_by_size_before(src, tgt, 3000))
    src[7] = 5000
    with pytest.warns(UserWarning, match="1 pair"):
        ours = batch_by_size(src, tgt, 3000)
    assert_same_batches(ours, batch_by_size_before(src, tgt, 3000))


def test_batch_by_size_reads_a_memory_map_as_the_array(tmp_path):
    rng = np.random.default_rng(4)
    for lang in ("en", "de"):
        write_array(tmp_path / lang, [[1] * int(k) for k in rng.integers(0, 40, 3000)])
    src, tgt = TokenArray(tmp_path / "en"), TokenArray(tmp_path / "de")
    assert isinstance(src.sizes, np.memmap)
    ours = batch_by_size(src.sizes, tgt.sizes, 300, seed=None)
    assert_same_batches(ours, batch_by_size_before(np.array(src.sizes), np.array(tgt.sizes), 300))
    assert_same_batches(batch_by_size(src.sizes, tgt.sizes, 300, seed=2),
                        batch_by_size_before(np.array(src.sizes), np.array(tgt.sizes), 300, seed=2))


def test_batch_by_size_invariants():
    rng = np.random.default_rng(0)
    src, tgt = rng.integers(0, 40, 1000), rng.integers(0, 40, 1000)
    for seed in (None, 3):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # nothing is oversize here
            batches = batch_by_size(src, tgt, max_tokens=200, max_sentences=16, seed=seed)
        flat = np.concatenate(batches)
        assert sorted(flat.tolist()) == list(range(1000))  # each pair exactly once
        for b in batches:
            assert len(b) <= 16
            assert len(b) * (src[b].max() + 1) <= 200 and len(b) * (tgt[b].max() + 1) <= 200
        keys = list(zip(np.maximum(src, tgt)[flat], src[flat], tgt[flat]))
        assert keys == sorted(keys)  # length order: the longer side, then source, then target
    plain = np.concatenate(batch_by_size(src, tgt, 200, seed=None))
    seeded = [np.concatenate(batch_by_size(src, tgt, 200, seed=s)) for s in (3, 3, 4)]
    assert (seeded[0] == seeded[1]).all() and not (seeded[0] == seeded[2]).all()
    assert not (plain == seeded[0]).all()  # ties broken differently
    assert batch_by_size(np.zeros(0, int), np.zeros(0, int), 10) == []


def test_batch_by_size_source_only_longest_first_hand_checked():
    # translation: sizes without eos [2, 0, 1, 4], padded lengths [3, 1, 2, 5]
    sizes = [2, 0, 1, 4]
    assert [b.tolist() for b in batch_by_size(sizes, max_sentences=2, longest_first=True)] == [[3, 0], [2, 1]]
    # 5 * 2 > 6, 3 * 2 <= 6
    assert [b.tolist() for b in batch_by_size(sizes, max_tokens=6, longest_first=True)] == [[3], [0, 2], [1]]
    assert batch_by_size([], max_sentences=2, longest_first=True) == []
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a translation batches an oversize line alone, silently
        assert [b.tolist() for b in batch_by_size([9, 1], max_tokens=4, longest_first=True)] == [[0], [1]]


def translate_batches_before(lengths, batch_size, max_tokens=0):
    """xf translate's own batching before it moved into batch_by_size (the reference)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches = []
    for i in order:
        if batches:
            batch = batches[-1]
            longest = lengths[batch[0]]
            if (max_tokens and longest * (len(batch) + 1) <= max_tokens) or (not max_tokens and len(batch) < batch_size):
                batch.append(i)
                continue
        batches.append([i])
    return batches


def test_batch_by_size_source_only_equals_translates_former_batching():
    rng = np.random.default_rng(1)
    for n in (1, 7, 300):
        sizes = rng.integers(0, 30, n).tolist()  # many ties: their order must match too
        for batch_size, max_tokens in ((1, 0), (5, 0), (64, 0), (64, 40), (64, 200), (64, 3)):
            ours = batch_by_size(sizes, max_tokens=max_tokens or None, max_sentences=None if max_tokens else batch_size,
                                 longest_first=True)
            assert [b.tolist() for b in ours] == translate_batches_before([s + 1 for s in sizes], batch_size, max_tokens)


def test_batch_by_size_source_only_equals_both_sides_the_same():
    sizes = np.random.default_rng(2).integers(0, 30, 200)
    a, b = batch_by_size(sizes, max_tokens=100), batch_by_size(sizes, sizes, max_tokens=100)
    assert [x.tolist() for x in a] == [x.tolist() for x in b]


def test_epoch_order_is_a_seeded_permutation():
    a, b = epoch_order(50, 1, 1), epoch_order(50, 1, 2)
    assert sorted(a.tolist()) == list(range(50)) and not np.array_equal(a, b)
    assert np.array_equal(a, epoch_order(50, 1, 1))


def test_rank_share_is_disjoint_and_pads_a_short_last_update():
    order = np.arange(10)
    assert [rank_share(order[0:4], order, r, 2).tolist() for r in (0, 1)] == [[0, 2], [1, 3]]
    assert [rank_share(order[9:10], order, r, 2).tolist() for r in (0, 1)] == [[9], [0]]


def test_update_batches_splits_an_update_into_micro_batches_per_rank():
    order = np.array([5, 2, 7, 0, 1, 3, 4, 6])
    assert update_batches(order, 0, 3, 0, 1).tolist() == [5, 2, 7]
    assert [update_batches(order, 4, 2, r, 2).tolist() for r in (0, 1)] == [[1, 4], [3, 6]]
    assert update_batches(order, 6, 3, 0, 1).tolist() == [4, 6]  # the epoch's last update is short


def test_collate_source_hand_checked():
    src = collate_source([[5, 6], [], [8]])
    assert src.tolist() == [[5, 6, 3], [3, 0, 0], [8, 3, 0]] and src.dtype == torch.long


def test_collate_hand_checked():
    batch = collate([(np.array([5, 6]), np.array([7])), (np.array([8]), np.array([9, 10, 11]))])
    assert batch["src"].tolist() == [[5, 6, 3], [8, 3, 0]]
    assert batch["prev_output"].tolist() == [[2, 7, 0, 0], [2, 9, 10, 11]]
    assert batch["target"].tolist() == [[7, 3, 0, 0], [9, 10, 11, 3]]
    assert batch["src"].dtype == torch.long and batch["target"].dtype == torch.long
    assert (batch["ntokens"], batch["nsentences"], batch["src_tokens"]) == (6, 2, 5)


def test_check_trainable_refuses_empty_splits_and_the_longest_pair_over_max_positions(tmp_path):
    """Regressions, from the sizes alone: an empty validation split (loss 0, ppl 1, 'best' on no
    data) and a pair that needs more positions than the model has (it crashed at its batch)."""
    from types import SimpleNamespace

    from xformer_cli.data.dataset import check_trainable

    class Split(SimpleNamespace):
        def __len__(self):
            return len(self.src_sizes)

    data = SimpleNamespace(path=tmp_path, source_lang="en", target_lang="de")
    train = Split(name="train", src_sizes=np.array([3, 83, 5]), tgt_sizes=np.array([4, 6, 79]))
    valid = Split(name="valid", src_sizes=np.array([2]), tgt_sizes=np.array([2]))
    check_trainable(data, train, valid, 84)  # 83 subwords + eos: exactly 84 positions
    with pytest.raises(XfError, match="train pair 2 has 83 en subwords, 84 positions with eos/bos, more than "
                                      "--max-positions 83; raise --max-positions to at least 84"):
        check_trainable(data, train, valid, 83)
    long_valid = Split(name="valid", src_sizes=np.array([2]), tgt_sizes=np.array([90]))
    with pytest.raises(XfError, match="valid pair 1 has 90 de subwords"):
        check_trainable(data, train, long_valid, 84)
    with pytest.raises(XfError, match="the valid split is empty .*--validpref"):
        check_trainable(data, train, Split(name="valid", src_sizes=np.array([]), tgt_sizes=np.array([])), 84)
