"""Choosing the target language of a multilingual model: xf translate --target-lang (and a jsonl
line's "target_lang"), xf score-pairs and xf calibrate over the same vocabulary
(``languages.vocabulary_for``): the tag is the first source id, the user's text and target-side
text are encoded as before; one-line refusals with nothing written; ensembles agree on their
directions; exports that cannot put a tag first refuse the model."""

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from xformer_cli.model.checkpoint import load_checkpoint, save_checkpoint
from xformer_cli.cli import app
from xformer_cli.text.languages import TaggedVocabulary, tag
from xformer_cli.settings.options import TranslateOptions
from xformer_cli.text.segment import split_texts
from xformer_cli.decode.translate import Stats, open_engine, translate_buffer
from xformer_cli.decode.steering import source_vocabulary

from helpers import cli_fails, multilingual_checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py: torch on one thread (tiny models)
runner = CliRunner()
FAST = ["--device", "cpu", "--threads", "1", "--quiet", "--max-len-a", "0", "--max-len-b", "6"]


@pytest.fixture(scope="module")
def ckpt(multi30k_dir, tmp_path_factory):
    return multilingual_checkpoint(tmp_path_factory.mktemp("ml") / "m.pt", multi30k_dir)


@pytest.fixture(scope="module")
def lines(multi30k_dir):
    return (multi30k_dir / "test2016.en").read_text(encoding="utf-8").splitlines()[:20]


def relabelled(ckpt, path, **meta):
    """A copy of ``ckpt`` (same model and vocabulary) whose meta is changed by ``meta`` (None: drop)."""
    data = load_checkpoint(ckpt)
    data["meta"] = {k: v for k, v in {**data["meta"], **meta}.items() if v is not None}
    save_checkpoint(path, data)
    return str(path)


def xf(*args):
    result = runner.invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    return result


fails = cli_fails  # one error line holding the message (helpers.cli_fails)


# -- the tag is the first source id ------------------------------------------------------------------
def test_each_target_puts_its_tag_first_and_the_text_after_it(ckpt, lines):
    options = TranslateOptions(path=(ckpt,), device="cpu", max_len_b=4, max_len_a=0)
    engine, sp, _ = open_engine(options)
    seen = []
    search = engine.search
    engine.search = lambda sentences, *a, **k: seen.extend(sentences) or search(sentences, *a, **k)
    for lang in ("de", "fr"):
        seen.clear()
        vocab = source_vocabulary(engine, sp, lang, ckpt)
        assert isinstance(vocab, TaggedVocabulary) and vocab.encode_target("A man.") == sp.encode("A man.")
        translate_buffer(engine, vocab, lines[:3] + [""], 0, options, Stats())
        assert sorted(map(list, seen)) == sorted([sp.piece_to_id(tag(lang))] + sp.encode(line) for line in lines[:3])


def test_outputs_differ_between_targets(tmp_path, ckpt, lines):
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    outs = {lang: xf("translate", "--path", ckpt, "--input", tmp_path / "in.txt", "--target-lang", lang,
                     "--output-format", "jsonl", "--confidence", "", *FAST).output for lang in ("de", "fr")}
    assert [json.loads(r)["hypotheses"][0]["score"] for r in outs["de"].splitlines()] != \
        [json.loads(r)["hypotheses"][0]["score"] for r in outs["fr"].splitlines()]


def test_split_sentences_starts_every_piece_with_the_tag(ckpt):
    engine, sp, _ = open_engine(TranslateOptions(path=(ckpt,), device="cpu"))
    vocab = source_vocabulary(engine, sp, "fr", ckpt)
    sentences = ["A man in a blue shirt is standing on a ladder cleaning windows.", "A dog runs."]
    units = split_texts([[" ".join(sentences)]], "en", vocab, max_source=8)
    # the sentences over 7 subwords (the tag takes the 8th position) are split: the first one at
    # least, the second too with a vocabulary that cuts its words finer (the generated corpus's)
    too_long = sum(len(sp.encode(s)) > 7 for s in sentences)
    assert too_long >= 1 and units.split_long == too_long and len(units.pieces) > 2
    assert all(p[0] == vocab.tag_id and len(p) <= 8 and vocab.tag_id not in p[1:] for p in units.pieces)


def test_alignments_refer_to_the_users_own_subwords_and_words(tmp_path, ckpt, lines):
    (tmp_path / "in.txt").write_text("\n".join(lines[:6]) + "\n", encoding="utf-8")
    engine, sp, _ = open_engine(TranslateOptions(path=(ckpt,), device="cpu"))
    for level, count in (("subword", lambda line: len(sp.encode(line))), ("word", lambda line: len(line.split()))):
        out = xf("translate", "--path", ckpt, "--input", tmp_path / "in.txt", "--target-lang", "de", "--print-alignment",
                 "--alignment-level", level, "--output-format", "jsonl", *FAST).output.splitlines()
        sources = [s for r in out for s, _ in json.loads(r)["hypotheses"][0]["alignment"]]
        assert min(sources) >= 0 and all(s < count(line) for r, line in zip(out, lines)
                                         for s, _ in json.loads(r)["hypotheses"][0]["alignment"])
        assert max(sources) > 0  # not all shifted onto one position


