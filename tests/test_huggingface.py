"""xf export huggingface / xf import huggingface: MarianMT directories that transformers loads,
with teacher-forced log-probabilities equal to xf's (fp32, 1e-4) and the same beam search
translations; imports of MarianMT models built here (odd special ids, separate sentencepiece
models); the xf -> HF -> xf round trip bit for bit; one-line refusals of bad input."""

import functools
import json
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

from xformer_cli.model.checkpoint import load_checkpoint, load_ensemble, make_checkpoint, save_checkpoint
from xformer_cli.cli import app
from xformer_cli.data.batching import collate_source
from xformer_cli.commands.export import export_huggingface
from xformer_cli.base.errors import XfError
from xformer_cli.formats.huggingface import MAX_LENGTH, config_from_marian, residual_permutation
from xformer_cli.model.transformer import build_model, sinusoidal_positions
from xformer_cli.settings.options import DecodingOptions, ExportOptions
from xformer_cli.decode.search import beam_search
from xformer_cli.text.vocab import BOS_ID, EOS_ID

from helpers import MARIAN_CONFIG, cli_fails, random_checkpoint

class _Transformers:
    """transformers, imported on first use (its import takes seconds; the fast tests never need it)."""

    def __getattr__(self, name):
        return getattr(pytest.importorskip("transformers", reason="the hf extra is not installed"), name)


transformers = _Transformers()
runner = CliRunner()
pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py: torch on one thread (tiny models; a loaded machine)


@pytest.fixture(scope="module")
def pairs(multi30k_dir):
    src = (multi30k_dir / "test2016.en").read_text(encoding="utf-8").splitlines()
    tgt = (multi30k_dir / "test2016.de").read_text(encoding="utf-8").splitlines()
    return src[:100], tgt[:100]


def export(ckpt, out, **kw):
    return export_huggingface(ExportOptions(format="huggingface", path=str(ckpt), output=str(out), **kw))


@functools.lru_cache(maxsize=2)
def xf_model(ckpt):
    return load_ensemble([ckpt], torch.device("cpu"))[0][0]


def xf_log_probs(ckpt, src_ids, tgt_ids):
    """xf's teacher-forced log p (T+1, V) of each target position, eos included."""
    model = xf_model(str(ckpt))
    with torch.no_grad():
        return F.log_softmax(model(collate_source([src_ids]), torch.tensor([[BOS_ID] + tgt_ids])).float(), dim=-1)[0]


def hf_log_probs(hf, src_ids, tgt_ids, start):
    with torch.no_grad():
        logits = hf(input_ids=torch.tensor([src_ids + [hf.config.eos_token_id]]),
                    decoder_input_ids=torch.tensor([[start] + tgt_ids])).logits
    return F.log_softmax(logits.float(), dim=-1)[0]


@pytest.mark.slow  # imports transformers (seconds)
def test_residual_permutation_turns_xf_sinusoids_into_marians():
    marian = pytest.importorskip("transformers.models.marian.modeling_marian")
    theirs = marian.MarianSinusoidalPositionalEmbedding(50, 16).create_weight()
    assert torch.allclose(sinusoidal_positions(50, 16)[:, residual_permutation(16)], theirs, atol=1e-6)


VARIANTS = {
    "paper": dict(),  # post-LN, ReLU, scaled embeddings, three-way tying
    "gelu-decoder-tied-unscaled": dict(activation="gelu", share_embeddings="decoder", scale_embedding=False),
    "swish-untied-bias": dict(activation="swish", share_embeddings="none", output_bias=True),
    "relu-bias-1x3": dict(output_bias=True, encoder_layers=1, decoder_layers=3),
}


