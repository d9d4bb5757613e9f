"""xf preprocess: Multi30k end to end, order with workers, cleaning counts, every bad input."""

import dataclasses
import hashlib
import json
import os
import re

import numpy as np
import pytest
import sentencepiece as spm
from typer.testing import CliRunner

from xformer_cli.commands import preprocess as pp
from xformer_cli.cli import app
from xformer_cli.data.dataset import DataDir
from xformer_cli.base.errors import XfError
from xformer_cli.settings.options import PreprocessOptions


def run(dest, **kw):
    return pp.preprocess(PreprocessOptions(destdir=str(dest), **kw))


def write_pair(prefix, src_lines, tgt_lines, src="en", tgt="de", newline="\n"):
    for lang, lines in ((src, src_lines), (tgt, tgt_lines)):
        with open(f"{prefix}.{lang}", "w", encoding="utf-8", newline="") as f:
            f.write("".join(line + newline for line in lines))
    return str(prefix)


def nothing_left(dest):
    """No destdir and no hidden temporary directory beside it."""
    return not dest.exists() and not [p for p in dest.parent.iterdir() if p.name.startswith(f".{dest.name}.")]


WORDS = "the a small dog cat runs on grass red blue house man woman sees walks".split()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A small random corpus (200 pairs) and a sentencepiece model learned from it by xf."""
    root = tmp_path_factory.mktemp("corpus")
    rng = np.random.default_rng(0)
    src = [" ".join(rng.choice(WORDS, rng.integers(3, 9))) for _ in range(200)]
    tgt = [" ".join(rng.choice(WORDS, len(s.split()) + rng.integers(0, 2))).upper() for s in src]
    prefix = write_pair(root / "train", src, tgt)
    run(root / "bin", trainpref=prefix, bpe_vocab_size=60)
    return dict(prefix=prefix, src=src, tgt=tgt, spm=str(root / "bin" / "spm.model"))


def normalized(sp, text):
    """What decoding the ids gives back: sentencepiece's nmt_nfkc normalization of the text."""
    return sp.normalize(text).replace("\u2581", " ").lstrip(" ")


@pytest.mark.slow
def test_multi30k_en_de_round_trip(multi30k_dir, tmp_path):
    d = multi30k_dir
    meta = run(tmp_path / "ende", trainpref=str(d / "train"), validpref=str(d / "val"),
               testpref=str(d / "test2016"), bpe_vocab_size=2000)
    dd = DataDir.open(tmp_path / "ende")
    assert dd.splits == ["train", "valid", "test"] and dd.vocab_size == 2000 and dd.meta == meta
    assert meta["dtype"] == "uint16"
    assert meta["spm_sha256"] == hashlib.sha256(dd.spm_model_bytes).hexdigest()
    assert meta["options"]["bpe_vocab_size"] == 2000 and meta["bpe"]["normalization"] == "nmt_nfkc"
    assert len((tmp_path / "ende" / "spm.vocab").read_text().splitlines()) == 2000
    train = meta["stats"]["train"]
    assert train["pairs_in"] == 29000 and train["pairs"] + sum(train["dropped"].values()) == 29000
    assert len(dd.split("train")) == train["pairs"] and train["dropped"]["ratio"] > 0
    sp = spm.SentencePieceProcessor(model_proto=dd.spm_model_bytes)
    for split, prefix in (("valid", "val"), ("test", "test2016")):
        ds = dd.split(split)
        assert len(ds) == meta["stats"][split]["pairs"] == (1014 if split == "valid" else 1000)  # never cleaned
        for lang, side in (("en", 0), ("de", 1)):
            raw = (d / f"{prefix}.{lang}").read_text(encoding="utf-8").splitlines()
            decoded = [sp.decode(ds[i][side].tolist()) for i in range(len(ds))]
            assert decoded == [normalized(sp, line) for line in raw]
        assert meta["stats"][split]["unk_rate"]["en"] < 0.01
        assert int(ds.src_sizes.sum()) == meta["stats"][split]["src_tokens"]


