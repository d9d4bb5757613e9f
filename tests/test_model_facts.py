"""model_facts: one record of what a model is, read once from its checkpoint (or a CTranslate2
directory's xf.json), and the consumers that ask it: a DE->EN model exports de->en to every format
with no flag, a flag may confirm the model's languages but not contradict them, a flag the format
does not read is refused, and every format's refusal is the record's."""

import json
import zipfile

import pytest
import yaml

from xformer_cli.model.checkpoint import load_checkpoint
from xformer_cli.decode.ctranslate2_engine import read_exported_model
from xformer_cli.model.facts import facts_of, from_export, read_facts

from helpers import cli_fails, random_checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")
MARIAN = dict(sinusoids="tensor2tensor", decoder_start="zero")  # what Marian and Bergamot hold (MarianMT: the paper's)
DE_EN = {"epoch": 1, "num_updates": 1, "end_of_epoch": True, "source_lang": "de", "target_lang": "en"}
fails = cli_fails


def xf(*args):
    from typer.testing import CliRunner

    from xformer_cli.cli import app

    result = CliRunner().invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    return result


@pytest.fixture(scope="module")
def deen(spm_model, tmp_path_factory):
    """A DE->EN model of the paper's conventions (CTranslate2, MarianMT, Argos)."""
    return random_checkpoint(tmp_path_factory.mktemp("deen") / "deen.pt", spm_model, meta=DE_EN, d_model=64, d_ff=128)


@pytest.fixture(scope="module")
def deen_marian(spm_model, tmp_path_factory):
    """A DE->EN model of Marian's conventions (Marian, Bergamot)."""
    return random_checkpoint(tmp_path_factory.mktemp("deen") / "deen_marian.pt", spm_model, meta=DE_EN, d_model=64,
                             d_ff=128, **MARIAN)


def test_the_record_holds_the_checkpoints_facts(deen, deen_marian):
    facts = read_facts(deen_marian)
    assert facts.pairs == (("de", "en"),) and not facts.multilingual and not facts.tagged and facts.tags == []
    assert (facts.sinusoids, facts.decoder_start, facts.share_embeddings, facts.positions) == (
        "tensor2tensor", "zero", "all", "sinusoidal")
    assert (facts.d_model, facts.vocab_size, facts.vocabulary_kind) == (64, 200, "sentencepiece")
    assert [fmt for fmt, reason in facts.exports if reason is None] == ["ctranslate2", "argos", "marian", "bergamot"]
    assert "--sinusoids tensor2tensor cannot be exported to MarianMT" in facts.export_refusal("huggingface")
    assert [fmt for fmt, reason in read_facts(deen).exports if reason is None] == [
        "ctranslate2", "argos", "huggingface"]
    assert facts.translates("de", "en") and not facts.translates("en", "de")


def test_a_multilingual_records_pairs_and_tags_and_an_export_its_languages():
    ckpt = {"model_config": {"vocab_size": 300, "d_model": 32, "heads": 4}, "spm_model": None,
            "meta": {"source_lang": "src", "target_lang": "tgt", "pairs": ["en-de", "en-fr"]}}
    facts = facts_of(ckpt, "m.pt")
    assert facts.multilingual and facts.tagged and facts.tags == [">>deu<<", ">>fra<<"]
    assert facts.translates("en", "fr") and not facts.translates("de", "fr")
    assert facts.export_refusal("ctranslate2") is None and facts.export_refusal("huggingface") is None
    for fmt in ("argos", "marian", "bergamot"):
        assert "multilingual (en-de, en-fr)" in facts.export_refusal(fmt)
    exported = from_export({"max_positions": 64, "languages": {"source_lang": "de", "target_lang": "en"}}, "dir")
    assert exported.pairs == (("de", "en"),) and exported.max_positions == 64 and exported.d_model is None


def test_every_reason_is_named_at_once(spm_model, tmp_path):
    ckpt = random_checkpoint(tmp_path / "m.pt", spm_model, share_embeddings="none", normalize_before=True)
    reason = facts_of(load_checkpoint(ckpt), ckpt).export_refusal("marian")
    for part in ("--normalize-before", "--sinusoids paper", "--decoder-start bos", "--share-embeddings none"):
        assert part in reason
    line = fails(["export", "marian", "--path", ckpt, "--output", tmp_path / "out"], reason)
    assert line == f"xf: error: xf export marian: {ckpt}: {reason}" and not (tmp_path / "out").exists()