@pytest.mark.slow  # builds MarianMT models with transformers (seconds)
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_export_loads_in_transformers_with_equal_log_probs(tmp_path, spm_model, pairs, variant):
    ckpt = random_checkpoint(tmp_path / "m.pt", spm_model, **VARIANTS[variant])
    out = export(ckpt, tmp_path / "hf")
    hf, info = transformers.MarianMTModel.from_pretrained(str(out), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    tok = transformers.MarianTokenizer.from_pretrained(str(out))
    sp = load_ensemble([ckpt], torch.device("cpu"))[1]
    worst = 0.0
    for src, tgt in zip(pairs[0][:5], pairs[1][:5]):
        assert tok(src)["input_ids"] == sp.encode(src) + [EOS_ID]  # the tokenizer cuts as xf does
        src_ids, tgt_ids = sp.encode(src), sp.encode(tgt)
        mine, theirs = xf_log_probs(ckpt, src_ids, tgt_ids), hf_log_probs(hf.eval(), src_ids, tgt_ids, BOS_ID)
        worst = max(worst, (mine - theirs).abs().max().item())
    assert worst < 1e-4, worst
    config = json.loads((out / "generation_config.json").read_text())
    assert config["num_beams"] == 4 and config["decoder_start_token_id"] == BOS_ID


# -- generate()'s length bound ---------------------------------------------------------------------
def never_ending_checkpoint(path, spm_model, **overrides) -> str:
    """A tiny model with 1024 positions whose eos logit is held down: it never ends its output,
    as a model that repeats itself does not."""
    torch.manual_seed(0)
    model = build_model("tiny", vocab_size=200, d_model=32, d_ff=64, heads=4, output_bias=True, **overrides)
    with torch.no_grad():
        model.output_bias[EOS_ID] = -100.0
    save_checkpoint(path, make_checkpoint(model, spm_model))
    return str(path)


def test_generation_config_bounds_the_length_as_opus_mt_models_do(tmp_path, spm_model):
    """max_length was the model's max_positions (1024): generate() on a model that repeats itself
    ran to 1024 ids. Now MarianMT's usual 512 (OPUS-MT's), the positions when fewer, --max-length
    when given; the summary says which."""
    ckpt = never_ending_checkpoint(tmp_path / "m.pt", spm_model)
    assert load_checkpoint(ckpt)["model_config"]["max_positions"] == 1024 > MAX_LENGTH == 512
    result = xf("export", "huggingface", "--path", ckpt, "--output", tmp_path / "hf")
    assert json.loads((tmp_path / "hf" / "generation_config.json").read_text())["max_length"] == 512
    assert "max_length 512" in result.output
    short = never_ending_checkpoint(tmp_path / "short.pt", spm_model, max_positions=100)
    export(short, tmp_path / "short")
    assert json.loads((tmp_path / "short" / "generation_config.json").read_text())["max_length"] == 100
    export(ckpt, tmp_path / "given", max_length=40)
    assert json.loads((tmp_path / "given" / "generation_config.json").read_text())["max_length"] == 40
    assert "max_length 40" in (tmp_path / "given" / "README.md").read_text(encoding="utf-8")


@pytest.mark.slow  # imports transformers and decodes 512 steps (seconds)
def test_generate_on_the_export_stops_at_its_max_length(tmp_path, spm_model):
    ckpt = never_ending_checkpoint(tmp_path / "m.pt", spm_model)
    export(ckpt, tmp_path / "hf")
    hf = transformers.MarianMTModel.from_pretrained(str(tmp_path / "hf")).eval()
    with torch.no_grad():  # generate's settings are generation_config.json's (beam 4)
        generated = hf.generate(input_ids=torch.tensor([[5, 6, 7, EOS_ID]]))
    assert generated.shape == (1, MAX_LENGTH)  # decoder start, 510 subwords, the forced eos


# -- a small trained model: the same beam search translations -----------------------------------
@pytest.fixture(scope="module")
def exported(trained_tiny, tmp_path_factory):
    """conftest's trained model (relu, shared embeddings) exported with --lenpen 1.0."""
    out = tmp_path_factory.mktemp("hf") / "hf"
    xf("export", "huggingface", "--path", trained_tiny, "--output", out, "--lenpen", 1.0)
    return out


def xf(*args, input=None):
    result = runner.invoke(app, [str(a) for a in args], input=input)
    assert result.exit_code == 0, result.output
    return result


def xf_translations(ckpt, sources, lenpen):
    models, sp = load_ensemble([str(ckpt)], torch.device("cpu"))
    options = DecodingOptions(beam_size=4, lenpen=lenpen, lenpen_style="length", max_len_a=0.0, max_len_b=LIMIT)
    ids = [sp.encode(s) for s in sources]
    return [hyps[0].tokens[:-1] for hyps in beam_search(models, collate_source(ids), options)], ids


def hf_translations(model_dir, src_ids, lenpen):
    hf = transformers.MarianMTModel.from_pretrained(str(model_dir)).eval()
    eos = hf.config.eos_token_id
    out = []
    for i in range(0, len(src_ids), 25):
        batch = [ids + [eos] for ids in src_ids[i : i + 25]]
        width = max(map(len, batch))
        pad = hf.config.pad_token_id
        input_ids = torch.tensor([ids + [pad] * (width - len(ids)) for ids in batch])
        with torch.no_grad():
            generated = hf.generate(input_ids=input_ids, attention_mask=input_ids.ne(pad), num_beams=4,
                                    length_penalty=lenpen, max_length=LIMIT + 2)
        for row in generated.tolist():
            row = row[1:]  # the decoder start
            out.append(row[: row.index(eos)] if eos in row else row)
    return out


LIMIT = 60  # output subwords before eos: xf's --max-len-b, transformers' max_length 62 less start and eos


def agreement(mine: list, theirs: list, lengths: list[tuple[int, int]]) -> tuple[int, int, int]:
    """(same outputs, outputs that reach neither engine's length limit, same among those).

    At the limit the two differ by design: transformers' forced eos is given log-probability 0,
    xf scores it with the model's own, so a hypothesis cut there ranks differently."""
    free = [i for i, (a, b) in enumerate(lengths) if a < LIMIT and b < LIMIT]
    return sum(a == b for a, b in zip(mine, theirs)), len(free), sum(mine[i] == theirs[i] for i in free)


@pytest.mark.slow
def test_trained_model_exports_with_the_same_translations(trained_tiny, exported, pairs):
    ckpt, out = trained_tiny, exported
    mine, src_ids = xf_translations(ckpt, pairs[0], 1.0)
    theirs = hf_translations(out, src_ids, 1.0)
    same, free, same_free = agreement(mine, theirs, [(len(a), len(b)) for a, b in zip(mine, theirs)])
    assert same >= 95 and free >= 90 and same_free >= 0.99 * free, (same, free, same_free)
    assert len({tuple(t) for t in mine}) > 50  # a model that translates, not one that repeats a line
    tok = transformers.MarianTokenizer.from_pretrained(str(out))
    sp = load_ensemble([str(ckpt)], torch.device("cpu"))[1]
    assert tok.decode(theirs[0], skip_special_tokens=True) == sp.decode(mine[0])


# -- refusals ------------------------------------------------------------------------------------
fails = cli_fails  # one error line holding the message (helpers.cli_fails)


@pytest.mark.parametrize("variant, option", [
    (dict(normalize_before=True), "--normalize-before"), (dict(positions="learned"), "--positions learned"),
    (dict(positions="rope"), "--positions rope"), (dict(activation="swiglu"), "--activation swiglu"),
    (dict(sinusoids="tensor2tensor"), "--sinusoids tensor2tensor cannot be exported to MarianMT"),
    (dict(decoder_start="zero"), "--decoder-start zero cannot be exported to MarianMT"),
])
def test_export_refuses_what_marian_cannot_compute(tmp_path, spm_model, variant, option):
    ckpt = random_checkpoint(tmp_path / "m.pt", spm_model, **variant)
    fails(["export", "huggingface", "--path", ckpt, "--output", tmp_path / "hf"], option)
    assert not (tmp_path / "hf").exists() and [p.name for p in tmp_path.iterdir()] == ["m.pt"]


def test_export_refuses_an_occupied_output(tmp_path, spm_model):
    ckpt = random_checkpoint(tmp_path / "m.pt", spm_model)
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "x").write_text("x")
    fails(["export", "huggingface", "--path", ckpt, "--output", tmp_path / "hf"], "exists and is not empty")