def test_the_tag_is_never_aligned_to():
    from xformer_cli.model.attention_maps import hard_alignments
    from xformer_cli.model.transformer import build_model
    from xformer_cli.decode.search import Hypothesis

    torch.manual_seed(0)
    model = build_model("tiny", vocab_size=40, d_model=16, d_ff=32, heads=2, max_positions=32).eval()
    src = torch.tensor([[7, 8, 9, 10, 3]])
    hyps = [[Hypothesis([11, 12, 13, 14, 15, 3], 0.0, [])]]
    with torch.no_grad():
        plain = hard_alignments([model], src, hyps)[0][0]
        skipped = hard_alignments([model], src, hyps, skip_first=True)[0][0]
    assert 0 not in skipped and len(skipped) == 5
    assert all(a == b for a, b in zip(plain, skipped) if a != 0)  # only links to the tag move


# -- jsonl: a line's own target -----------------------------------------------------------------------
def test_jsonl_lines_with_their_own_targets_equal_separate_runs(tmp_path, ckpt, lines):
    targets = ["de", "fr", None, "fr", "de", None, "fr"]
    records = [{"source": line, **({"target_lang": t} if t else {})} for line, t in zip(lines, targets)]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    mixed = xf("translate", "--path", ckpt, "--input", tmp_path / "in.jsonl", "--input-format", "jsonl",
               "--target-lang", "fr", *FAST).output.splitlines()
    (tmp_path / "in.txt").write_text("\n".join(lines[:7]) + "\n", encoding="utf-8")
    alone = {lang: xf("translate", "--path", ckpt, "--input", tmp_path / "in.txt", "--target-lang", lang,
                      *FAST).output.splitlines() for lang in ("de", "fr")}
    assert mixed == [alone[t or "fr"][i] for i, t in enumerate(targets)]
    assert mixed != alone["fr"]  # the lines' own targets did something


def test_jsonl_lines_name_their_targets_without_target_lang(tmp_path, ckpt, lines):
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"source": line, "target_lang": "de"}) + "\n"
                                               for line in lines[:3]), encoding="utf-8")
    (tmp_path / "in.txt").write_text("\n".join(lines[:3]) + "\n", encoding="utf-8")
    named = xf("translate", "--path", ckpt, "--input", tmp_path / "in.jsonl", "--input-format", "jsonl", *FAST)
    assert named.output == xf("translate", "--path", ckpt, "--input", tmp_path / "in.txt", "--target-lang", "de",
                              *FAST).output


@pytest.mark.parametrize("records, given, message", [
    ([{"source": "A man."}, {"source": "A dog.", "target_lang": "es"}], ["--target-lang", "de"],
     "in.jsonl: line 2: --target-lang es: "),
    ([{"source": "A man.", "target_lang": "de"}, {"source": "A dog."}], [],
     'm.pt is multilingual (en-de, en-fr): choose the language to translate into with --target-lang (de, fr) '
     '(or give the line a "target_lang")'),
    ([{"source": "A man.", "target_lang": "german"}], [], "in.jsonl: line 1: 'target_lang'"),
    ([{"source": "A man.", "target_lang": 3}], [], "in.jsonl: line 1: 'target_lang' must be a string"),
])
def test_a_jsonl_line_naming_a_language_the_model_lacks_is_one_line(tmp_path, ckpt, records, given, message):
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    line = fails(["translate", "--path", ckpt, "--input", tmp_path / "in.jsonl", "--input-format", "jsonl",
                  "--output", tmp_path / "out.txt", *given, *FAST], message)
    assert f"in.jsonl: line {len(records)}: " in line
    assert not (tmp_path / "out.txt").exists()


# -- refusals -----------------------------------------------------------------------------------------
def test_target_lang_required_refused_and_checked_in_one_line(tmp_path, ckpt, multi30k_dir):
    (tmp_path / "in.txt").write_text("A man.\n", encoding="utf-8")
    run = ["translate", "--input", tmp_path / "in.txt", "--output", tmp_path / "out.txt", *FAST]
    fails([*run, "--path", ckpt], "m.pt is multilingual (en-de, en-fr): choose the language "
          "to translate into with --target-lang (de, fr)")
    fails([*run, "--path", ckpt, "--target-lang", "es"], "--target-lang es: ")
    bilingual = relabelled(ckpt, tmp_path / "bi.pt", pairs=None, source_lang="en", target_lang="de")
    fails([*run, "--path", bilingual, "--target-lang", "fr"], "bi.pt is bilingual and translates into de only")
    untagged = relabelled(ckpt, tmp_path / "untagged.pt", pairs=["en-de", "en-es"])
    fails([*run, "--path", untagged, "--target-lang", "es"], "its vocabulary has no tag >>spa<< for es")
    assert not (tmp_path / "out.txt").exists()
    xf(*run, "--path", bilingual, "--target-lang", "de")  # its own target: a check, in any output format
    assert (tmp_path / "out.txt").read_text(encoding="utf-8").count("\n") == 1