@pytest.mark.slow
def test_multi30k_en_fr_two_workers_keep_order(multi30k_dir, tmp_path, monkeypatch, corpus):
    # small chunks: many tasks in flight, so out-of-order completion would show
    monkeypatch.setattr(pp, "CHUNK_LINES", 1500)
    d = multi30k_dir
    kw = dict(source_lang="en", target_lang="fr", trainpref=str(d / "train"), validpref=str(d / "val"),
              testpref=str(d / "test2016"))
    run(tmp_path / "w1", workers=1, bpe_vocab_size=1000, **kw)
    run(tmp_path / "w2", workers=2, spm_model=str(tmp_path / "w1" / "spm.model"), **kw)
    for split in ("train", "valid", "test"):
        for lang in ("en", "fr"):
            for ext in ("bin", "idx"):
                name = f"{split}.{lang}.{ext}"
                assert (tmp_path / "w1" / name).read_bytes() == (tmp_path / "w2" / name).read_bytes(), name
    dd = DataDir.open(tmp_path / "w2")
    assert (dd.source_lang, dd.target_lang) == ("en", "fr") and dd.meta["bpe"]["learned"] is False


@pytest.mark.slow
def test_cleaning_counts(tmp_path):
    # With the vocabulary "a b" learned below, every word is exactly one subword ("▁a", "▁b").
    pairs = [("a b", "b a")] * 20 + [
        ("", "b"), ("a", ""), ("   ", "a"), ("", ""),          # empty: 4
        ("a " * 11, "b " * 11), ("a", "b " * 12),             # over --max-len 10: 2
        ("a a a a", "b b"), ("a", "b b"), ("a a a", "b"), ("b b b b b", "a a a"),  # ratio over 1.5: 4
        ("a a a", "b b"), ("a " * 10, "b " * 10),             # at the limits (1.5, 10): kept
    ]
    prefix = write_pair(tmp_path / "raw", [s for s, _ in pairs], [t for _, t in pairs])
    meta = run(tmp_path / "bin", trainpref=prefix, validpref=prefix, bpe_vocab_size=9, max_len=10)
    sp = spm.SentencePieceProcessor(model_file=str(tmp_path / "bin" / "spm.model"))
    assert sp.encode("a a a b", out_type=str) == ["\u2581a"] * 3 + ["\u2581b"]
    train = meta["stats"]["train"]
    assert train["dropped"] == dict(invalid_utf8=0, empty=4, too_long=2, ratio=4)
    assert train["pairs"] == 22 and len(DataDir.open(tmp_path / "bin").split("train")) == 22
    assert meta["stats"]["valid"]["pairs"] == len(pairs)  # validation is never cleaned