def test_model_card_has_the_test_bleu_and_its_signature(tmp_path, spm_model, pairs):
    ckpt = random_checkpoint(tmp_path / "m.pt", spm_model)
    (tmp_path / "ref.de").write_text("\n".join(pairs[1][:20]) + "\n", encoding="utf-8")
    (tmp_path / "hyp.de").write_text("\n".join(pairs[1][1:21]) + "\n", encoding="utf-8")
    scored = xf("score", "--ref", tmp_path / "ref.de", "--hyp", tmp_path / "hyp.de", "--metrics", "bleu", "--json")
    (tmp_path / "score.json").write_text(scored.stdout, encoding="utf-8")
    bleu = json.loads(scored.stdout)["bleu"]
    export(ckpt, tmp_path / "hf", bleu=str(tmp_path / "score.json"), source_lang="en", target_lang="de")
    card = (tmp_path / "hf" / "README.md").read_text(encoding="utf-8")
    assert f"**{bleu['score']:.2f}**" in card and bleu["signature"] in card and "| d_model / d_ff / heads | 32 / 64 / 4 |" in card
    (tmp_path / "bad.json").write_text("{}", encoding="utf-8")
    fails(["export", "huggingface", "--path", ckpt, "--output", tmp_path / "hf2", "--bleu", tmp_path / "bad.json"],
          "bad.json: not the output of xf score --json with BLEU")
    assert not (tmp_path / "hf2").exists()


# -- import: MarianMT models built here, OPUS-MT's layout ---------------------------------------
def learn_unigram(lines, vocab_size) -> bytes:
    """A sentencepiece model with sentencepiece's default ids (unk 0, bos 1, eos 2), as OPUS-MT's."""
    import io

    import sentencepiece as spm

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=model, vocab_size=vocab_size,
                                   model_type="unigram", character_coverage=1.0, minloglevel=2)
    return model.getvalue()


def write_tokenizer(out, source_spm: bytes, target_spm: bytes, pieces: list[str], pad="<pad>"):
    (out / "source.spm").write_bytes(source_spm)
    (out / "target.spm").write_bytes(target_spm)
    (out / "vocab.json").write_text(json.dumps({p: i for i, p in enumerate(pieces)}), encoding="utf-8")
    (out / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "MarianTokenizer", "unk_token": "<unk>", "eos_token": "</s>", "pad_token": pad,
         "source_lang": "en", "target_lang": "de", "model_max_length": 128, "separate_vocabs": False}))


@pytest.fixture(scope="module")
def opus_spms(multi30k_dir):
    """Separate source and target sentencepiece models, and OPUS-MT's vocab.json over both: eos 0,
    unk 1, the pieces of both models, pad last (also the decoder start)."""
    import sentencepiece as spm

    models = [learn_unigram((multi30k_dir / f"train.{lang}").read_text(encoding="utf-8").splitlines()[:500], 150)
              for lang in ("en", "de")]
    pieces = ["</s>", "<unk>"]
    for model in models:
        sp = spm.SentencePieceProcessor(model_proto=model)
        pieces += [sp.id_to_piece(i) for i in range(sp.get_piece_size())
                   if not (sp.is_control(i) or sp.is_unknown(i)) and sp.id_to_piece(i) not in pieces]
    return models[0], models[1], pieces + ["<pad>"]