def test_the_untied_output_is_refused_by_marians_export_too(spm_model, tmp_path):
    untied = random_checkpoint(tmp_path / "u.pt", spm_model, share_embeddings="none", **MARIAN)
    fails(["export", "marian", "--path", untied, "--output", tmp_path / "out"], "--share-embeddings none")
    assert not (tmp_path / "out").exists()


def test_a_deen_model_exports_deen_to_every_format_without_flags(deen, deen_marian, tmp_path, monkeypatch):
    xf("export", "ctranslate2", "--path", deen, "--output", tmp_path / "ct2")
    assert json.loads((tmp_path / "ct2" / "xf.json").read_text())["languages"] == {"source_lang": "de",
                                                                                   "target_lang": "en"}
    assert from_export(read_exported_model(tmp_path / "ct2"), "ct2").pairs == (("de", "en"),)
    xf("export", "huggingface", "--path", deen, "--output", tmp_path / "hf")
    tokenizer = json.loads((tmp_path / "hf" / "tokenizer_config.json").read_text())
    assert (tokenizer["source_lang"], tokenizer["target_lang"]) == ("de", "en")
    xf("export", "argos", "--path", deen, "--output", tmp_path / "m.argosmodel")
    with zipfile.ZipFile(tmp_path / "m.argosmodel") as z:
        name = next(n for n in z.namelist() if n.endswith("metadata.json"))
        meta = json.loads(z.read(name))
        assert (meta["from_code"], meta["to_code"]) == ("de", "en")
        assert not any("/en.onnx" in n for n in z.namelist())  # no English sentence splitter for German
    xf("export", "marian", "--path", deen_marian, "--output", tmp_path / "marian")
    assert yaml.safe_load((tmp_path / "marian" / "decoder.yml").read_text())["vocabs"]
    import xformer_cli.formats.bergamot as bergamot

    package = tmp_path / "package"
    for name in bergamot.ENGINE_FILES:  # the engine's files as stand-ins: the export only copies them
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_bytes(b"")
    monkeypatch.setattr(bergamot, "engine_package", lambda path: package)
    xf("export", "bergamot", "--path", deen_marian, "--output", tmp_path / "page")
    assert list(json.loads((tmp_path / "page" / "registry.json").read_text())) == ["deen"]


def test_a_flag_may_confirm_the_models_languages_not_contradict_them(deen, tmp_path):
    xf("export", "huggingface", "--path", deen, "--output", tmp_path / "hf", "--source-lang", "de")
    # ISO 639-3 confirms as 639-1 does (was "--source-lang deu: ... translates de-en")
    xf("export", "argos", "--path", deen, "--output", tmp_path / "deu.argosmodel", "--source-lang", "deu",
       "--target-lang", "eng")
    fails(["export", "huggingface", "--path", deen, "--output", tmp_path / "x", "--target-lang", "deu"],
          "--target-lang deu: " + deen + " translates de-en (its recorded languages)")
    fails(["export", "huggingface", "--path", deen, "--output", tmp_path / "x", "--target-lang", "de"],
          "--target-lang de: " + deen + " translates de-en (its recorded languages)")
    fails(["export", "argos", "--path", deen, "--output", tmp_path / "x.argosmodel", "--source-lang", "en"],
          "--source-lang en")
    assert not (tmp_path / "x").exists() and not (tmp_path / "x.argosmodel").exists()


@pytest.mark.parametrize("fmt, flags, named", [
    ("ctranslate2", ["--source-name", "Deutsch", "--package-version", "2.0", "--beam-size", "5"],
     "--beam-size, --source-name, --package-version mean nothing to a ctranslate2 export"),
    ("ctranslate2", ["--source-lang", "de"], "--source-lang means nothing to a ctranslate2 export"),
    ("marian", ["--quantization", "int8"], "--quantization means nothing to a marian export"),
    ("huggingface", ["--shortlist", "sl.npz"], "--shortlist means nothing"),
    ("argos", ["--bleu", "s.json"], "--bleu means nothing"),
])
def test_a_flag_the_format_does_not_read_is_refused(deen, tmp_path, fmt, flags, named):
    fails(["export", fmt, "--path", deen, "--output", tmp_path / "out", *flags], named)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("engine", ["xf", "ctranslate2"])