def test_cli_runs_and_errors_in_one_line(tmp_path, corpus):
    runner = CliRunner()
    args = ["preprocess", "--trainpref", corpus["prefix"], "--destdir", str(tmp_path / "out"),
            "--spm-model", corpus["spm"], "--workers", "2"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "pairs kept" in result.output  # the summary table
    assert len(DataDir.open(tmp_path / "out").split("train")) > 150
    result = runner.invoke(app, args)  # destdir now exists
    assert result.exit_code == 2 and "--overwrite" in result.output and "Traceback" not in result.output


def test_line_counts_differ(tmp_path, corpus):
    prefix = write_pair(tmp_path / "raw", ["a", "b", "c"], ["A", "B"])
    with pytest.raises(XfError) as e:
        run(tmp_path / "out", trainpref=prefix, spm_model=corpus["spm"])
    assert f"{prefix}.en has 3 lines" in str(e.value) and f"{prefix}.de has 2" in str(e.value)
    assert nothing_left(tmp_path / "out")


def test_missing_and_unreadable_files(tmp_path, corpus):
    with pytest.raises(XfError, match=r"nope\.en: no such file"):
        run(tmp_path / "out", trainpref=str(tmp_path / "nope"), spm_model=corpus["spm"])
    prefix = write_pair(tmp_path / "raw", ["a"], ["A"])
    os.remove(f"{prefix}.de")
    os.mkdir(f"{prefix}.de")  # a directory where a file should be
    with pytest.raises(XfError, match=r"cannot read .*raw\.de"):
        run(tmp_path / "out", trainpref=prefix, spm_model=corpus["spm"])
    with pytest.raises(XfError, match=r"valid\.en: no such file"):
        run(tmp_path / "out", trainpref=corpus["prefix"], validpref=str(tmp_path / "valid"), spm_model=corpus["spm"])
    assert nothing_left(tmp_path / "out")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_unreadable_by_permissions(tmp_path, corpus):
    prefix = write_pair(tmp_path / "raw", ["a"], ["A"])
    os.chmod(f"{prefix}.en", 0)
    with pytest.raises(XfError, match="cannot read"):
        run(tmp_path / "out", trainpref=prefix, spm_model=corpus["spm"])


def test_empty_training_set(tmp_path, corpus):
    prefix = write_pair(tmp_path / "empty", [], [])
    with pytest.raises(XfError, match="empty training set"):
        run(tmp_path / "out", trainpref=prefix, spm_model=corpus["spm"])
    prefix = write_pair(tmp_path / "blank", ["", " "], ["x", ""])
    with pytest.raises(XfError, match="no non-empty lines"):  # nothing to learn BPE from
        run(tmp_path / "out", trainpref=write_pair(tmp_path / "blank2", ["", " "], ["", ""]))
    with pytest.raises(XfError, match=r"empty training set after cleaning: all 2 pairs .*empty 2"):
        run(tmp_path / "out", trainpref=prefix, spm_model=corpus["spm"])
    assert nothing_left(tmp_path / "out")


@pytest.mark.slow
def test_invalid_utf8(tmp_path, corpus):
    prefix = write_pair(tmp_path / "raw", ["the dog", "a cat", "red house"], ["THE DOG", "A CAT", "RED HOUSE"])
    with open(f"{prefix}.de", "wb") as f:
        f.write(b"THE DOG\nA \xff CAT\nRED HOUSE\n")
    with pytest.raises(XfError, match=r"raw\.de:2: invalid UTF-8"):  # raised in a worker process
        run(tmp_path / "out", trainpref=prefix, spm_model=corpus["spm"], workers=2)
    with pytest.raises(XfError, match=r"raw\.de:2: invalid UTF-8"):  # found while sampling for BPE
        run(tmp_path / "out", trainpref=prefix, bpe_vocab_size=20)
    assert nothing_left(tmp_path / "out")
    meta = run(tmp_path / "out", trainpref=prefix, validpref=prefix, spm_model=corpus["spm"], skip_invalid=True,
               max_len_ratio=10)
    train, valid = meta["stats"]["train"], meta["stats"]["valid"]
    assert train["dropped"]["invalid_utf8"] == 1 and train["pairs"] == 2  # dropped from train
    assert valid["replaced_invalid_utf8"] == 1 and valid["pairs"] == 3  # kept, aligned, in valid


def test_crlf_bom_and_missing_final_newline(tmp_path, corpus):
    src, tgt = corpus["src"][:50], corpus["tgt"][:50]
    lf = write_pair(tmp_path / "lf", src, tgt)
    crlf = write_pair(tmp_path / "crlf", ["\ufeff" + src[0]] + src[1:], tgt, newline="\r\n")
    for lang in ("en", "de"):  # drop the final newline
        path = tmp_path / f"crlf.{lang}"
        path.write_bytes(path.read_bytes()[:-2])
    for name, prefix in (("a", lf), ("b", crlf)):
        meta = run(tmp_path / name, trainpref=prefix, spm_model=corpus["spm"], max_len_ratio=10)
        assert meta["stats"]["train"]["pairs"] == 50
    for lang in ("en", "de"):
        for ext in ("bin", "idx"):
            assert (tmp_path / "a" / f"train.{lang}.{ext}").read_bytes() == (tmp_path / "b" / f"train.{lang}.{ext}").read_bytes()


def test_destdir_refused_overwritten_and_never_half_written(tmp_path, corpus, monkeypatch):
    dest = tmp_path / "out"
    dest.mkdir()
    run(dest, trainpref=corpus["prefix"], spm_model=corpus["spm"])  # an empty existing dir is fine
    (dest / "stale.txt").write_text("old")
    with pytest.raises(XfError, match="not empty"):
        run(dest, trainpref=corpus["prefix"], spm_model=corpus["spm"])
    run(dest, trainpref=corpus["prefix"], spm_model=corpus["spm"], overwrite=True)
    assert not (dest / "stale.txt").exists() and DataDir.open(dest).splits == ["train"]

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(pp, "binarize", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path / "new", trainpref=corpus["prefix"], spm_model=corpus["spm"])
    assert nothing_left(tmp_path / "new")
    with pytest.raises(KeyboardInterrupt):  # the old directory survives a failed --overwrite
        run(dest, trainpref=corpus["prefix"], spm_model=corpus["spm"], overwrite=True)
    assert DataDir.open(dest).splits == ["train"]


def test_vocab_too_large_and_bad_spm_model(tmp_path, corpus):
    with pytest.raises(XfError, match=r"--bpe-vocab-size 37000 is too large .* pass --bpe-vocab-size \d+ or less"):
        run(tmp_path / "out", trainpref=corpus["prefix"])
    assert nothing_left(tmp_path / "out")
    # a model with sentencepiece's default ids (unk 0, bos 1, eos 2, no pad) would shift every id
    spm.SentencePieceTrainer.train(input=f"{corpus['prefix']}.en", model_prefix=str(tmp_path / "other"),
                                   vocab_size=40, model_type="bpe", minloglevel=2)
    with pytest.raises(XfError, match="special ids"):
        run(tmp_path / "out", trainpref=corpus["prefix"], spm_model=str(tmp_path / "other.model"))
    with pytest.raises(XfError, match="no such file"):
        run(tmp_path / "out", trainpref=corpus["prefix"], spm_model=str(tmp_path / "none.model"))


def test_several_valid_and_test_sets(tmp_path, corpus):
    p = corpus["prefix"]
    meta = run(tmp_path / "out", trainpref=p, validpref=f"{p},{p}", testpref=f"{p},{p},{p}", spm_model=corpus["spm"])
    assert meta["splits"] == ["train", "valid", "valid1", "test", "test1", "test2"]
    not_recorded = {"destdir", "overwrite", "verify",  # where and whether to write, not what
                    "pairs", "sampling_temperature",  # of several languages: a bilingual meta.json has neither
                    "formality_tags"}  # off: meta.json as before the option (tests/test_formality_tags.py)
    assert dataclasses.asdict(PreprocessOptions(destdir="x")).keys() - not_recorded == meta["options"].keys()


@pytest.mark.slow
def test_the_same_command_gives_the_same_bytes_in_every_file(tmp_path, corpus):
    """Two identical runs into two directories: every file equal, byte for byte."""
    p = corpus["prefix"]
    for dest in ("one", "two"):
        run(tmp_path / dest, trainpref=p, validpref=p, bpe_vocab_size=60, workers=2)
    names = sorted(f.name for f in (tmp_path / "one").iterdir())
    assert names == sorted(f.name for f in (tmp_path / "two").iterdir()) and "spm.model" in names
    for name in names:
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes(), name
    assert b".one." not in (tmp_path / "one" / "spm.model").read_bytes()  # no temporary path (.one.PID.*.tmp) recorded


def test_verify_checks_every_file_against_meta_checksums(tmp_path, corpus):
    dest = tmp_path / "bin"
    meta = run(dest, trainpref=corpus["prefix"], validpref=corpus["prefix"], spm_model=corpus["spm"])
    assert set(meta["files"]) == {f.name for f in dest.iterdir()} - {"meta.json"}
    runner = CliRunner()
    result = runner.invoke(app, ["preprocess", "--destdir", str(dest), "--verify"])
    assert result.exit_code == 0 and "files match" in result.output, result.output
    data = bytearray((dest / "valid.de.bin").read_bytes())
    data[3] ^= 1  # one bit: the structure stays valid, only the checksum can tell
    (dest / "valid.de.bin").write_bytes(bytes(data))
    (dest / "spm.vocab").unlink()
    result = runner.invoke(app, ["preprocess", "--destdir", str(dest), "--verify"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "2 file(s) differ from meta.json's checksums: spm.vocab (missing), valid.de.bin (content changed)" \
        in result.output.replace("\n", "")


def test_bare_carriage_return_line_endings_are_named(tmp_path, corpus):
    prefix = write_pair(tmp_path / "raw", ["a b", "b a", "a"], ["B A", "A B", "A"])
    (tmp_path / "raw.de").write_bytes(b"B A\rA B\rA\r")
    with pytest.raises(XfError, match=r"raw\.de:1: lines end with a bare carriage return"):
        run(tmp_path / "out", trainpref=prefix, bpe_vocab_size=9)
    assert nothing_left(tmp_path / "out")
    # a stray carriage return inside a line is text, not a line ending
    (tmp_path / "raw.de").write_bytes(b"B\rA\nA B\nA\n")
    assert run(tmp_path / "out", trainpref=prefix, spm_model=corpus["spm"])["stats"]["train"]["pairs_in"] == 3


@pytest.mark.slow
def test_training_text_empty_after_normalization_is_named(tmp_path):
    invisible = ["\u200b", "\u200b\u200b", "\x07"] * 10  # zero-width spaces, a control character
    prefix = write_pair(tmp_path / "raw", invisible, invisible)
    with pytest.raises(XfError, match=r"raw\.en, .*raw\.de: no text to learn BPE from: every line is empty after "
                                      r"sentencepiece's nmt_nfkc normalization.*\(line 1: '\\u200b'\)"):
        run(tmp_path / "out", trainpref=prefix)
    assert nothing_left(tmp_path / "out")


def test_overwrite_never_replaces_a_destdir_holding_an_input(tmp_path, corpus):
    dest = tmp_path / "bin"
    run(dest, trainpref=corpus["prefix"], spm_model=corpus["spm"])
    prefix = write_pair(dest / "raw", corpus["src"], corpus["tgt"])
    result = CliRunner().invoke(app, ["preprocess", "--destdir", str(tmp_path / "." / "bin"), "--trainpref", str(prefix),
                                      "--spm-model", str(corpus["spm"]), "--overwrite"])
    assert result.exit_code == 2, result.output
    assert re.search(r"--destdir .*bin holds the input --trainpref .*raw\.en; writing it could destroy the input",
                     result.output), result.output
    assert (dest / "raw.en").exists() and (dest / "meta.json").exists()


def test_an_empty_validation_set_and_an_unusable_destdir_are_refused_before_encoding(tmp_path, corpus, monkeypatch):
    """Regression: an empty validation set would report loss 0 and choose checkpoint_best.pt on
    no data; a mount point or unwritable parent as destdir failed only after the whole corpus."""
    empty = write_pair(tmp_path / "empty", [], [])
    with pytest.raises(XfError, match=r"empty validation set: .*empty\.en and .*empty\.de have no lines"):
        run(tmp_path / "out", trainpref=corpus["prefix"], validpref=empty, spm_model=corpus["spm"])
    assert nothing_left(tmp_path / "out")
    (tmp_path / "mnt").mkdir()
    monkeypatch.setattr(pp.os.path, "ismount", lambda p: str(p) == str(tmp_path / "mnt"))
    encoded = []
    monkeypatch.setattr(pp, "encode_splits", lambda *a: encoded.append(a))
    with pytest.raises(XfError, match=r"destdir .*mnt is a mount point"):
        run(tmp_path / "mnt", trainpref=corpus["prefix"], spm_model=corpus["spm"])
    monkeypatch.setattr(pp.os, "access", lambda p, mode: str(p) != str(tmp_path / "ro"))
    (tmp_path / "ro").mkdir()
    with pytest.raises(XfError, match=r"destdir .*ro/new/bin: .*ro is not writable \(checked before encoding"):
        run(tmp_path / "ro" / "new" / "bin", trainpref=corpus["prefix"], spm_model=corpus["spm"])
    assert encoded == [] and list((tmp_path / "ro").iterdir()) == []


@pytest.mark.parametrize("key,value,message", [
    ("vocab_size", 600, r"vocab_size is 600 but spm\.model has \d+ pieces"),
    ("dtype", "uint32", r"dtype is 'uint32', but a vocabulary of \d+ is stored as uint8"),
    ("special_ids", {"pad": 1, "unk": 0, "bos": 2, "eos": 3}, r"special_ids are .*xf's \(and spm\.model's\) are"),
    ("spm_sha256", "0" * 64, r"its spm_sha256 is not spm\.model's"),
])
def test_verify_and_every_opening_cross_check_meta_json_against_the_files(tmp_path, corpus, key, value, message):
    """Regression: meta.json is not among its own checksums, so an edited vocab_size (500 -> 600)
    passed --verify and trained a model that translate and export refused."""
    from xformer_cli.data.dataset import DataDir

    dest = tmp_path / "bin"
    run(dest, trainpref=corpus["prefix"], validpref=corpus["prefix"], spm_model=corpus["spm"])
    meta = json.loads((dest / "meta.json").read_text())
    (dest / "meta.json").write_text(json.dumps({**meta, key: value}))
    result = CliRunner().invoke(app, ["preprocess", "--destdir", str(dest), "--verify"])
    assert result.exit_code == 1 and re.search(message, result.stderr) and len(result.stderr.splitlines()) == 1, \
        result.output
    with pytest.raises(XfError, match=message):
        DataDir.open(dest)  # what xf train opens


def test_an_index_header_that_disagrees_with_meta_json_is_named(tmp_path, corpus):
    from xformer_cli.data.dataset import DataDir, TokenArray, TokenArrayWriter

    dest = tmp_path / "bin"
    run(dest, trainpref=corpus["prefix"], spm_model=corpus["spm"])
    old = TokenArray(dest / "train.en")
    sentences = [old[i].tolist() for i in range(len(old))]
    del old
    writer = TokenArrayWriter(dest / "train.en", np.dtype(np.uint16))  # consistent in itself, not with meta's uint8
    writer.add(sentences)
    writer.close()
    with pytest.raises(XfError, match=r"train\.en\.idx: its header says uint16, meta\.json says uint8"):
        DataDir.open(dest).split("train")


def test_bpe_messages_point_the_right_way(tmp_path, corpus):
    """Regression: text with too few characters suggested a --bpe-vocab-size the option refuses
    (7, the minimum is 8); an empty sample was reported as files without text."""
    few = write_pair(tmp_path / "few", ["\x01a\x02"] * 20, ["\x05a\x06"] * 20)
    with pytest.raises(XfError, match=r"too few distinct characters for a vocabulary: sentencepiece can make at most "
                                      r"(\d) pieces from it, and --bpe-vocab-size is at least 8") as e:
        run(tmp_path / "out", trainpref=few, bpe_vocab_size=100)
    assert "or less" not in str(e.value)
    with pytest.raises(XfError, match=r"the sample to learn BPE from holds no text: --bpe-sample-lines 1 keeps each of "
                                      r"the 200 pairs of .* with probability 0.005, and kept none .*raise --bpe-sample"):
        for seed in range(1, 20):  # a 1-pair sample of 200 is empty for most seeds
            run(tmp_path / f"s{seed}", trainpref=corpus["prefix"], bpe_vocab_size=60, bpe_sample_lines=1, seed=seed)
    assert nothing_left(tmp_path / "out")


def test_bpe_options_beside_a_given_vocabulary_are_refused_not_ignored():
    """Regression: --vocab-from and --spm-model silently ignored --bpe-vocab-size."""
    from xformer_cli.base.errors import ConfigError

    for given in (dict(spm_model="spm.model"), dict(vocab_from="ckpt.pt")):
        for name, value in (("bpe_vocab_size", 8000), ("bpe_sample_lines", 10)):
            with pytest.raises(ConfigError, match=rf"--{name.replace('_', '-')} sets how BPE is learned, but "
                                                  rf"--(spm-model|vocab-from) gives the vocabulary"):
                PreprocessOptions(destdir="d", **given, **{name: value})
        assert PreprocessOptions(destdir="d", **given).bpe_vocab_size is None
    assert (PreprocessOptions(destdir="d").bpe_vocab_size, PreprocessOptions(destdir="d").bpe_sample_lines) == (37000, 2_000_000)