def marian_directory(out, opus_spms, seed=0, **config):
    """A random MarianMTModel in OPUS-MT's layout, saved as transformers saves it."""
    source_spm, target_spm, pieces = opus_spms
    size = len(pieces)
    values = dict(vocab_size=size, decoder_vocab_size=size, d_model=32, encoder_layers=2, decoder_layers=2,
                  encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
                  max_position_embeddings=128, pad_token_id=size - 1, eos_token_id=0, forced_eos_token_id=0,
                  decoder_start_token_id=size - 1, bos_token_id=None, activation_function="swish",
                  scale_embedding=False)
    torch.manual_seed(seed)
    model = transformers.MarianMTModel(transformers.MarianConfig(**{**values, **config})).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "embed_positions" in name:  # the static sinusoids, not saved: transformers recomputes them
                continue
            if "norm" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
            else:
                p.mul_(5.0)  # transformers' init (std 0.02) leaves every distribution almost flat
        model.final_logits_bias.copy_(torch.randn_like(model.final_logits_bias))
    model.save_pretrained(str(out))
    write_tokenizer(out, source_spm, target_spm, pieces)
    return model


MARIAN_VARIANTS = {
    "opus-swish-shared-unscaled": dict(),
    "gelu-decoder-tied-scaled": dict(activation_function="gelu", scale_embedding=True,
                                     share_encoder_decoder_embeddings=False),
    "relu-untied-1x3": dict(activation_function="relu", share_encoder_decoder_embeddings=False,
                            tie_word_embeddings=False, encoder_layers=1, decoder_layers=3),
}


@pytest.mark.slow  # builds MarianMT models with transformers (seconds)
@pytest.mark.parametrize("variant", list(MARIAN_VARIANTS))
def test_import_translates_as_the_marian_model(tmp_path, opus_spms, pairs, variant):
    hf = marian_directory(tmp_path / "hf", opus_spms, **MARIAN_VARIANTS[variant])
    xf("import", "huggingface", tmp_path / "hf", "--output", tmp_path / "m.pt")
    tok = transformers.MarianTokenizer.from_pretrained(str(tmp_path / "hf"))
    vocab = json.loads((tmp_path / "hf" / "vocab.json").read_text())
    (model,), sp = load_ensemble([str(tmp_path / "m.pt")], torch.device("cpu"))
    assert sp.get_piece_size() == len(vocab) + 1  # xf's pad is a new row: OPUS-MT's pad is its decoder start
    to_hf = torch.tensor([vocab[sp.id_to_piece(i)] for i in range(1, sp.get_piece_size())])
    worst = 0.0
    for src, tgt in zip(pairs[0][:5], pairs[1][:5]):
        src_ids, tgt_ids = sp.encode(src), sp.encode_target(tgt)
        assert to_hf[torch.tensor(src_ids) - 1].tolist() + [0] == tok(src)["input_ids"]
        assert to_hf[torch.tensor(tgt_ids) - 1].tolist() + [0] == tok(text_target=tgt)["input_ids"]
        mine = xf_log_probs(str(tmp_path / "m.pt"), src_ids, tgt_ids)[:, 1:]  # without xf's pad
        theirs = hf_log_probs(hf, to_hf[torch.tensor(src_ids) - 1].tolist(), to_hf[torch.tensor(tgt_ids) - 1].tolist(),
                              len(vocab) - 1)[:, to_hf]
        worst = max(worst, (mine - theirs).abs().max().item())
    assert worst < 1e-4, worst
    assert sp.decode(sp.encode_target(pairs[1][0])) == tok.decode(tok(text_target=pairs[1][0])["input_ids"],
                                                                   skip_special_tokens=True)


# -- the round trip, and OPUS-MT's layout on a trained model ----------------------------------------
@pytest.mark.slow
def test_round_trip_is_bit_identical(tmp_path, trained_tiny, exported, pairs):
    ckpt = trained_tiny
    xf("import", "huggingface", exported, "--output", tmp_path / "back.pt")
    a, b = load_checkpoint(ckpt), load_checkpoint(tmp_path / "back.pt")
    assert a["spm_model"] == b["spm_model"] and a["model_config"] == b["model_config"]
    assert a["model"].keys() == b["model"].keys()
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    lines = "\n".join(pairs[0][:20]) + "\n"
    assert xf("translate", "--path", ckpt, "--quiet", input=lines).stdout == \
        xf("translate", "--path", tmp_path / "back.pt", "--quiet", input=lines).stdout


def opus_layout(hf_dir, out):
    """The MarianMT directory that xf exported, rewritten in OPUS-MT's layout: eos 0, unk 1, the other
    pieces, then bos as pad and decoder start (last id); xf's pad row dropped."""
    from safetensors.torch import load_file, save_file

    config = json.loads((hf_dir / "config.json").read_text())
    vocab = json.loads((hf_dir / "vocab.json").read_text())
    pieces = sorted(vocab, key=vocab.get)
    order = [EOS_ID, 1] + list(range(4, len(pieces))) + [BOS_ID]  # new id -> xf id
    tensors = {k: (v[..., order] if k == "final_logits_bias" else v[order] if "embed_tokens" in k or "shared" in k
                   or k == "lm_head.weight" else v) for k, v in load_file(str(hf_dir / "model.safetensors")).items()}
    out.mkdir()
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / "model.safetensors"), metadata={"format": "pt"})
    size = len(order)
    config.update(vocab_size=size, decoder_vocab_size=size, pad_token_id=size - 1, decoder_start_token_id=size - 1,
                  eos_token_id=0, forced_eos_token_id=0, bos_token_id=None)
    (out / "config.json").write_text(json.dumps(config))
    spm_bytes = (hf_dir / "source.spm").read_bytes()
    write_tokenizer(out, spm_bytes, spm_bytes, [pieces[i] for i in order[:-1]] + ["<pad>"], pad="<pad>")


