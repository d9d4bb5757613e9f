"""Exports of a multilingual model translate as xf does, target by target: CTranslate2 (the pairs
in xf.json, xf translate --engine ctranslate2 --target-lang puts the tag first) and Hugging Face
(the tags are pieces of vocab.json, so MarianTokenizer encodes ">>fra<< A man." as xf's tagged
ids and generate() translates as xf translate --target-lang fr; xf import reads the pairs back).

Parity needs outputs that end before the length limit (there transformers gives the forced eos
log-probability 0, xf the model's own): the slow tests use conftest's trained en-de model made
multilingual (``tagged_copy``: two tags, each embedded as a different piece), which ends its
sentences; the fast ones a random model, whose outputs run to the limit."""

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from xformer_cli.model.checkpoint import load_checkpoint, load_models, make_checkpoint, model_from_checkpoint, save_checkpoint
from xformer_cli.cli import app
from xformer_cli.text.languages import tag, vocabulary_for
from xformer_cli.model.transformer import Transformer
from xformer_cli.text.vocab import EOS_ID

from helpers import multilingual_checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py: torch on one thread (tiny models)
runner = CliRunner()
TARGETS = ("de", "fr")
LIMIT = 40  # output subwords before eos: xf's --max-len-b, transformers' max_length LIMIT + 2


class _Lazy:
    """A module imported on first use (transformers takes seconds; the fast tests never need it)."""

    def __init__(self, name: str, reason: str):
        self.name, self.reason = name, reason

    def __getattr__(self, attr):
        return getattr(pytest.importorskip(self.name, reason=self.reason), attr)


transformers = _Lazy("transformers", "the hf extra is not installed")


def xf(*args):
    result = runner.invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    return result


@pytest.fixture(scope="module")
def lines(multi30k_dir):
    return (multi30k_dir / "test2016.en").read_text(encoding="utf-8").splitlines()[:20]


@pytest.fixture(scope="module")
def random_ml(multi30k_dir, tmp_path_factory):
    return multilingual_checkpoint(tmp_path_factory.mktemp("ml") / "m.pt", multi30k_dir)


def tagged_copy(trained: Path, path: Path) -> str:
    """A trained bilingual checkpoint made multilingual (en-de, en-fr): the tags appended to its
    vocabulary as control symbols, each embedded as half of a different piece's embedding (so the
    two targets translate differently, and the tags are unlikely outputs), the pairs in its meta."""
    from sentencepiece import sentencepiece_model_pb2 as pb

    ckpt = load_checkpoint(trained)
    proto = pb.ModelProto()
    proto.ParseFromString(ckpt["spm_model"])
    for lang in TARGETS:
        piece = proto.pieces.add()
        piece.piece, piece.score, piece.type = tag(lang), 0.0, pb.ModelProto.SentencePiece.CONTROL
    model = model_from_checkpoint(ckpt, trained)
    size = model.cfg.vocab_size
    state = {k: torch.cat([v, 0.5 * v[[10, 20]]]) if v.dim() and v.size(0) == size else v
             for k, v in model.state_dict().items()}
    tagged = Transformer(dataclasses.replace(model.cfg, vocab_size=size + len(TARGETS)))
    tagged.load_state_dict(state)
    meta = {"epoch": 1, "num_updates": 1, "end_of_epoch": True, "source_lang": "src", "target_lang": "tgt",
            "pairs": [f"en-{t}" for t in TARGETS]}
    save_checkpoint(path, make_checkpoint(tagged, proto.SerializeToString(), meta=meta))
    return str(path)


@pytest.fixture(scope="module")
def trained_ml(trained_tiny, tmp_path_factory):
    return tagged_copy(trained_tiny, tmp_path_factory.mktemp("tagged") / "m.pt")


def translations(tmp_path, path, lines, lang, *options):
    """xf translate's jsonl records of ``lines`` into ``lang``: beam 4, fp32."""
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = xf("translate", "--path", path, "--input", tmp_path / "in.txt", "--target-lang", lang, "--output-format",
             "jsonl", "--beam-size", 4, "--precision", "fp32", "--device", "cpu", "--threads", 1, "--quiet",
             *options).output
    return [json.loads(r)["hypotheses"][0] for r in out.splitlines()]


# -- CTranslate2 ----------------------------------------------------------------------------------------
def ctranslate2_parity(tmp_path, ckpt, lines, *options) -> dict:
    pytest.importorskip("ctranslate2", reason="the ctranslate2 extra is not installed")
    xf("export", "ctranslate2", "--path", ckpt, "--output", tmp_path / "ct2")
    info = json.loads((tmp_path / "ct2" / "xf.json").read_text(encoding="utf-8"))
    assert info["languages"]["pairs"] == ["en-de", "en-fr"]
    found = {}
    for lang in TARGETS:
        mine = [h["text"] for h in translations(tmp_path, ckpt, lines, lang, *options)]
        theirs = [h["text"] for h in translations(tmp_path, tmp_path / "ct2", lines, lang, "--engine", "ctranslate2",
                                                  *options)]
        assert sum(a == b for a, b in zip(mine, theirs)) >= len(lines) - 1, (lang, mine, theirs)
        found[lang] = mine
    return found


