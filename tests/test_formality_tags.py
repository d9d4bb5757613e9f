"""Formality tags (formality_tags.py): xf preprocess --formality-tags tags each source by its
German target's address, the data and the checkpoint record it, and xf translate --formality
(or a jsonl line's "formality") puts the tag the model was trained with in front of the source;
a model without the tags refuses, in one line. A few hundred lines and tiny random models:
seconds."""

import json
import re

import numpy as np
import pytest
import torch
import yaml

from xformer_cli.base.errors import ConfigError, XfError
from xformer_cli.commands import preprocess as pp
from xformer_cli.commands.train import train
from xformer_cli.commands.translate import translate
from xformer_cli.data.dataset import DataDir
from xformer_cli.decode.engines import XfEngine
from xformer_cli.decode.steering import source_vocabulary
from xformer_cli.decode.translate import Stats, open_engine, translate_buffer
from xformer_cli.frame import load_command_options
from xformer_cli.model.checkpoint import load_checkpoint, make_checkpoint, save_checkpoint
from xformer_cli.model.transformer import build_model
from xformer_cli.settings.options import PreprocessOptions, TranslateOptions
from xformer_cli.text.formality import classify
from xformer_cli.text.formality_tags import TAGS, FormalityVocabulary
from xformer_cli.text.languages import TaggedVocabulary, describe, languages_of, tag
from xformer_cli.text.vocab import load_sentencepiece

from helpers import cli_fails, learn_spm, opts

pytestmark = pytest.mark.usefixtures("one_thread")

# (English, German, the German's address as the classifier reads it with the English beside it)
ADDRESSED = [
    ("Do you have time?", "Haben Sie Zeit?", "formal"),
    ("Do you have time?", "Hast du Zeit?", "informal"),
    ("Thank you.", "Ich danke Ihnen.", "formal"),
    ("Are you coming?", "Kommt ihr mit?", "informal"),
    ("The weather is nice.", "Das Wetter ist schön.", "none"),
    ("You are tired.", "Sie sind müde.", "formal"),  # ambiguous German: the English decides
    ("They are tired.", "Sie sind müde.", "none"),
    ("She is tired.", "Sie ist müde.", "none"),
]


@pytest.fixture(scope="module")
def raw(multi30k_dir, tmp_path_factory):
    """train.{en,de,fr}: the ADDRESSED pairs, then 150 Multi30k lines (no address); val: ADDRESSED."""
    root = tmp_path_factory.mktemp("raw")
    for lang in ("en", "de", "fr"):
        lines = (multi30k_dir / f"train.{lang}").read_text(encoding="utf-8").splitlines()[:150]
        own = [a[0] if lang != "de" else a[1] for a in ADDRESSED]  # (the French side: English words will do)
        (root / f"train.{lang}").write_text("\n".join(own + lines) + "\n", encoding="utf-8")
        (root / f"val.{lang}").write_text("\n".join(own) + "\n", encoding="utf-8")
    return root


def run(dest, **kw):
    """xf preprocess, keeping the short pairs of ADDRESSED (no length ratio drops them)."""
    return pp.preprocess(PreprocessOptions(destdir=str(dest), **{"max_len_ratio": 100.0, **kw}))


@pytest.fixture(scope="module")
def tagged(raw, tmp_path_factory):
    dest = tmp_path_factory.mktemp("tagged") / "bin"
    return dest, run(dest, trainpref=str(raw / "train"), validpref=str(raw / "val"), bpe_vocab_size=300,
                     formality_tags=True)


def spm_of(dest):
    return load_sentencepiece(DataDir.open(dest).spm_model_bytes, "spm.model")