@pytest.fixture(scope="module")
def opus_import(exported, tmp_path_factory):
    """The trained model in OPUS-MT's layout (a MarianMT directory) and its import (an xf checkpoint)."""
    tmp = tmp_path_factory.mktemp("opus")
    opus_layout(exported, tmp / "opus")
    xf("import", "huggingface", tmp / "opus", "--output", tmp / "m.pt")
    return tmp


@pytest.mark.slow
def test_imported_opus_layout_translates_as_transformers(opus_import, pairs):
    tokens, _ = xf_translations(opus_import / "m.pt", pairs[0], 1.0)
    sp = load_ensemble([str(opus_import / "m.pt")], torch.device("cpu"))[1]
    mine = [sp.decode(t) for t in tokens]
    tok = transformers.MarianTokenizer.from_pretrained(str(opus_import / "opus"))
    hf = transformers.MarianMTModel.from_pretrained(str(opus_import / "opus")).eval()
    theirs, their_lengths = [], []
    for i in range(0, 100, 25):  # MarianTokenizer's ids, padded by it, as a user runs it
        batch = tok(pairs[0][i : i + 25], return_tensors="pt", padding=True)
        with torch.no_grad():
            generated = hf.generate(**batch, num_beams=4, length_penalty=1.0, max_length=LIMIT + 2,
                                    early_stopping=True, bad_words_ids=[[hf.config.pad_token_id]])
        theirs += tok.batch_decode(generated, skip_special_tokens=True)
        their_lengths += [row[1:].index(0) if 0 in row[1:] else LIMIT + 1 for row in generated.tolist()]
    same, free, same_free = agreement(mine, theirs, [(len(t), n) for t, n in zip(tokens, their_lengths)])
    assert same >= 95 and free >= 90 and same_free >= 0.99 * free, (same, free, same_free)
    assert len(set(mine)) > 50


# -- imported models in every xf command; today's checkpoints upgrade ---------------------------
@pytest.mark.slow  # builds MarianMT models with transformers (seconds)
def test_imported_model_in_translate_average_and_ctranslate2(tmp_path, opus_spms, pairs):
    original = marian_directory(tmp_path / "hf0", opus_spms, seed=0)
    marian_directory(tmp_path / "hf1", opus_spms, seed=1)
    for seed in (0, 1):
        xf("import", "huggingface", tmp_path / f"hf{seed}", "--output", tmp_path / f"m{seed}.pt")
    # back to Hugging Face: its two sentencepiece models and its pieces (xf's layout), the same model
    xf("export", "huggingface", "--path", tmp_path / "m0.pt", "--output", tmp_path / "again")
    assert (tmp_path / "again" / "target.spm").read_bytes() == opus_spms[1]
    again = transformers.MarianMTModel.from_pretrained(str(tmp_path / "again")).eval()
    tok, tok_again = (transformers.MarianTokenizer.from_pretrained(str(tmp_path / d)) for d in ("hf0", "again"))
    vocab, vocab_again = (json.loads((tmp_path / d / "vocab.json").read_text()) for d in ("hf0", "again"))
    to_hf = torch.tensor([vocab[p] for p in sorted(vocab_again, key=vocab_again.get)[1:]])  # xf's new pad apart
    src, tgt = tok_again(pairs[0][0])["input_ids"][:-1], tok_again(text_target=pairs[1][0])["input_ids"][:-1]
    assert (to_hf[torch.tensor(src) - 1].tolist() + [0]) == tok(pairs[0][0])["input_ids"]
    mine = hf_log_probs(again, src, tgt, BOS_ID)[:, 1:]
    theirs = hf_log_probs(original, to_hf[torch.tensor(src) - 1].tolist(), to_hf[torch.tensor(tgt) - 1].tolist(),
                          len(vocab) - 1)[:, to_hf]
    assert (mine - theirs).abs().max() < 1e-4
    lines = "\n".join(pairs[0][:8]) + "\n"
    one = xf("translate", "--path", tmp_path / "m0.pt", "--quiet", "--max-len-a", 0, "--max-len-b", 8,
             input=lines).stdout.splitlines()
    two = xf("translate", "--path", tmp_path / "m0.pt", tmp_path / "m0.pt", "--quiet", "--max-len-a", 0,
             "--max-len-b", 8, input=lines).stdout.splitlines()
    assert len(one) == 8 and one == two  # an ensemble of one model twice is that model
    aligned = xf("translate", "--path", tmp_path / "m0.pt", tmp_path / "m1.pt", "--quiet", "--print-alignment",
                 "--max-len-a", 0, "--max-len-b", 8, input=lines).stdout.splitlines()
    assert len(aligned) == 8 and all(" ||| " in line for line in aligned)
    xf("average-checkpoints", "--inputs", tmp_path / "m0.pt", tmp_path / "m1.pt", "--output", tmp_path / "avg.pt")
    a, b, avg = (load_checkpoint(tmp_path / n)["model"] for n in ("m0.pt", "m1.pt", "avg.pt"))
    key = "encoder_layers.0.ffn.fc1.weight"
    assert torch.allclose(avg[key], (a[key] + b[key]) / 2)
    ct2 = pytest.importorskip("ctranslate2")
    xf("export", "ctranslate2", "--path", tmp_path / "m0.pt", "--output", tmp_path / "ct2")
    sp = load_ensemble([str(tmp_path / "m0.pt")], torch.device("cpu"))[1]
    translator = ct2.Translator(str(tmp_path / "ct2"), device="cpu", compute_type="float32", intra_threads=1)
    for src, tgt in zip(pairs[0][:3], pairs[1][:3]):
        src_ids, tgt_ids = sp.encode(src), sp.encode_target(tgt)
        theirs = translator.score_batch([[sp.id_to_piece(i) for i in src_ids]], [[sp.id_to_piece(i) for i in tgt_ids]])
        mine = xf_log_probs(str(tmp_path / "m0.pt"), src_ids, tgt_ids).gather(1, torch.tensor(tgt_ids + [EOS_ID])[:, None])
        assert torch.allclose(torch.tensor(theirs[0].log_probs), mine.view(-1), atol=1e-4)
    ct2_lines = xf("translate", "--path", tmp_path / "ct2", "--engine", "ctranslate2", "--quiet", "--max-len-a", 0,
                   "--max-len-b", 8, input=lines).stdout.splitlines()
    assert sum(x == y for x, y in zip(one, ct2_lines)) >= 7