def test_an_ensemble_mixing_bilingual_and_multilingual_models_is_one_line(tmp_path, ckpt):
    (tmp_path / "in.txt").write_text("A man.\n", encoding="utf-8")
    bilingual = relabelled(ckpt, tmp_path / "bi.pt", pairs=None)
    other = relabelled(ckpt, tmp_path / "other.pt", pairs=["en-de"])
    for path, said in ((bilingual, "bi.pt is bilingual but"), (other, "other.pt is multilingual (en-de) but")):
        line = fails(["translate", "--path", ckpt, "--path", path, "--input", tmp_path / "in.txt", "--target-lang",
                      "de", "--output", tmp_path / "out.txt", *FAST], said)
        assert "m.pt is multilingual (en-de, en-fr)" in line
    assert not (tmp_path / "out.txt").exists()
    xf("translate", "--path", ckpt, "--path", ckpt, "--input", tmp_path / "in.txt", "--target-lang", "de", *FAST)


# -- score-pairs and calibrate ------------------------------------------------------------------------
def test_score_pairs_scores_with_the_targets_tag(tmp_path, ckpt, multi30k_dir):
    for side in ("en", "fr"):
        (tmp_path / f"p.{side}").write_text("\n".join((multi30k_dir / f"test2016.{side}").read_text(
            encoding="utf-8").splitlines()[:5]) + "\n", encoding="utf-8")
    run = ["score-pairs", "--path", ckpt, "--source", tmp_path / "p.en", "--target", tmp_path / "p.fr", "--device",
           "cpu", "--threads", "1", "--quiet"]
    fails([*run, "--output", tmp_path / "out.jsonl"], "m.pt is multilingual")
    assert not (tmp_path / "out.jsonl").exists()
    scores = {lang: [json.loads(r) for r in xf(*run, "--target-lang", lang).output.splitlines()] for lang in ("de", "fr")}
    assert [r["tokens"] for r in scores["de"]] == [r["tokens"] for r in scores["fr"]]  # the target: untagged
    assert [r["score"] for r in scores["de"]] != [r["score"] for r in scores["fr"]]
    fails([*run, "--target-lang", "fr", "--reverse-path", ckpt], "--reverse-path")


def test_calibrate_needs_the_target_of_a_multilingual_model(tmp_path, ckpt, multi30k_dir):
    for side in ("en", "fr"):
        (tmp_path / f"v.{side}").write_text("\n".join((multi30k_dir / f"val.{side}").read_text(
            encoding="utf-8").splitlines()[:20]) + "\n", encoding="utf-8")
    run = ["calibrate", "--path", ckpt, "--source", tmp_path / "v.en", "--reference", tmp_path / "v.fr", "--output",
           tmp_path / "c.json", "--device", "cpu", "--threads", "1", "--max-len-a", "0", "--max-len-b", "4"]
    fails(run, "m.pt is multilingual")
    assert not (tmp_path / "c.json").exists()
    result = runner.invoke(app, [str(a) for a in [*run, "--target-lang", "fr"]])
    # past the target: a random model's equal outputs give no chrF above and below the median to fit
    assert "multilingual" not in result.output and "--target-lang" not in result.output, result.output


# -- exports that translate one direction without a tag step -------------------------------------------
@pytest.mark.parametrize("fmt, runtime", [("marian", "Marian's decoder"), ("argos", "an Argos package"), ("bergamot", "Bergamot")])
def test_exports_without_a_tag_step_refuse_a_multilingual_model(tmp_path, ckpt, fmt, runtime, monkeypatch):
    if fmt == "argos":
        pytest.importorskip("argostranslate", reason="the argos extra is not installed")
    if fmt == "bergamot":  # its engine package is looked for first; the refusal comes before it is used
        import xformer_cli.formats.bergamot as bergamot

        monkeypatch.setattr(bergamot, "engine_package", lambda path: Path(path))
    out = tmp_path / ("m.argosmodel" if fmt == "argos" else "out")
    line = fails(["export", fmt, "--path", ckpt, "--output", out], f"m.pt: multilingual (en-de, en-fr) and {runtime}")
    assert "ctranslate2 or huggingface" in line
    assert not out.exists()