# -- xf preprocess --formality-tags ------------------------------------------------------------------
def test_each_source_starts_with_its_targets_formality_and_no_target_holds_a_tag(tagged, raw):
    dest, meta = tagged
    sp = spm_of(dest)
    ids = {f: sp.piece_to_id(piece) for f, piece in TAGS.items()}
    assert all(sp.is_control(i) for i in ids.values())
    for split in ("train", "valid"):
        ds = DataDir.open(dest).split(split)
        for i, (en, _, label) in enumerate(ADDRESSED):
            src, tgt = ds[i]
            expected = ([ids[label]] if label != "none" else []) + sp.encode(en)
            assert src.tolist() == expected, (en, label)
            assert not np.isin(tgt, list(ids.values())).any()
    # the Multi30k captions: tagged as the classifier reads them (few address anyone: "Du weißt, ...")
    en, de = ((raw / f"train.{lang}").read_text(encoding="utf-8").splitlines() for lang in ("en", "de"))
    ds = DataDir.open(dest).split("train")
    for i in range(len(ADDRESSED), len(ds)):
        label = classify(de[i], en[i])
        assert ds[i][0].tolist() == ([ids[label]] if label != "none" else []) + sp.encode(en[i])


def test_meta_records_the_tags_and_counts_the_tagged_pairs(tagged):
    dest, meta = tagged
    assert meta["formality"] == "de" and meta["options"]["formality_tags"] is True
    assert meta["bpe"]["control_symbols"] == [">>formal<<", ">>informal<<"]
    assert meta["stats"]["valid"]["formality"] == {"formal": 3, "informal": 2, "untagged": 3}
    train = meta["stats"]["train"]
    assert train["formality"]["formal"] >= 3 and sum(train["formality"].values()) == train["pairs"]
    labels = list(pp.summary_table(meta, dest, 0.0).columns[0].cells)
    assert "  tagged formal / informal" in labels
    assert pp.verify(dest) == meta


def test_without_the_option_meta_json_is_as_before(raw, tmp_path):
    meta = run(tmp_path / "plain", trainpref=str(raw / "train"), bpe_vocab_size=300)
    assert "formality" not in meta and "formality_tags" not in meta["options"]
    assert "formality" not in meta["stats"]["train"] and "control_symbols" not in meta["bpe"]


def test_beside_pairs_the_formality_tag_follows_the_target_tag_into_german_only(raw, tmp_path):
    dest = tmp_path / "multi"
    meta = run(dest, pairs=("en-de", "en-fr"), trainpref=str(raw / "train"), bpe_vocab_size=300,
               formality_tags=True)
    sp = spm_of(dest)
    assert meta["bpe"]["control_symbols"] == [">>deu<<", ">>fra<<", ">>formal<<", ">>informal<<"]
    ds, kept = DataDir.open(dest).split("train"), meta["stats"]["train"]["directions"]
    de, fr = sp.piece_to_id(">>deu<<"), sp.piece_to_id(">>fra<<")
    assert ds[0][0].tolist() == [de, sp.piece_to_id(">>formal<<"), *sp.encode("Do you have time?")]
    assert ds[1][0].tolist() == [de, sp.piece_to_id(">>informal<<"), *sp.encode("Do you have time?")]
    first_fr = kept["en-de"]["pairs"]
    assert ds[first_fr][0].tolist() == [fr, *sp.encode("Do you have time?")]  # French targets: untagged
    assert meta["stats"]["train"]["formality"]["formal"] >= 3  # the German direction's


def test_a_given_vocabulary_needs_the_tags(tagged, raw, tmp_path):
    plain = tmp_path / "plain.model"
    plain.write_bytes(learn_spm((raw / "train.en").read_text(encoding="utf-8").splitlines(), 200))
    with pytest.raises(XfError, match=r"has no piece >>formal<<, a tag that --formality-tags puts"):
        run(tmp_path / "x", trainpref=str(raw / "train"), spm_model=str(plain), formality_tags=True)
    run(tmp_path / "y", trainpref=str(raw / "train"), spm_model=str(tagged[0] / "spm.model"), formality_tags=True)