@pytest.mark.slow  # over a second (two models built and loaded)
def test_version_1_checkpoints_upgrade(tmp_path, spm_model, pairs):
    ckpt = load_checkpoint(random_checkpoint(tmp_path / "v2.pt", spm_model))
    assert ckpt["version"] == 2 and ckpt["model_config"]["scale_embedding"] is True
    old = {**ckpt, "version": 1, "model_config": {k: v for k, v in ckpt["model_config"].items()
                                                  if k not in ("scale_embedding", "output_bias")}}
    torch.save(old, tmp_path / "v1.pt")  # as xf wrote it before format version 2
    upgraded = load_checkpoint(tmp_path / "v1.pt")
    assert upgraded["version"] == 2 and upgraded["model_config"] == ckpt["model_config"]
    (old_model, new_model), sp = load_ensemble([str(tmp_path / "v1.pt"), str(tmp_path / "v2.pt")], torch.device("cpu"))
    src = collate_source([sp.encode(line) for line in pairs[0][:5]])
    assert torch.equal(old_model(src, src[:, :4]), new_model(src, src[:, :4]))  # the same model


# -- fine-tuning: xf train --init-from, xf preprocess --vocab-from -------------------------------
def valid_nll(ckpt, data_dir) -> float:
    """Per-token nll of checkpoint ``ckpt`` on the valid split of ``data_dir``."""
    from xformer_cli.data.batching import collate
    from xformer_cli.data.dataset import DataDir

    (model,), _ = load_ensemble([str(ckpt)], torch.device("cpu"))
    valid = DataDir.open(data_dir).split("valid")
    batch = collate([valid[i] for i in range(len(valid))])
    with torch.no_grad():
        logits = model(batch["src"], batch["prev_output"])
    return F.cross_entropy(logits.view(-1, logits.size(-1)), batch["target"].view(-1), ignore_index=0).item()


@pytest.mark.slow
def test_fine_tuning_an_imported_model_lowers_its_loss_on_a_new_domain(tmp_path, trained_tiny, opus_import,
                                                                        shared_data):
    imported = opus_import / "m.pt"  # trained on Multi30k captions
    raw = tmp_path / "raw"  # the new domain: news
    raw.mkdir()
    for lang in ("en", "de"):
        lines = (shared_data / "wmt14" / f"newstest2013.en-de.{lang}").read_text(encoding="utf-8").splitlines()
        (raw / f"train.{lang}").write_text("\n".join(lines[:800]) + "\n", encoding="utf-8")
        (raw / f"valid.{lang}").write_text("\n".join(lines[2900:3000]) + "\n", encoding="utf-8")
    xf("preprocess", "--destdir", tmp_path / "data", "--trainpref", raw / "train", "--validpref", raw / "valid",
       "--vocab-from", imported, "--max-len", 60)
    assert (tmp_path / "data" / "spm.model").read_bytes() == load_checkpoint(imported)["spm_model"]
    before = valid_nll(imported, tmp_path / "data")
    xf("train", tmp_path / "data", "--init-from", imported, "--save-dir", tmp_path / "ft", "--max-tokens", 1000,
       "--max-update", 100, "--device", "cpu", "--threads", 1, "--lr-scheduler", "inverse_sqrt", "--lr", 1e-3,
       "--warmup-updates", 10, "--dropout", 0.1, "--save-interval-minutes", 0)
    tuned = load_checkpoint(tmp_path / "ft" / "checkpoint_last.pt")
    assert tuned["meta"]["num_updates"] == 100 and tuned["model_config"]["output_bias"] is True
    after = valid_nll(tmp_path / "ft" / "checkpoint_last.pt", tmp_path / "data")
    assert after < 0.9 * before, (before, after)

    # the model options are the checkpoint's; the data must have its vocabulary
    fails(["train", tmp_path / "data", "--init-from", imported, "--save-dir", tmp_path / "x",
           "--d-model", 128, "--device", "cpu"], "--d-model 128 conflicts with --init-from")
    xf_data = trained_tiny.parent.parent / "data"  # the model's own data, with xf's joint vocabulary
    fails(["train", xf_data, "--init-from", imported, "--save-dir", tmp_path / "x", "--device", "cpu"],
          f"{xf_data}/spm.model: the data's vocabulary is not that of --init-from {imported}")
    assert not (tmp_path / "x").exists()