def test_ctranslate2_export_translates_each_target_as_xf(tmp_path, random_ml, lines):
    found = ctranslate2_parity(tmp_path, random_ml, lines, "--max-len-a", 0, "--max-len-b", 8)
    assert len(found["de"]) == len(lines)
    fails = runner.invoke(app, ["translate", "--engine", "ctranslate2", "--path", str(tmp_path / "ct2"), "--input",
                                str(tmp_path / "in.txt")])
    assert fails.exit_code != 0 and "multilingual (en-de, en-fr): choose the language" in fails.output


@pytest.mark.slow  # conftest's trained model (a minute, once a session)
def test_ctranslate2_export_of_a_trained_multilingual_model(tmp_path, trained_ml, lines):
    found = ctranslate2_parity(tmp_path, trained_ml, lines, "--max-len-a", 0, "--max-len-b", LIMIT)
    assert found["de"] != found["fr"] and len(set(found["de"])) > 10


# -- Hugging Face ---------------------------------------------------------------------------------------
@pytest.mark.slow  # imports transformers (seconds)
def test_marian_tokenizer_encodes_the_tag_as_xf(tmp_path, random_ml, lines):
    xf("export", "huggingface", "--path", random_ml, "--output", tmp_path / "hf")
    tokenizer = transformers.MarianTokenizer.from_pretrained(str(tmp_path / "hf"))
    assert tokenizer.supported_language_codes == [tag(t) for t in TARGETS]
    _, sp, meta = load_models([random_ml], torch.device("cpu"))
    for lang in TARGETS:
        vocab = vocabulary_for(sp, meta, lang)
        for line in lines[:5] + ["A man."]:
            assert tokenizer(f"{tag(lang)} {line}")["input_ids"] == vocab.encode(line) + [EOS_ID]
    card = (tmp_path / "hf" / "README.md").read_text(encoding="utf-8")
    assert "target language(s): de fr" in card and "`>>deu<<`, `>>fra<<`" in card and "- fr\n" in card
    assert json.loads((tmp_path / "hf" / "tokenizer_config.json").read_text())["target_lang"] == "de+fr"


def generated(model_dir: Path, lines: list[str], lang: str) -> list[list[int]]:
    """transformers' translations (ids, without the decoder start and eos) of ">>tag<< line"."""
    tokenizer = transformers.MarianTokenizer.from_pretrained(str(model_dir))
    model = transformers.MarianMTModel.from_pretrained(str(model_dir)).eval()
    batch = tokenizer([f"{tag(lang)} {line}" for line in lines], return_tensors="pt", padding=True)
    with torch.no_grad():
        rows = model.generate(**batch, num_beams=4, length_penalty=1.0, max_length=LIMIT + 2).tolist()
    return [row[1:][: row[1:].index(EOS_ID)] if EOS_ID in row[1:] else row[1:] for row in rows]


@pytest.mark.slow  # conftest's trained model, transformers' generate
def test_generate_translates_each_target_as_xf_translate(tmp_path, trained_ml, lines):
    xf("export", "huggingface", "--path", trained_ml, "--output", tmp_path / "hf", "--lenpen", 1.0)
    _, sp, _ = load_models([trained_ml], torch.device("cpu"))
    texts = {}
    for lang in TARGETS:
        mine = translations(tmp_path, trained_ml, lines, lang, "--lenpen", 1.0, "--lenpen-style", "length",
                            "--max-len-a", 0, "--max-len-b", LIMIT)
        theirs = generated(tmp_path / "hf", lines, lang)
        ids = [[sp.piece_to_id(p) for p in h["tokens"][:-1]] for h in mine]
        free = [i for i, (a, b) in enumerate(zip(ids, theirs)) if len(a) < LIMIT and len(b) < LIMIT]
        assert len(free) >= 15 and sum(ids[i] == theirs[i] for i in free) == len(free), (lang, len(free), ids, theirs)
        texts[lang] = [h["text"] for h in mine]
    assert texts["de"] != texts["fr"]


@pytest.mark.slow  # imports transformers (seconds)
def test_import_of_the_export_keeps_the_pairs(tmp_path, random_ml, lines):
    xf("export", "huggingface", "--path", random_ml, "--output", tmp_path / "hf")
    result = xf("import", "huggingface", tmp_path / "hf", "--output", tmp_path / "back.pt")
    assert "en-de, en-fr" in result.output
    assert load_checkpoint(tmp_path / "back.pt")["meta"]["pairs"] == ["en-de", "en-fr"]
    options = ("--max-len-a", 0, "--max-len-b", 8)
    for lang in TARGETS:
        assert [h["tokens"] for h in translations(tmp_path, tmp_path / "back.pt", lines, lang, *options)] == \
            [h["tokens"] for h in translations(tmp_path, random_ml, lines, lang, *options)]
