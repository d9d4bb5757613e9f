"""Several languages in one model, the data side: xf preprocess --pairs (target tags by id, the
joint vocabulary with the tags as control symbols, meta.json's pairs and per-direction counts, bad
input), temperature sampling across directions (data/sampling.py) and xf train's drawn epochs, and
the checkpoint's record of its pairs. Three Multi30k directions of 200 lines: seconds."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from xformer_cli.data.batching import EpochBatches, Prefetch, batch_by_size, epoch_order
from xformer_cli.model.checkpoint import load_checkpoint
from xformer_cli.commands import preprocess as pp
from xformer_cli.commands.train import train
from xformer_cli.data.dataset import DataDir
from xformer_cli.base.errors import ConfigError, XfError
from xformer_cli.frame import COMMANDS, check_outputs, load_command_options
from xformer_cli.text.languages import tag, vocabulary_for
from xformer_cli.settings.options import PreprocessOptions
from xformer_cli.data.sampling import direction_probabilities, draw_epoch, epoch_counts, epoch_sampler, undrawn
from xformer_cli.text.vocab import load_sentencepiece
from helpers import learn_spm, opts, random_checkpoint

PAIRS = ("en-de", "en-fr", "de-fr")


def run(dest, **kw):
    return pp.preprocess(PreprocessOptions(destdir=str(dest), **kw))


def nothing_left(dest):
    return not dest.exists() and not [p for p in dest.parent.iterdir() if p.name.startswith(f".{dest.name}.")]


@pytest.fixture(scope="module")
def raw(multi30k_dir, tmp_path_factory):
    """train.{en,de,fr} (200 lines, line by line parallel), val.* (40), and two corpora of their
    own, train.en-de.* (240 pairs) and train.en-fr.* (60 other pairs), for uneven directions."""
    root = tmp_path_factory.mktemp("raw3")
    for lang in ("en", "de", "fr"):
        lines = (multi30k_dir / f"train.{lang}").read_text(encoding="utf-8").splitlines()
        (root / f"train.{lang}").write_text("\n".join(lines[:200]) + "\n", encoding="utf-8")
        val = (multi30k_dir / f"val.{lang}").read_text(encoding="utf-8").splitlines()[:40]
        (root / f"val.{lang}").write_text("\n".join(val) + "\n", encoding="utf-8")
        if lang in ("en", "de"):
            (root / f"uneven.en-de.{lang}").write_text("\n".join(lines[200:440]) + "\n", encoding="utf-8")
        if lang in ("en", "fr"):
            (root / f"uneven.en-fr.{lang}").write_text("\n".join(lines[500:560]) + "\n", encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def multi(raw, tmp_path_factory):
    dest = tmp_path_factory.mktemp("multi") / "bin"
    meta = run(dest, pairs=PAIRS, trainpref=str(raw / "train"), validpref=str(raw / "val"), bpe_vocab_size=400)
    return dest, meta


@pytest.fixture(scope="module")
def uneven(raw, tmp_path_factory):
    """en-de 240 pairs, en-fr 60, each of its own files, drawn at temperature 5."""
    dest = tmp_path_factory.mktemp("uneven") / "bin"
    meta = run(dest, pairs=("en-de", "en-fr"), trainpref=str(raw / "uneven"), validpref=str(raw / "val"),
               bpe_vocab_size=400, sampling_temperature=5.0)
    return dest, meta


# -- xf preprocess --pairs -----------------------------------------------------------------------
def test_every_source_starts_with_its_target_tag_and_no_target_holds_one(raw, multi):
    dest, meta = multi
    data = DataDir.open(dest)
    sp = load_sentencepiece(data.spm_model_bytes, "spm.model")
    tags = {t: sp.piece_to_id(tag(t)) for t in ("de", "fr")}
    assert sorted(tags.values()) == [4, 5]  # reserved right after the special ids
    for split, prefix in (("train", "train"), ("valid", "val")):
        ds, start = data.split(split), 0
        for pair, kept in data.directions(split).items():
            src_lang, tgt_lang = pair.split("-")
            for i in range(start, start + kept):
                src, tgt = ds[i]
                assert src[0] == tags[tgt_lang] and not np.isin(src[1:], list(tags.values())).any()
                assert not np.isin(tgt, list(tags.values())).any()
            if split == "valid":  # never cleaned: row by row the raw lines, the tag never printed
                raw_src = (raw / f"{prefix}.{src_lang}").read_text(encoding="utf-8").splitlines()
                assert [sp.decode(ds[start + j][0].tolist()) for j in range(kept)] == \
                       [sp.decode(sp.encode(line)) for line in raw_src]
            start += kept
        assert start == len(ds)


def test_the_joint_vocabulary_reserves_every_target_tag(multi):
    dest, meta = multi
    sp = load_sentencepiece(DataDir.open(dest).spm_model_bytes, "spm.model")
    for lang in ("de", "fr"):
        piece = tag(lang)
        assert sp.is_control(sp.piece_to_id(piece))
        assert sp.piece_to_id(piece) not in sp.encode(f"{piece} ein Hund")  # no text makes a tag
    assert sp.piece_to_id(tag("en")) == sp.unk_id()  # no pair translates into English
    assert meta["bpe"]["control_symbols"] == [">>deu<<", ">>fra<<"]
    assert meta["bpe"]["sample_sentences"] == 600  # each language's 200 lines once, not once a pair
    # the translate side's vocabulary for the data's meta puts the same tag first
    vocab = vocabulary_for(sp, meta, "fr")
    assert vocab.encode("A dog.")[0] == sp.piece_to_id(">>fra<<")


def test_meta_records_the_pairs_and_each_directions_pairs(multi):
    dest, meta = multi
    assert meta["pairs"] == list(PAIRS) and meta["sampling_temperature"] == 1.0
    assert (meta["source_lang"], meta["target_lang"]) == ("src", "tgt")
    assert {p.name for p in dest.iterdir()} >= {"train.src.bin", "train.tgt.idx", "valid.src.idx", "valid.tgt.bin"}
    train = meta["stats"]["train"]
    assert [d["pairs_in"] for d in train["directions"].values()] == [200, 200, 200]
    assert sum(d["pairs"] for d in train["directions"].values()) == train["pairs"] == len(DataDir.open(dest).split("train"))
    assert train["directions"]["en-fr"]["src_file"].endswith("train.en")
    assert DataDir.open(dest).directions("valid") == {p: 40 for p in PAIRS}
    assert pp.verify(dest) == meta  # xf preprocess --verify
    labels = list(pp.summary_table(meta, dest, 0.0).columns[0].cells)
    assert [c for c in labels if "kept" in c] == ["pairs kept", "  en-de kept", "  en-fr kept", "  de-fr kept"]


def test_cleaning_counts_the_sentence_without_its_tag(raw, multi, tmp_path):
    """--pairs en-de with the same vocabulary keeps exactly the pairs the bilingual run keeps, each
    source the bilingual one behind the tag."""
    spm_path = str(multi[0] / "spm.model")
    kw = dict(trainpref=str(raw / "train"), spm_model=spm_path, max_len_ratio=1.2)
    run(tmp_path / "bi", **kw)
    run(tmp_path / "tagged", pairs=("en-de",), **kw)
    bi, tagged = DataDir.open(tmp_path / "bi").split("train"), DataDir.open(tmp_path / "tagged").split("train")
    assert len(bi) == len(tagged) < 200  # some dropped by the ratio
    de = load_sentencepiece(multi[0] / "spm.model").piece_to_id(">>deu<<")
    for i in range(len(bi)):
        assert tagged[i][0].tolist() == [de, *bi[i][0].tolist()] and np.array_equal(tagged[i][1], bi[i][1])


def test_workers_keep_the_order_of_the_directions(raw, multi, tmp_path, monkeypatch):
    """Chunks of several directions in flight on two workers come back in order, each with its tag."""
    monkeypatch.setattr(pp, "CHUNK_LINES", 37)
    kw = dict(pairs=PAIRS, trainpref=str(raw / "train"), validpref=str(raw / "val"), spm_model=str(multi[0] / "spm.model"))
    run(tmp_path / "w1", **kw)
    run(tmp_path / "w2", workers=2, **kw)
    for name in ("train.src.bin", "train.src.idx", "train.tgt.bin", "valid.src.bin", "meta.json"):
        a, b = (tmp_path / "w1" / name).read_bytes(), (tmp_path / "w2" / name).read_bytes()
        if name == "meta.json":
            a, b = (json.loads(x)["stats"] for x in (a, b))
        assert a == b, name


def test_a_bilingual_data_directory_has_no_multilingual_keys(raw, tmp_path):
    meta = run(tmp_path / "bi", trainpref=str(raw / "train"), validpref=str(raw / "val"), bpe_vocab_size=300)
    assert not {"pairs", "sampling_temperature"} & meta.keys() and "directions" not in meta["stats"]["train"]
    assert {"pairs", "sampling_temperature"}.isdisjoint(meta["options"]) and "control_symbols" not in meta["bpe"]
    assert meta["stats"]["train"]["src_file"].endswith("train.en") and (tmp_path / "bi" / "train.de.bin").exists()
    assert DataDir.open(tmp_path / "bi").directions("train") is None


def test_pairs_from_yaml_as_a_list_or_a_string(tmp_path):
    for value in (["en-de", "en-fr"], "en-de,en-fr"):
        (tmp_path / "c.yaml").write_text(yaml.safe_dump({"preprocess": {"pairs": value, "destdir": "d"}}))
        o = load_command_options(PreprocessOptions, tmp_path / "c.yaml", section="preprocess")
        assert o.pair_list() == [("en", "de"), ("en", "fr")] and o.languages() == ("en", "de", "fr")
        assert (o.source_lang, o.target_lang) == ("src", "tgt")


def test_uneven_corpora_read_each_pairs_own_files(uneven):
    meta = uneven[1]
    train = meta["stats"]["train"]["directions"]
    assert [d["pairs_in"] for d in train.values()] == [240, 60]
    assert train["en-fr"]["tgt_file"].endswith("uneven.en-fr.fr") and meta["sampling_temperature"] == 5.0


def test_the_output_guard_knows_every_file_of_the_pairs(raw):
    command = next(c for c in COMMANDS if c.words == "preprocess")
    o = PreprocessOptions(destdir=str(raw / "uneven.en-fr.fr"), pairs=("en-de", "en-fr"), trainpref=str(raw / "uneven"))
    names = {Path(p).name for _, p, _ in command.input_paths(o)}
    assert names == {"uneven.en", "uneven.de", "uneven.fr", "uneven.en-de.en", "uneven.en-de.de", "uneven.en-fr.en",
                     "uneven.en-fr.fr"}
    with pytest.raises(ConfigError, match="uneven.en-fr.fr"):
        check_outputs(command, o)


@pytest.mark.parametrize("change,message", [
    (dict(pairs=("en-de", "en-xx1")), r"'en-xx1' is not a pair|not a language code"),
    (dict(pairs=("en-en",)), "translates en into itself"),
    (dict(pairs=("en-de", "en-de")), "given twice"),
    (dict(pairs=("en-de",), source_lang="fr"), "--pairs names the languages .* leave out --source-lang fr"),
    (dict(sampling_temperature=2.0), "--sampling-temperature .* without --pairs"),
    (dict(pairs=("en-de",), sampling_temperature=0.0), "--sampling-temperature must be positive"),
])
def test_bad_options_are_one_line_config_errors(change, message):
    with pytest.raises(ConfigError, match=message):
        PreprocessOptions(destdir="d", **change)


def test_bad_input_is_one_line_and_writes_nothing(raw, multi, tmp_path):
    dest = tmp_path / "out"
    short = tmp_path / "short"
    for lang, n in (("en", 40), ("de", 40), ("fr", 39)):
        (tmp_path / f"short.{lang}").write_text("".join(f"line {i}\n" for i in range(n)), encoding="utf-8")
    with pytest.raises(XfError, match=r"line counts differ: .*short\.en has 40 lines but .*short\.fr has 39 "
                                      r"\(pair en-fr\)"):
        run(dest, pairs=("en-de", "en-fr"), trainpref=str(raw / "train"), validpref=str(short), bpe_vocab_size=400)
    assert nothing_left(dest)
    with pytest.raises(XfError, match=r"train\.cs: no such file \(pair en-cs reads .*train\.en and .*train\.cs, or "
                                      r".*train\.en-cs\.en"):
        run(dest, pairs=("en-de", "en-cs"), trainpref=str(raw / "train"), bpe_vocab_size=400)
    assert nothing_left(dest)
    # a given vocabulary without a tag: a bilingual one, as a file and as a checkpoint's
    plain = tmp_path / "plain.model"
    plain.write_bytes(learn_spm((raw / "train.en").read_text().splitlines(), 200))
    with pytest.raises(XfError, match=r"--spm-model .*plain\.model: its vocabulary has no piece >>fra<<"):
        run(dest, pairs=("en-fr",), trainpref=str(raw / "train"), spm_model=str(plain))
    assert nothing_left(dest)
    ckpt = random_checkpoint(tmp_path / "bi.pt", plain.read_bytes())
    with pytest.raises(XfError, match=r"--vocab-from .*bi\.pt: its vocabulary has no piece >>deu<<"):
        run(dest, pairs=("en-de",), trainpref=str(raw / "train"), vocab_from=ckpt)
    assert nothing_left(dest)
    # one with the tags is taken as it is
    run(dest, pairs=("de-fr",), trainpref=str(raw / "train"), spm_model=str(multi[0] / "spm.model"))
    assert (dest / "meta.json").exists()


# -- temperature sampling ------------------------------------------------------------------------
def test_direction_probabilities_by_hand():
    assert np.allclose(direction_probabilities([900, 100], 1.0), [0.9, 0.1])
    # T=2: sqrt(0.9) : sqrt(0.1) = 0.9487 : 0.3162 = 0.75 : 0.25
    assert np.allclose(direction_probabilities([900, 100], 2.0), [0.75, 0.25])
    assert np.allclose(direction_probabilities([900, 100], 1e9), [0.5, 0.5])
    assert np.allclose(direction_probabilities([900, 100], 0.01), [1.0, 0.0])  # no overflow
    assert epoch_counts([900, 100], 2.0) == [750, 250] and epoch_counts([900, 100], 1.0) == [900, 100]
    assert epoch_counts([900, 0, 100], 2.0) == [750, 0, 250]


def test_a_direction_a_temperature_near_0_never_draws_is_named():
    """--sampling-temperature 1e-300 trained one direction 0% of the time, silently: xf train now
    warns, naming the directions ``undrawn`` lists (an empty one is not left out: it has nothing)."""
    assert undrawn([900, 100], 1e-300) == [1] and undrawn([900, 100], 0.01) == [1]
    assert undrawn([900, 100], 1.0) == [] and undrawn([900, 0, 100], 2.0) == []


def test_a_drawn_epoch_takes_whole_passes_then_a_sample():
    rows = draw_epoch([900, 100], [750, 250], seed=1, epoch=3)
    first, second = rows[rows < 900], rows[rows >= 900] - 900
    assert len(first) == 750 and len(np.unique(first)) == 750  # a part of one pass, without repeats
    counts = np.bincount(second, minlength=100)
    assert len(second) == 250 and set(counts.tolist()) == {2, 3} and (counts == 3).sum() == 50
    assert np.array_equal(rows, draw_epoch([900, 100], [750, 250], seed=1, epoch=3))  # a resume draws the same
    assert not np.array_equal(rows, draw_epoch([900, 100], [750, 250], seed=1, epoch=4))
    assert epoch_sampler([900, 100], 1.0, 1) is None and epoch_sampler([50, 50], 3.0, 1) is None


def test_bilingual_batches_are_the_batches_made_once(tmp_path, raw):
    run(tmp_path / "bi", trainpref=str(raw / "train"), bpe_vocab_size=300)
    ds = DataDir.open(tmp_path / "bi").split("train")
    eb = EpochBatches(ds, 300, seed=3, update_freq=1)
    made = batch_by_size(ds.src_sizes, ds.tgt_sizes, 300)
    for epoch in (1, 2, 5):
        batches, order = eb.epoch(epoch)
        assert [b.tolist() for b in batches] == [b.tolist() for b in made]
        assert np.array_equal(order, epoch_order(len(made), 3, epoch))


def test_a_drawn_epoch_holds_each_directions_count(uneven):
    data = DataDir.open(uneven[0])
    sizes = list(data.directions("train").values())
    counts = epoch_counts(sizes, 5.0)
    eb = EpochBatches(data.split("train"), 300, seed=3, update_freq=1, draw=epoch_sampler(sizes, 5.0, 3))
    for epoch in (1, 2):
        rows = np.concatenate(eb.epoch(epoch)[0])
        assert [(rows < sizes[0]).sum(), (rows >= sizes[0]).sum()] == counts
    assert counts[1] > 1.5 * sizes[1]  # the small direction is seen more than once an epoch


def test_prefetched_drawn_epochs_are_the_batches_asked_for(uneven):
    """Collated ahead in a thread, across the boundary of two drawn epochs: the micro-batches
    are those made when asked."""
    data = DataDir.open(uneven[0])
    sizes = list(data.directions("train").values())
    eb = EpochBatches(data.split("train"), 300, seed=3, update_freq=2, draw=epoch_sampler(sizes, 5.0, 3))
    ahead, position = Prefetch(eb, background=True), (1, 0)
    for _ in range(eb.updates_per_epoch(1) + 3):
        got, want = ahead.take(*position), eb.micro_batches(*position)
        assert len(got) == len(want)
        assert all(torch.equal(g[k], w[k]) for g, w in zip(got, want) for k in ("src", "prev_output", "target"))
        position = eb.next_update(*position)
    assert position == (2, 6)
    ahead.close()


# -- xf train ------------------------------------------------------------------------------------
def test_training_records_the_pairs_in_the_checkpoint(multi, tmp_path):
    summary = train(opts(multi[0], tmp_path / "ckpt", max_update=3, eval_bleu=True, validate_interval_updates=3))
    assert summary["num_updates"] == 3 and summary["valid"]["bleu"] >= 0
    meta = load_checkpoint(tmp_path / "ckpt" / "checkpoint_last.pt")["meta"]
    assert meta["pairs"] == list(PAIRS) and (meta["source_lang"], meta["target_lang"]) == ("src", "tgt")
    start = json.loads((tmp_path / "ckpt" / "train_log.jsonl").read_text().splitlines()[0])
    assert start["type"] == "start"


@pytest.mark.slow
def test_a_resume_draws_the_same_epochs(uneven, tmp_path):
    """Temperature-drawn epochs: N+M updates in one run == N updates, stop, resume for M."""
    data = uneven[0]
    kw = dict(update_freq=2, dropout=0.2, max_tokens=300, max_epoch=2)
    full = train(opts(data, tmp_path / "full", **kw))
    n = full["num_updates"]
    train(opts(data, tmp_path / "part", max_update=n // 2 - 1, **kw))  # stops inside epoch 1
    assert train(opts(data, tmp_path / "part", **kw))["num_updates"] == n
    a, b = (load_checkpoint(tmp_path / d / "checkpoint_last.pt") for d in ("full", "part"))
    for name in a["model"]:
        assert torch.equal(a["model"][name], b["model"][name]), name
    assert a["train_state"]["position"] == b["train_state"]["position"]