# -- config.json: every field checked before use ---------------------------------------------------
BAD_FIELDS = {
    "the issue's": (dict(encoder_layers=-1, d_model="x"), 'd_model "x" is not an integer'),
    "negative layers": (dict(encoder_layers=-1), "encoder_layers -1 must be at least 1"),
    "zero heads": (dict(encoder_attention_heads=0, decoder_attention_heads=0), "encoder_attention_heads 0 must be at least 1"),
    "float width": (dict(encoder_ffn_dim=64.5, decoder_ffn_dim=64.5), "encoder_ffn_dim 64.5 is not an integer"),
    "bool size": (dict(vocab_size=True), "vocab_size true is not an integer"),
    "huge positions": (dict(max_position_embeddings=1 << 40), "max_position_embeddings 1099511627776 must be in"),
    # an int past a float's range: OverflowError in Range.problem (found by tests/test_fuzz.py)
    "401 digits": (dict(vocab_size=10**400), "vocab_size 1" + "0" * 400 + " must be at most 2147483647"),
    "missing d_model": (dict(d_model=None), "'d_model' is missing"),
    "string decoder vocabulary": (dict(decoder_vocab_size="200"), 'decoder_vocab_size "200" is not an integer'),
    "dropout above 1": (dict(dropout=1.5), "dropout 1.5 must be in"),
    "string dropout": (dict(attention_dropout="0.1"), 'attention_dropout "0.1" is not a number'),
    "activation a list": (dict(activation_function=["relu"]), 'activation_function ["relu"] is not a string'),
    "flag a string": (dict(scale_embedding="yes"), 'scale_embedding "yes" is not true or false'),
    "pre-LN as 1": (dict(normalize_before=1), "normalize_before 1 is not true or false"),
}


@pytest.mark.parametrize("case", list(BAD_FIELDS))
def test_every_bad_config_field_is_one_line_naming_the_file_and_the_field(case):
    """'encoder_layers': -1, 'd_model': 'x' raised TypeError: not all arguments converted during
    string formatting (d_model % 2 on a string)."""
    changes, message = BAD_FIELDS[case]
    where = Path("opus") / "config.json"
    assert config_from_marian(MARIAN_CONFIG, where).encoder_layers == 2  # the base is good
    with pytest.raises(XfError) as e:
        config_from_marian({**MARIAN_CONFIG, **changes}, where)
    assert str(e.value).startswith(f"{where}: ") and message in str(e.value) and "\n" not in str(e.value)


# -- bad input: one line naming the file, nothing written, no code run ---------------------------
@pytest.fixture(scope="module")
def marian_dir(tmp_path_factory, opus_spms):
    out = tmp_path_factory.mktemp("marian") / "hf"
    marian_directory(out, opus_spms)
    return out


def broken_copy(marian_dir, tmp_path, edit):
    import shutil

    out = tmp_path / "hf"
    shutil.copytree(marian_dir, out)
    edit(out)
    return out


def edit_json(name, **changes):
    def edit(out):
        data = json.loads((out / name).read_text())
        data.update(changes)
        (out / name).write_text(json.dumps(data))
    return edit


def reshape_weight(out):
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(out / "model.safetensors"))
    tensors["model.encoder.layers.0.fc1.weight"] = torch.zeros(65, 32)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})


def poison_weight(value):
    def edit(out):
        from safetensors.torch import load_file, save_file

        tensors = load_file(str(out / "model.safetensors"))
        tensors["model.decoder.layers.1.fc2.weight"][3, 5] = value
        save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return edit


BAD_INPUT = {
    "not-marian": (edit_json("config.json", model_type="bart"), "config.json: not a MarianMT model (model_type 'bart'"),
    "no-config": (lambda out: (out / "config.json").unlink(), "config.json: missing"),
    "no-target-spm": (lambda out: (out / "target.spm").unlink(), "target.spm: missing"),
    "corrupt-spm": (lambda out: (out / "source.spm").write_bytes(b"not a model"), "not a readable sentencepiece model"),
    "vocab-mismatch": (lambda out: (out / "vocab.json").write_text('{"<unk>": 0, "a": 1}'), "vocab.json: its ids are not 0.."),
    "shape": (reshape_weight, "model.encoder.layers.0.fc1.weight has shape (65, 32), config.json says (64, 32)"),
    "no-weights": (lambda out: (out / "model.safetensors").unlink(), "no weights (model.safetensors or pytorch_model.bin)"),
    "separate-vocabularies": (edit_json("config.json", decoder_vocab_size=7), "decoder_vocab_size 7 != vocab_size"),
    "pre-ln": (edit_json("config.json", normalize_before=True), "normalize_before true cannot be represented"),
    "activation": (edit_json("config.json", activation_function="tanh"), "activation_function 'tanh' cannot be represented"),
    "untied-shared": (edit_json("config.json", tie_word_embeddings=False), "tie_word_embeddings false"),
    "unequal-widths": (edit_json("config.json", decoder_ffn_dim=128), "encoder_ffn_dim 64 != decoder_ffn_dim 128"),
    "bad-fields": (edit_json("config.json", encoder_layers=-1, d_model="x"), 'config.json: d_model "x" is not an integer'),
    "config-a-list": (lambda out: (out / "config.json").write_text("[1]"), "config.json: not a JSON object"),
    "eos-an-empty-list": (edit_json("config.json", eos_token_id=[]), "config.json: eos_token_id [] is not an id"),
    "vocab-string-ids": (edit_json("vocab.json", **{"<unk>": "1"}), "vocab.json: its ids are not 0.."),
    "nan-weight": (poison_weight(float("nan")), "model.decoder.layers.1.fc2.weight has 1 value that is not finite"),
    "inf-weight": (poison_weight(float("-inf")), "model.decoder.layers.1.fc2.weight has 1 value that is not finite"),
}