def test_serve_refuses_a_direction_the_model_does_not_translate_with_either_engine(deen, tmp_path, engine):
    """``--model en-fr=DE_EN.pt`` would serve English as French: refused at start, before a model loads."""
    from xformer_cli.settings.config import build_options
    from xformer_cli.base.errors import XfError
    from xformer_cli.settings.options import ServeOptions
    from xformer_cli.serve.directions import load_directions

    path = deen
    if engine == "ctranslate2":
        xf("export", "ctranslate2", "--path", deen, "--output", tmp_path / "ct2")
        path = str(tmp_path / "ct2")
    options = build_options(ServeOptions, {"model": [f"de-fr={path}"], "engine": engine}, "test")
    with pytest.raises(XfError, match=f"--model de-fr={path}: the model translates de-en, not de-fr"):
        load_directions(options)
    options = build_options(ServeOptions, {"model": [f"de-en={path}"], "engine": engine, "device": "cpu"}, "test")
    assert [(d.source, d.target) for d in load_directions(options)] == [("de", "en")]  # confirming it: served


def test_a_multilingual_models_alignments_are_equal_in_translate_and_serve(multi30k_dir, tmp_path):
    """One rule for the target tag (``ModelFacts.tagged``, applied by ``Engine.alignments``): xf
    translate --print-alignment and xf serve's word alignments (its HTML markup's) agree."""
    from xformer_cli.settings.config import build_options
    from xformer_cli.settings.options import ServeOptions, TranslateOptions
    from xformer_cli.serve.batch_queue import word_alignments
    from xformer_cli.serve.directions import load_directions

    from helpers import multilingual_checkpoint

    # seed 1: a random model whose attention peaks at the tag on some of these lines (where the two
    # rules of the tag, skipped or aligned to and shifted, differ)
    ckpt = multilingual_checkpoint(tmp_path / "m.pt", multi30k_dir, seed=1)
    lines = (multi30k_dir / "test2016.en").read_text(encoding="utf-8").splitlines()[:200]
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    printed = xf("translate", "--path", ckpt, "--input", tmp_path / "in.txt", "--target-lang", "fr",
                 "--print-alignment", "--alignment-level", "word", "--device", "cpu", "--threads", "1", "--quiet",
                 "--precision", "fp32", "--max-len-a", "0", "--max-len-b", "12").output.splitlines()
    mine = [sorted(tuple(map(int, p.split("-"))) for p in line.split(" ||| ")[1].split()) for line in printed]
    options = build_options(ServeOptions, {"model": [f"en-fr={ckpt}"], "device": "cpu", "threads": 1,
                                           "precision": "fp32", "max_len_a": 0, "max_len_b": 12}, "test")
    direction = load_directions(options)[0]
    sources = [direction.sp.encode(line) for line in lines]
    found = direction.engine.search(sources, TranslateOptions(**{k: getattr(direction.options, k) for k in (
        "beam_size", "max_len_a", "max_len_b", "lenpen", "nbest")}, path=(ckpt,)))
    served = [sorted(pairs) for pairs in word_alignments(direction, sources, found)]
    assert served == mine


def test_serve_makes_one_start_up_plan_for_every_model(deen, spm_model, tmp_path, monkeypatch):
    import xformer_cli.decode.plan as decoding_plan
    import xformer_cli.serve.directions as serve_directions
    import xformer_cli.decode.translate as translation
    from xformer_cli.settings.config import build_options
    from xformer_cli.settings.options import ServeOptions

    other = random_checkpoint(tmp_path / "ende.pt", spm_model, meta={"source_lang": "en", "target_lang": "de"})
    made = []
    counted = lambda options, machine: made.append(options.path) or decoding_plan.plan_decoding(options, machine)  # noqa: E731
    monkeypatch.setattr(serve_directions, "plan_decoding", counted)
    monkeypatch.setattr(translation, "plan_decoding", counted)
    options = build_options(ServeOptions, {"model": [deen, other], "device": "cpu"}, "test")
    directions = serve_directions.load_directions(options)
    assert [(d.source, d.target) for d in directions] == [("de", "en"), ("en", "de")]
    assert len(made) == 1 and directions[0].engine.plan is directions[1].engine.plan