@pytest.mark.parametrize("kw, message", [
    (dict(target_lang="fr"), "--formality-tags labels German targets by their address (du or Sie): fr is not German"),
    (dict(pairs=("en-fr",)), "fr is not German"),
])
def test_formality_tags_need_a_german_target(kw, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        PreprocessOptions(destdir="x", trainpref="t", formality_tags=True, **kw)


def test_training_records_the_formality_in_the_checkpoint(tagged, tmp_path):
    train(opts(tagged[0], tmp_path / "ckpt", max_update=2))
    meta = load_checkpoint(tmp_path / "ckpt" / "checkpoint_last.pt")["meta"]
    assert meta["formality"] == "de"
    assert languages_of(meta)["formality"] == "de"  # what average and export carry
    assert describe(languages_of(meta)) == "en-de with formality tags"


# -- xf translate --formality --------------------------------------------------------------------------
def checkpoint(path, spm_model: bytes, **meta) -> str:
    torch.manual_seed(0)
    model = build_model("tiny", vocab_size=load_sentencepiece(spm_model, "spm").get_piece_size(), d_model=32,
                        d_ff=64, heads=4, max_positions=128)
    save_checkpoint(path, make_checkpoint(model, spm_model, meta={"epoch": 1, "num_updates": 1, **meta}))
    return str(path)


@pytest.fixture(scope="module")
def models(tagged, multi30k_dir, tmp_path_factory):
    """formal.pt (bilingual en-de, formality tags), plain.pt (the same vocabulary, no record of
    them) and multi.pt (en-de, en-fr, formality tags)."""
    root = tmp_path_factory.mktemp("models")
    spm_model = DataDir.open(tagged[0]).spm_model_bytes
    lines = [line for lang in ("en", "de", "fr")
             for line in (multi30k_dir / f"train.{lang}").read_text(encoding="utf-8").splitlines()[:200]]
    multi_spm = learn_spm(lines, 300, symbols=[tag("de"), tag("fr"), *TAGS.values()])
    return dict(
        formal=checkpoint(root / "formal.pt", spm_model, source_lang="en", target_lang="de", formality="de"),
        plain=checkpoint(root / "plain.pt", spm_model, source_lang="en", target_lang="de"),
        multi=checkpoint(root / "multi.pt", multi_spm, source_lang="src", target_lang="tgt",
                         pairs=["en-de", "en-fr"], formality="de"))


def searched(path, target_lang=None, formality=None, lines=("Do you have time?", "")):
    """The source ids the engine searched for ``lines`` (translate_buffer, as xf translate runs it)."""
    options = TranslateOptions(path=(path,), device="cpu", max_len_a=0, max_len_b=3, target_lang=target_lang,
                               formality=formality)
    engine, sp, _ = open_engine(options)
    seen = []
    search = engine.search
    engine.search = lambda sentences, *a, **k: seen.extend(map(list, sentences)) or search(sentences, *a, **k)
    vocab = source_vocabulary(engine, sp, target_lang, path, formality)
    translate_buffer(engine, vocab, list(lines), 0, TranslateOptions(path=(path,), device="cpu", max_len_a=0,
                                                                      max_len_b=3), Stats())
    return seen, sp, vocab


@pytest.mark.parametrize("formality", ["formal", "informal"])
def test_formality_puts_its_tag_first(models, formality):
    seen, sp, vocab = searched(models["formal"], formality=formality)
    assert isinstance(vocab, FormalityVocabulary)
    assert seen == [[sp.piece_to_id(TAGS[formality]), *sp.encode("Do you have time?")]]  # the empty line: no search


def test_without_formality_the_source_is_untagged(models):
    seen, sp, vocab = searched(models["formal"])
    assert vocab is sp and seen == [sp.encode("Do you have time?")]


def test_a_multilingual_source_starts_with_its_language_then_its_formality(models):
    seen, sp, vocab = searched(models["multi"], "de", "informal")
    assert isinstance(vocab, TaggedVocabulary)
    assert seen == [[sp.piece_to_id(">>deu<<"), sp.piece_to_id(">>informal<<"), *sp.encode("Do you have time?")]]
    with pytest.raises(ConfigError, match="formality tags choose the address of de, not of fr"):
        searched(models["multi"], "fr", "formal")


def test_a_model_without_formality_tags_refuses_in_one_line(models, tmp_path):
    (tmp_path / "in.txt").write_text("Hello.\n", encoding="utf-8")
    out = tmp_path / "out.txt"
    line = cli_fails(["translate", "--path", models["plain"], "--input", tmp_path / "in.txt", "--output", out,
                      "--formality", "formal", "--device", "cpu", "--quiet"], "has no formality tags")
    assert models["plain"] in line and "--formality formal" in line and not out.exists()


def test_an_ensemble_has_formality_tags_in_every_model_or_in_none(models, tmp_path):
    for paths in ((models["formal"], models["plain"]), (models["plain"], models["formal"])):
        cli_fails(["translate", "--path", *paths, "--input", "-", "--device", "cpu"],
                  f"{models['formal']} has formality tags but {models['plain']} has none")


def test_jsonl_lines_choose_their_own_formality(models, tmp_path, monkeypatch):
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in [
        {"source": "Do you have time?", "formality": "formal"}, {"source": "Do you have time?"},
        {"source": "Do you have time?", "formality": "informal"}]) + "\n", encoding="utf-8")
    seen = []
    search = XfEngine.search
    monkeypatch.setattr(XfEngine, "search", lambda self, sentences, *a, **k: seen.extend(map(list, sentences))
                        or search(self, sentences, *a, **k))
    translate(TranslateOptions(path=(models["formal"],), input=str(src), output=str(tmp_path / "o"),
                               input_format="jsonl", formality="informal", device="cpu", quiet=True, max_len_a=0,
                               max_len_b=3))
    sp = load_sentencepiece(load_checkpoint(models["formal"])["spm_model"], "spm")
    text = sp.encode("Do you have time?")
    formal, informal = sp.piece_to_id(">>formal<<"), sp.piece_to_id(">>informal<<")
    assert sorted(seen) == sorted([[formal, *text], [informal, *text], [informal, *text]])  # the option's: line 2