@pytest.mark.slow  # builds MarianMT models with transformers (seconds)
@pytest.mark.parametrize("case", list(BAD_INPUT))
def test_import_refuses_bad_input_in_one_line(tmp_path, marian_dir, case):
    edit, message = BAD_INPUT[case]
    directory = broken_copy(marian_dir, tmp_path, edit)
    fails(["import", "huggingface", directory, "--output", tmp_path / "m.pt"], message)
    assert not (tmp_path / "m.pt").exists() and [p.name for p in tmp_path.iterdir()] == ["hf"]


def test_a_config_json_nested_too_deeply_is_one_line(tmp_path):
    """100,000 nested arrays in config.json: json's parser raised RecursionError (no file named)."""
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text('{"model_type": "marian", "x": ' + "[" * 100_000 + "]" * 100_000 + "}")
    fails(["import", "huggingface", tmp_path / "hf", "--output", tmp_path / "m.pt"],
          f"{tmp_path / 'hf' / 'config.json'}: nests arrays or objects deeper than 64 levels")
    assert not (tmp_path / "m.pt").exists()


@pytest.mark.slow  # builds MarianMT models with transformers (seconds)
def test_import_refuses_a_sentencepiece_model_that_does_not_spell_the_vocabulary(tmp_path, marian_dir, multi30k_dir):
    """A source.spm of another model (here one learned from French): MarianTokenizer made its
    pieces that vocab.json lacks unknown, and the import was accepted."""
    french = learn_unigram((multi30k_dir / "train.fr").read_text(encoding="utf-8").splitlines()[:500], 150)
    directory = broken_copy(marian_dir, tmp_path, lambda out: (out / "source.spm").write_bytes(french))
    line = fails(["import", "huggingface", directory, "--output", tmp_path / "m.pt"], f"{directory / 'source.spm'}: ")
    assert re.search(r": \d+ of its 1\d\d pieces are not in vocab\.json \(first: '.+'\)", line), line
    assert not (tmp_path / "m.pt").exists()


class Payload:
    """A pickle that would create a file when unpickled without weights_only."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


@pytest.mark.slow  # builds MarianMT models with transformers (seconds)
def test_pytorch_model_bin_loads_as_plain_tensors_only(tmp_path, marian_dir):
    from safetensors.torch import load_file

    def to_bin(out):
        torch.save(load_file(str(out / "model.safetensors")), out / "pytorch_model.bin")
        (out / "model.safetensors").unlink()

    directory = broken_copy(marian_dir, tmp_path, to_bin)
    xf("import", "huggingface", directory, "--output", tmp_path / "bin.pt")
    xf("import", "huggingface", marian_dir, "--output", tmp_path / "st.pt")
    a, b = load_checkpoint(tmp_path / "bin.pt")["model"], load_checkpoint(tmp_path / "st.pt")["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    marker = tmp_path / "code-ran"
    torch.save({"model.shared.weight": Payload(marker)}, directory / "pytorch_model.bin")
    fails(["import", "huggingface", directory, "--output", tmp_path / "evil.pt"], "pytorch_model.bin: not loadable as "
          "plain tensors without running code")
    assert not marker.exists() and not (tmp_path / "evil.pt").exists()


@pytest.mark.slow  # starts a server process
def test_xf_serve_runs_an_imported_model(tmp_path, marian_dir, pairs):
    import http.client
    import subprocess
    import sys

    pytest.importorskip("uvicorn", reason="the serve extra is not installed")
    xf("import", "huggingface", marian_dir, "--output", tmp_path / "m.pt")
    decoding = ["--max-len-a", "0", "--max-len-b", "8"]
    expected = xf("translate", "--path", tmp_path / "m.pt", "--quiet", *decoding, input=pairs[0][0] + "\n").stdout
    proc = subprocess.Popen([sys.executable, "-m", "xformer_cli", "serve", "--port", "0", "--model",
                             f"en-de={tmp_path / 'm.pt'}", *decoding, "--threads", "1"],
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    try:
        port = None
        for line in proc.stderr:
            if "listening on http://127.0.0.1:" in line:
                port = int(line.split("127.0.0.1:")[1].split()[0])
                break
        assert port, "xf serve did not start"
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        conn.request("POST", "/translate", body=json.dumps({"q": pairs[0][0], "source": "en", "target": "de"}),
                     headers={"Content-Type": "application/json"})
        answer = json.loads(conn.getresponse().read())
        assert answer["translatedText"] == expected.rstrip("\n")
    finally:
        proc.terminate()
        proc.wait(30)