def test_a_jsonl_formality_is_checked_and_refused_by_a_model_without_tags(models, tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"source": "Hi.", "formality": "polite"}) + "\n", encoding="utf-8")
    cli_fails(["translate", "--path", models["formal"], "--input", src, "--input-format", "jsonl", "--device", "cpu"],
              "line 1: 'formality' must be formal or informal, got 'polite'")
    src.write_text(json.dumps({"source": "Hi."}) + "\n" + json.dumps({"source": "Hi.", "formality": "formal"}) + "\n",
                   encoding="utf-8")
    cli_fails(["translate", "--path", models["plain"], "--input", src, "--input-format", "jsonl", "--device", "cpu"],
              "line 2: --formality formal: ")
    cli_fails(["translate", "--path", models["formal"], "--input", src, "--input-format", "jsonl", "--device", "cpu",
               "--print-alignment"], "line 2: 'formality' puts a tag before the source")


def test_formality_options_and_their_yaml_key(tmp_path):
    config = tmp_path / "xf.yaml"
    config.write_text(yaml.safe_dump({"translate": {"formality": "informal"}}), encoding="utf-8")
    assert load_command_options(TranslateOptions, config, {"path": ("m.pt",)}, section="translate").formality == "informal"
    config.write_text(yaml.safe_dump({"preprocess": {"formality_tags": True}}), encoding="utf-8")
    assert load_command_options(PreprocessOptions, config, {"destdir": "d", "trainpref": "t"},
                                section="preprocess").formality_tags
    with pytest.raises(ConfigError, match="formality"):
        load_command_options(TranslateOptions, config, {"path": ("m.pt",), "formality": "polite"})
    with pytest.raises(ValueError, match="--formality puts a tag before each source"):
        TranslateOptions(path=("m.pt",), formality="formal", print_alignment=True)


def test_split_sentences_start_every_piece_with_the_target_and_formality_tags(models):
    """--split-sentences (and xf serve's splitting): each sentence, and each piece of one too long,
    starts with the tags the vocabulary puts first, the target's then the formality's."""
    from xformer_cli.model.facts import read_facts
    from xformer_cli.text.segment import leading_tags, split_texts

    facts = read_facts(models["multi"])
    sp = load_sentencepiece(load_checkpoint(models["multi"])["spm_model"], "multi")
    vocab = facts.vocabulary(sp, "de", "multi", "formal")
    lead = [sp.piece_to_id(tag("de")), sp.piece_to_id(TAGS["formal"])]
    assert leading_tags(vocab) == lead and leading_tags(sp) == []
    long = " ".join(["a man sleeps"] * 10)
    units = split_texts([["A man sleeps. A dog runs.", long]], "en", vocab, max_source=12)
    assert len(units.pieces) > 3 and all(piece[:2] == lead and len(piece) <= 12 for piece in units.pieces)
    assert units.split_long == 1
    seen, sp, vocab = searched(models["formal"], formality="informal", lines=("Hello. How are you?",))
    assert seen == [[sp.piece_to_id(TAGS["informal"]), *sp.encode("Hello. How are you?")]]  # no split: one line


# -- xf serve's "formality" ---------------------------------------------------------------------------
def serve(paths: list[str]):
    """A started Server over ``paths`` (its --model values) and its directions, without binding."""
    import asyncio

    pytest.importorskip("starlette", reason="the serve extra is not installed")
    from xformer_cli.serve.directions import load_directions
    from xformer_cli.serve.server import Server
    from xformer_cli.settings.config import build_options
    from xformer_cli.settings.options import ServeOptions

    options = build_options(ServeOptions, {"model": paths, "max_len_a": 0, "max_len_b": 3, "threads": 1,
                                           "max_wait_ms": 0, "split_sentences": False, "device": "cpu"}, "test")
    server = Server(load_directions(options), options, [])
    server.loop = asyncio.new_event_loop()
    server.queue.start()
    return server


def ask(server, **fields):
    from helpers import call

    return server.loop.run_until_complete(call(server.app(), "/translate", json.dumps(fields).encode()))


def stopped(server):
    server.queue.stop()
    server.loop.close()


def test_serve_puts_the_asked_formality_first_and_settings_name_the_directions(models):
    from helpers import call

    server = serve([models["formal"], f"en-fr={models['multi']}"])
    seen = []
    try:
        for direction in server.directions.values():
            search = direction.engine.search
            direction.engine.search = (lambda s, *a, _search=search, **k: seen.append(list(map(list, s)))
                                       or _search(s, *a, **k))
        sp = server.directions["en-de"].target_sp
        ids = sp.encode("Do you have time?")
        for formality in ("formal", "informal", None):
            seen.clear()
            status, answer = ask(server, q="Do you have time?", source="en", target="de", formality=formality)
            assert status == 200 and isinstance(answer["translatedText"], str)
            assert seen == [[([sp.piece_to_id(TAGS[formality])] if formality else []) + ids]]
        assert server.directions["en-fr"].variants == {}  # the multilingual model's French takes none
        status, settings = server.loop.run_until_complete(call(server.app(), "/frontend/settings", method="GET"))
        assert status == 200 and settings["formality"] == ["en-de"]
        status, answer = ask(server, q="Do you have time?", source="en", target="fr", formality="formal")
        assert status == 400 and answer["error"].startswith("en-fr does not take 'formality'")
        for bad in ("polite", 1, ["formal"]):
            status, answer = ask(server, q="a", source="en", target="de", formality=bad)
            assert status == 400 and answer["error"].startswith("'formality' must be formal or informal")
        status, answer = ask(server, q="<p>Do you</p>", source="en", target="de", formality="formal", format="html")
        assert status == 400 and answer["error"] == "'formality' takes format 'text' only"
        de = server.directions["en-de"]
        assert de.variants["formal"].target_sp is de.target_sp  # target-side text takes no tag
    finally:
        stopped(server)


def test_a_multilingual_models_variant_puts_the_target_tag_then_the_formality(models):
    from xformer_cli.serve.directions import load_directions
    from xformer_cli.settings.config import build_options
    from xformer_cli.settings.options import ServeOptions

    options = build_options(ServeOptions, {"model": [models["multi"]], "device": "cpu", "threads": 1}, "test")
    directions = {d.code: d for d in load_directions(options)}
    assert directions["en-fr"].variants == {}
    variant = directions["en-de"].variants["informal"]
    sp = variant.target_sp
    assert variant.sp.encode("Hi") == [sp.piece_to_id(tag("de")), sp.piece_to_id(TAGS["informal"]), *sp.encode("Hi")]
    assert variant.engine is directions["en-de"].engine  # one copy of the model


def test_serve_refuses_formality_of_a_model_without_tags(models):
    server = serve([models["plain"]])
    try:
        status, answer = ask(server, q="Do you have time?", source="en", target="de", formality="informal")
        assert status == 400 and "en-de does not take 'formality': its model has no formality tags" in answer["error"]
        assert ask(server, q="Do you have time?", source="en", target="de")[0] == 200
    finally:
        stopped(server)


# -- exports that carry the tags --------------------------------------------------------------------
def test_a_ctranslate2_export_takes_formality_as_xf_does(models, tmp_path):
    pytest.importorskip("ctranslate2", reason="the ctranslate2 extra is not installed")
    from typer.testing import CliRunner

    from xformer_cli.cli import app

    runner = CliRunner()
    assert runner.invoke(app, ["export", "ctranslate2", "--path", models["formal"], "--output",
                               str(tmp_path / "ct2")]).exit_code == 0
    assert json.loads((tmp_path / "ct2" / "xf.json").read_text(encoding="utf-8"))["languages"]["formality"] == "de"
    (tmp_path / "in.txt").write_text("Do you have time?\nA man sleeps.\n", encoding="utf-8")

    def out(path, *more):
        result = runner.invoke(app, ["translate", "--path", str(path), "--input", str(tmp_path / "in.txt"),
                                     "--max-len-a", "0", "--max-len-b", "6", "--threads", "1", "--quiet",
                                     "--output-format", "jsonl", *more])
        assert result.exit_code == 0, result.output
        return [(h["tokens"], h["score"]) for h in (json.loads(line)["hypotheses"][0]
                                                     for line in result.output.splitlines())]

    found = {}
    for formality in ("formal", "informal"):
        found[formality] = out(models["formal"], "--formality", formality)
        theirs = out(tmp_path / "ct2", "--engine", "ctranslate2", "--formality", formality)
        assert [t for t, _ in theirs] == [t for t, _ in found[formality]]
        assert [s for _, s in theirs] == pytest.approx([s for _, s in found[formality]], abs=1e-3)
    assert [s for _, s in found["formal"]] != pytest.approx([s for _, s in found["informal"]], abs=1e-3)  # the tag counts
    plain = runner.invoke(app, ["export", "ctranslate2", "--path", models["plain"], "--output", str(tmp_path / "p")])
    assert plain.exit_code == 0
    refused = runner.invoke(app, ["translate", "--path", str(tmp_path / "p"), "--engine", "ctranslate2",
                                  "--formality", "formal", "--input", str(tmp_path / "in.txt")])
    assert refused.exit_code != 0 and "has no formality tags" in refused.output


@pytest.mark.slow  # imports transformers (seconds)
def test_a_hugging_face_export_encodes_the_typed_tag_as_xf(models, tmp_path):
    transformers = pytest.importorskip("transformers", reason="the hf extra is not installed")
    from typer.testing import CliRunner

    from xformer_cli.cli import app
    from xformer_cli.text.vocab import EOS_ID

    result = CliRunner().invoke(app, ["export", "huggingface", "--path", models["formal"], "--output",
                                      str(tmp_path / "hf")])
    assert result.exit_code == 0, result.output
    tokenizer = transformers.MarianTokenizer.from_pretrained(str(tmp_path / "hf"))
    sp = load_sentencepiece(load_checkpoint(models["formal"])["spm_model"], "formal")
    for formality, piece in TAGS.items():
        vocab = FormalityVocabulary(sp, formality, sp.piece_to_id(piece))
        assert tokenizer(f"{piece} Do you have time?")["input_ids"] == vocab.encode("Do you have time?") + [EOS_ID]
