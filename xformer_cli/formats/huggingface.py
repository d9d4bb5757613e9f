"""xf models <-> Hugging Face MarianMT directories (``xf export huggingface``, ``xf import huggingface``):
``write_marian`` writes a model and its sentencepiece model as a MarianMT directory's files,
``read_marian`` reads them back; the commands own the options, the output guards and the summaries.

A MarianMT directory holds config.json, the weights (model.safetensors, or a pytorch_model.bin),
the tokenizer (source.spm, target.spm, vocab.json: the pieces of both sentencepiece models in
one id space, tokenizer_config.json) and generation_config.json. What maps to what:

    xf                                      MarianMT
    encoder_embed / decoder_embed           model.shared (share_encoder_decoder_embeddings) or
                                            model.encoder/decoder.embed_tokens
    output_proj (tied or not)               lm_head (tie_word_embeddings)
    output_bias (a fixed buffer)            final_logits_bias
    layers.N.self_attn.in_proj (q, k, v)    layers.N.self_attn.q_proj, k_proj, v_proj
    decoder cross_attn.in_proj              layers.N.encoder_attn.q_proj, k_proj, v_proj
    attn_block/self_block.norm              self_attn_layer_norm
    cross_block.norm                        encoder_attn_layer_norm
    ffn.fc1, ffn.fc2, ffn_block.norm        fc1, fc2, final_layer_norm
    scale_embedding, activation             scale_embedding, activation_function (relu, gelu, swish)

Two things differ and are mapped exactly. (1) Positions: MarianMT's static sinusoids put every
sine in the first half of the model dimension and every cosine in the second, where xf (and the
paper) interleave them. A fixed permutation of the model dimension (``residual_permutation``),
applied to every weight that reads or writes the residual stream (embeddings, the input columns
of q/k/v, fc1 and lm_head, the output rows of out_proj and fc2, every LayerNorm), gives a model
that computes the same function with MarianMT's table. (2) Special ids: xf's are constants (pad
0, unk 1, bos 2, eos 3, the decoder starting with bos). Export writes them as they are; import
puts the vocabulary into that layout, the rows of the embeddings, lm_head and bias with it. An
OPUS-MT model (eos 0, unk 1, pad = decoder start = the last id) then gets bos from its pad row
and one new row for xf's pad, whose logit is held at ``NEVER_LOGIT`` (its probability is 0 in
float32), so the log-probabilities of every other token are the model's own.

Not representable, and refused with the option named: pre-LN, learned/rope/alibi positions,
tensor2tensor's sinusoids, a zero decoder start and SwiGLU (export); separate source/target id
spaces, shared encoder/decoder embeddings with an untied lm_head, unequal encoder/decoder widths,
other activations or layer norms (import).
Loading never runs code from the directory: safetensors, or a pytorch_model.bin through
``torch.load(weights_only=True)``; every field of config.json that import reads is checked for
its type and range (that of the ModelConfig field it becomes) before use.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Optional

import torch

from ..base.errors import XfError
from ..base.json_input import read_json
from ..model.facts import MARIAN_ACTIVATIONS, facts_from_config
from ..model.transformer import Transformer, model_config
from ..settings.config import option_range
from ..settings.options import ModelConfig
from ..text.languages import model_pairs, pair_names, parse_pairs, tag, vocabulary_for
from ..text.vocab import BOS_ID, EOS_ID, PAD_ID, UNK_ID, MappedVocabulary, load_sentencepiece, spm_processor

# The logit of a row that MarianMT does not have (xf's pad, when MarianMT's pad is its decoder
# start): exp(-1000 - max logit) is 0 in float32, yet finite in the label-smoothed loss.
NEVER_LOGIT = -1000.0
ACTIVATIONS = {a: a for a in MARIAN_ACTIVATIONS}  # xf -> MarianMT; import also takes "silu"
# generation_config.json's max_length when none is given: what OPUS-MT (Helsinki-NLP) models carry.
# xf translate's limit, a*|X|+b subwords (|X|+50 by default), follows the source; transformers'
# generate has no such rule, only a fixed length (or max_new_tokens per call).
MAX_LENGTH = 512


def import_hf_extra():
    """safetensors, or a one-line error naming the extra that provides it."""
    try:
        import safetensors.torch
    except ImportError:
        raise XfError("xf export/import huggingface needs safetensors: pip install 'xformer-cli[hf]'") from None
    return safetensors.torch


def residual_permutation(d_model: int) -> torch.Tensor:
    """perm (D,) with hf[..., j] = xf[..., perm[j]]: xf's interleaved sin/cos dimensions (0, 2, 4, ...
    are sines, 1, 3, 5, ... cosines) in MarianMT's halves (sines first, then cosines)."""
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


def _layer_pairs(prefix: str, xf: str, decoder: bool) -> list[tuple[str, str, str]]:
    """(xf name, MarianMT name, how the residual permutation applies) of one layer's tensors.
    how: "in" permutes columns (reads the stream), "out" rows (writes it), "vec" a norm's vector,
    "outvec" an output bias, "" nothing (q/k/v biases live in head space)."""
    blocks = [("self_attn", "self_attn", "attn_block" if not decoder else "self_block", "self_attn_layer_norm")]
    if decoder:
        blocks.append(("cross_attn", "encoder_attn", "cross_block", "encoder_attn_layer_norm"))
    pairs = []
    for mine, theirs, block, norm in blocks:
        for i, name in enumerate("qkv"):
            pairs.append((f"{xf}.{mine}.in_proj.weight:{i}", f"{prefix}.{theirs}.{name}_proj.weight", "in"))
            pairs.append((f"{xf}.{mine}.in_proj.bias:{i}", f"{prefix}.{theirs}.{name}_proj.bias", ""))
        pairs.append((f"{xf}.{mine}.out_proj.weight", f"{prefix}.{theirs}.out_proj.weight", "out"))
        pairs.append((f"{xf}.{mine}.out_proj.bias", f"{prefix}.{theirs}.out_proj.bias", "outvec"))
        pairs.append((f"{xf}.{block}.norm.weight", f"{prefix}.{norm}.weight", "vec"))
        pairs.append((f"{xf}.{block}.norm.bias", f"{prefix}.{norm}.bias", "vec"))
    pairs += [(f"{xf}.ffn.fc1.weight", f"{prefix}.fc1.weight", "in"), (f"{xf}.ffn.fc1.bias", f"{prefix}.fc1.bias", ""),
              (f"{xf}.ffn.fc2.weight", f"{prefix}.fc2.weight", "out"), (f"{xf}.ffn.fc2.bias", f"{prefix}.fc2.bias", "outvec"),
              (f"{xf}.ffn_block.norm.weight", f"{prefix}.final_layer_norm.weight", "vec"),
              (f"{xf}.ffn_block.norm.bias", f"{prefix}.final_layer_norm.bias", "vec")]
    return pairs


def tensor_pairs(encoder_layers: int, decoder_layers: int) -> list[tuple[str, str, str]]:
    """Every layer tensor of an xf model with its MarianMT name (embeddings and head apart)."""
    pairs = []
    for i in range(encoder_layers):
        pairs += _layer_pairs(f"model.encoder.layers.{i}", f"encoder_layers.{i}", decoder=False)
    for i in range(decoder_layers):
        pairs += _layer_pairs(f"model.decoder.layers.{i}", f"decoder_layers.{i}", decoder=True)
    return pairs


def _permute(t: torch.Tensor, how: str, perm: torch.Tensor) -> torch.Tensor:
    if how == "in":
        return t[:, perm]
    if how == "out":
        return t[perm, :]
    if how in ("vec", "outvec"):
        return t[perm]
    return t


# -- export --------------------------------------------------------------------------------------
def marian_state_dict(model: Transformer) -> dict[str, torch.Tensor]:
    """The MarianMT tensors of ``model``: permuted into MarianMT's layout, one tensor per tied group."""
    cfg, d = model.cfg, model.cfg.d_model
    perm = residual_permutation(d)
    mine = model.state_dict()
    out: dict[str, torch.Tensor] = {}
    for xf_name, hf_name, how in tensor_pairs(cfg.encoder_layers, cfg.decoder_layers):
        name, _, part = xf_name.partition(":")
        t = mine[name]
        if part:
            t = t[int(part) * d : (int(part) + 1) * d]
        out[hf_name] = _permute(t, how, perm)
    if cfg.share_embeddings == "all":
        out["model.shared.weight"] = model.decoder_embed.weight[:, perm]
    else:
        out["model.encoder.embed_tokens.weight"] = model.encoder_embed.weight[:, perm]
        out["model.decoder.embed_tokens.weight"] = model.decoder_embed.weight[:, perm]
    if cfg.share_embeddings == "none":
        out["lm_head.weight"] = model.output_proj.weight[:, perm]
    bias = model.output_bias if model.output_bias is not None else torch.zeros(cfg.vocab_size)
    out["final_logits_bias"] = bias.view(1, -1)
    return {k: v.detach().float().contiguous().clone() for k, v in out.items()}


def marian_config(cfg) -> dict:
    """config.json of ``cfg``, with xf's special ids (the decoder starts with bos)."""
    return {
        "architectures": ["MarianMTModel"], "model_type": "marian",
        "vocab_size": cfg.vocab_size, "decoder_vocab_size": cfg.vocab_size, "d_model": cfg.d_model,
        "encoder_layers": cfg.encoder_layers, "decoder_layers": cfg.decoder_layers,
        "encoder_attention_heads": cfg.heads, "decoder_attention_heads": cfg.heads,
        "encoder_ffn_dim": cfg.d_ff, "decoder_ffn_dim": cfg.d_ff,
        "activation_function": ACTIVATIONS[cfg.activation], "max_position_embeddings": cfg.max_positions,
        "scale_embedding": cfg.scale_embedding, "dropout": cfg.dropout, "attention_dropout": cfg.attention_dropout,
        "activation_dropout": cfg.activation_dropout, "encoder_layerdrop": 0.0, "decoder_layerdrop": 0.0,
        "share_encoder_decoder_embeddings": cfg.share_embeddings == "all",
        "tie_word_embeddings": cfg.share_embeddings in ("all", "decoder"),
        "pad_token_id": PAD_ID, "bos_token_id": BOS_ID, "eos_token_id": EOS_ID, "forced_eos_token_id": EOS_ID,
        "decoder_start_token_id": BOS_ID, "is_encoder_decoder": True, "use_cache": True, "init_std": 0.02,
        "dtype": "float32",
    }


def generation_config(cfg, num_beams: int = 4, length_penalty: float = 1.0, max_length: int = 0) -> dict:
    """xf's beam search as transformers' generate: num_beams, score / |Y|^length_penalty (|Y| with
    eos, xf's --lenpen-style length), done when num_beams hypotheses ended (early_stopping, as xf),
    pad and bos never emitted, at most ``max_length`` ids with the decoder start and eos (0:
    MAX_LENGTH, or the model's max_positions when fewer)."""
    return {
        "bos_token_id": BOS_ID, "decoder_start_token_id": BOS_ID, "eos_token_id": EOS_ID,
        "forced_eos_token_id": EOS_ID, "pad_token_id": PAD_ID, "bad_words_ids": [[PAD_ID], [BOS_ID]],
        "num_beams": num_beams, "length_penalty": length_penalty, "early_stopping": True,
        "max_length": max_length or min(MAX_LENGTH, cfg.max_positions),
    }


def _vocabulary_files(spm_model: bytes, where: str) -> tuple[bytes, bytes, list[str]]:
    """(source.spm, target.spm, pieces in id order) of a checkpoint's vocabulary."""
    sp = load_sentencepiece(spm_model, where)
    if isinstance(sp, MappedVocabulary):
        return sp.source_spm, sp.target_spm, sp.pieces
    return spm_model, spm_model, [sp.id_to_piece(i) for i in range(sp.get_piece_size())]


def model_card(cfg, generation: dict, parameters: int, source_lang: str, target_lang: str, source: str,
               bleu: Optional[tuple[float, str]] = None, pairs: Optional[list[tuple[str, str]]] = None) -> str:
    """README.md: what the model is, how it decodes (``generation``), the test BLEU and its
    sacreBLEU signature when ``bleu`` is given, and how to load it; a multilingual model's
    ``pairs``: its target languages and their tags, which every source must start with."""
    languages = [source_lang, target_lang] if pairs is None else list(dict.fromkeys(x for pair in pairs for x in pair))
    targets = [] if pairs is None else list(dict.fromkeys(t for _, t in pairs))
    lines = ["---\nlanguage:\n" + "".join(f"- {lang}\n" for lang in languages)
             + "tags:\n- translation\n- marian\nlibrary_name: transformers\n---\n",
             f"# {source_lang}-{target_lang} Transformer, exported from xf\n",
             "A MarianMT model written by `xf export huggingface` from an xf checkpoint "
             f"(`{Path(source).name}`).\n"]
    if pairs is not None:  # as OPUS-MT's multilingual cards say it
        lines += [f"- source language(s): {' '.join(dict.fromkeys(s for s, _ in pairs))}",
                  f"- target language(s): {' '.join(targets)}",
                  "- a sentence-initial language token is required in the form of `>>id<<` (id = valid target "
                  f"language ID): {', '.join(f'`{tag(t)}`' for t in targets)}\n"]
    lines += ["| | |\n|---|---|"]
    rows = [("layers (encoder / decoder)", f"{cfg.encoder_layers} / {cfg.decoder_layers}"),
            ("d_model / d_ff / heads", f"{cfg.d_model} / {cfg.d_ff} / {cfg.heads}"),
            ("activation", cfg.activation), ("embeddings", f"shared: {cfg.share_embeddings}, "
             f"scaled by sqrt(d_model): {'yes' if cfg.scale_embedding else 'no'}"),
            ("vocabulary", str(cfg.vocab_size)), ("parameters", f"{parameters:,}"),
            ("decoding", f"beam {generation['num_beams']}, length_penalty {generation['length_penalty']}, "
                          f"max_length {generation['max_length']}")]
    lines += [f"| {k} | {v} |" for k, v in rows]
    if bleu is not None:
        lines += ["", f"Test BLEU: **{bleu[0]:.2f}** (sacreBLEU `{bleu[1]}`)"]
    first = f"{tag(targets[0])} " if targets else ""
    lines += ["", "```python", "from transformers import MarianMTModel, MarianTokenizer",
              'model = MarianMTModel.from_pretrained("DIR")', 'tokenizer = MarianTokenizer.from_pretrained("DIR")',
              f'batch = tokenizer(["{first}A sentence."], return_tensors="pt")',
              "print(tokenizer.batch_decode(model.generate(**batch), skip_special_tokens=True))", "```", ""]
    return "\n".join(lines)


def write_marian(directory: Path, model: Transformer, spm_model: bytes, source: str = "checkpoint",
                 source_lang: str = "en", target_lang: str = "de", num_beams: int = 4, length_penalty: float = 1.0,
                 max_length: int = 0, bleu: Optional[tuple[float, str]] = None,
                 meta: Optional[dict] = None) -> tuple[dict, dict]:
    """Write ``model`` and its vocabulary ``spm_model`` (a checkpoint's) as the files of a MarianMT
    directory into the existing ``directory``; ``source`` (the checkpoint's path) names it in
    errors and the model card. Decoding as ``generation_config``; ``bleu``: (score, sacreBLEU
    signature) for the model card. A multilingual checkpoint's ``meta`` (its pairs) names the
    languages instead of source_lang/target_lang: its tags are pieces of vocab.json, as OPUS-MT's
    (MarianTokenizer puts a leading ">>deu<<" first by id), and config.json's ``xf_pairs`` keeps
    the pairs for xf import. Returns (config.json, generation_config.json) as written."""
    st = import_hf_extra()
    cfg = model.cfg
    facts_from_config(cfg, meta, where=source).refuse_export("huggingface")  # every reason at once
    source_spm, target_spm, pieces = _vocabulary_files(spm_model, source)
    if len(pieces) != cfg.vocab_size:
        raise XfError(f"{source}: model vocabulary {cfg.vocab_size} != its vocabulary's {len(pieces)} pieces")
    config, generation = marian_config(cfg), generation_config(cfg, num_beams, length_penalty, max_length)
    pairs = model_pairs(meta or {})
    if pairs is not None:
        vocabulary_for(load_sentencepiece(spm_model, source), meta, pairs[0][1], source)  # its tags are pieces
        config["xf_pairs"] = pair_names(pairs)  # source_lang, target_lang: the export's (model_facts: "en", "de+fr")
    directory = Path(directory)
    (directory / "model.safetensors").write_bytes(st.save(marian_state_dict(model), metadata={"format": "pt"}))
    dump = lambda data: json.dumps(data, indent=2, ensure_ascii=False) + "\n"  # noqa: E731
    (directory / "config.json").write_text(dump(config), encoding="utf-8")
    (directory / "generation_config.json").write_text(dump(generation), encoding="utf-8")
    (directory / "source.spm").write_bytes(source_spm)
    (directory / "target.spm").write_bytes(target_spm)
    (directory / "vocab.json").write_text(dump({p: i for i, p in enumerate(pieces)}), encoding="utf-8")
    tokenizer = {"tokenizer_class": "MarianTokenizer", "source_lang": source_lang, "target_lang": target_lang,
                 "unk_token": pieces[UNK_ID], "eos_token": pieces[EOS_ID], "pad_token": pieces[PAD_ID],
                 "model_max_length": cfg.max_positions, "separate_vocabs": False}
    (directory / "tokenizer_config.json").write_text(dump(tokenizer), encoding="utf-8")
    card = model_card(cfg, generation, model.num_parameters(), source_lang, target_lang, source, bleu, pairs)
    (directory / "README.md").write_text(card, encoding="utf-8")
    return config, generation


# -- import --------------------------------------------------------------------------------------
REQUIRED = object()  # a config.json field without a default


def _read_json(path: Path) -> dict:
    """The JSON object in ``path``, or a one-line error naming it."""
    if not path.is_file():
        raise XfError(f"{path}: missing (a MarianMT directory has config.json, model.safetensors, source.spm, "
                      "target.spm and vocab.json)")
    data = read_json(path)
    if not isinstance(data, dict):
        raise XfError(f"{path}: not a JSON object")
    return data


def config_field(config: dict, where: Path, key: str, kind: type, default=REQUIRED):
    """config[key] if it is a ``kind`` (int, float, bool or str; null is absent), else ``default``,
    or a one-line error naming the file and the field."""
    value = config.get(key)
    if value is None:
        if default is REQUIRED:
            raise XfError(f"{where}: '{key}' is missing")
        return default
    ok = {int: lambda v: isinstance(v, int) and not isinstance(v, bool),
          float: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
          bool: lambda v: isinstance(v, bool), str: lambda v: isinstance(v, str)}[kind]
    if not ok(value):
        name = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}[kind]
        raise XfError(f"{where}: {key} {json.dumps(value)} is not {name}")
    return value


def config_number(config: dict, where: Path, key: str, field: str, kind: type = int, default=REQUIRED):
    """A number of config.json that becomes ModelConfig's ``field``: checked against that field's range."""
    value = config_field(config, where, key, kind, default)
    problem = option_range(ModelConfig, field).problem(value) if value is not None else None
    if problem:
        raise XfError(f"{where}: {key} {value!r} {problem}")
    return value


def config_from_marian(config: dict, where: Path) -> ModelConfig:
    """The xf ModelConfig of a MarianMT config.json (vocabulary size as MarianMT's), or a one-line
    refusal naming the field that is missing, of the wrong type, out of range, or that xf cannot
    represent."""
    if config.get("model_type") != "marian":
        raise XfError(f"{where}: not a MarianMT model (model_type {config.get('model_type')!r}, not 'marian')")

    def number(key, field, kind=int, default=REQUIRED):
        return config_number(config, where, key, field, kind, default)

    def flag(key, default):
        return config_field(config, where, key, bool, default)

    vocab = number("vocab_size", "vocab_size")
    decoder_vocab = number("decoder_vocab_size", "vocab_size", default=None)
    if decoder_vocab not in (None, vocab):
        raise XfError(f"{where}: decoder_vocab_size {decoder_vocab} != vocab_size {vocab}: "
                      "separate source and target id spaces cannot be represented (xf has one)")
    widths = {}
    for a, b, field in (("encoder_attention_heads", "decoder_attention_heads", "heads"),
                        ("encoder_ffn_dim", "decoder_ffn_dim", "d_ff")):
        widths[field] = number(a, field)
        if widths[field] != number(b, field):
            raise XfError(f"{where}: {a} {config[a]} != {b} {config[b]}; xf's encoder and decoder have one width")
    name = config_field(config, where, "activation_function", str)
    activation = {"silu": "swish"}.get(name, name)
    if activation not in ACTIVATIONS:
        raise XfError(f"{where}: activation_function {name!r} cannot be represented (relu, gelu, swish)")
    for key, bad in (("normalize_before", True), ("normalize_embedding", True), ("add_final_layer_norm", True),
                     ("static_position_embeddings", False), ("add_bias_logits", True)):
        if flag(key, not bad) == bad:
            raise XfError(f"{where}: {key} {str(bad).lower()} cannot be represented (xf imports post-LN MarianMT "
                          "with static sinusoids)")
    share, tie = flag("share_encoder_decoder_embeddings", True), flag("tie_word_embeddings", True)
    if share and not tie:
        raise XfError(f"{where}: share_encoder_decoder_embeddings with tie_word_embeddings false (one source/target "
                      "embedding, a separate lm_head) cannot be represented")
    d_model, heads = number("d_model", "d_model"), widths["heads"]
    if d_model % 2 or d_model % heads:
        raise XfError(f"{where}: d_model {d_model} must be even and divisible by the {heads} heads")
    try:
        return model_config(
            "base", vocab_size=vocab, encoder_layers=number("encoder_layers", "encoder_layers"),
            decoder_layers=number("decoder_layers", "decoder_layers"), d_model=d_model, d_ff=widths["d_ff"],
            heads=heads, dropout=float(number("dropout", "dropout", float, 0.1)),
            attention_dropout=float(number("attention_dropout", "attention_dropout", float, 0.0)),
            activation_dropout=float(number("activation_dropout", "activation_dropout", float, 0.0)),
            normalize_before=False, activation=activation, positions="sinusoidal",
            max_positions=number("max_position_embeddings", "max_positions"),
            share_embeddings="all" if share else "decoder" if tie else "none",
            scale_embedding=flag("scale_embedding", False), output_bias=True)
    except XfError as e:
        raise XfError(f"{where}: {e}") from None


def special_ids(config: dict, where: Path, size: int) -> tuple[int, int, int]:
    """(pad, eos, decoder start) of config.json, each an id below vocab_size ``size``."""
    pad, eos = config.get("pad_token_id"), config.get("eos_token_id")
    start = config.get("decoder_start_token_id", pad)
    eos = eos[0] if isinstance(eos, list) and eos else eos  # transformers allows a list of eos ids
    for key, value in (("pad_token_id", pad), ("eos_token_id", eos), ("decoder_start_token_id", start)):
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < size:
            raise XfError(f"{where}: {key} {value!r} is not an id below vocab_size {size}")
    return pad, eos, start


def read_tokenizer(directory: Path, config: dict, size: int) -> tuple[bytes, list[Optional[int]]]:
    """(the xf vocabulary bytes, rows: the MarianMT id of each xf id) of MarianTokenizer's files:
    two sentencepiece models over one id space (vocab.json)."""
    vocab_path = directory / "vocab.json"
    vocab = _read_json(vocab_path)
    tok_path = directory / "tokenizer_config.json"
    tok_config = _read_json(tok_path) if tok_path.is_file() else {}
    if tok_config.get("separate_vocabs") or (directory / "target_vocab.json").is_file():
        raise XfError(f"{directory}: separate source and target vocabularies (target_vocab.json) cannot be represented")
    ids = list(vocab.values())
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in ids) or sorted(ids) != list(range(size)):
        raise XfError(f"{vocab_path}: its ids are not 0..{size - 1}, the vocab_size of config.json ({len(vocab)} pieces)")
    spms = {}
    for name in ("source.spm", "target.spm"):
        if not (directory / name).is_file():
            raise XfError(f"{directory / name}: missing (MarianTokenizer's sentencepiece model)")
        spms[name] = (directory / name).read_bytes()
        check_pieces(spms[name], directory / name, vocab)
    hf_pieces = [""] * size
    for piece, i in vocab.items():
        hf_pieces[i] = piece
    unk_piece = tok_config.get("unk_token", "<unk>")
    unk_piece = unk_piece.get("content") if isinstance(unk_piece, dict) else unk_piece
    if not isinstance(unk_piece, str) or unk_piece not in vocab:
        raise XfError(f"{vocab_path}: has no unknown token {unk_piece!r}")
    pad, eos, start = special_ids(config, directory / "config.json", size)
    unk = vocab[unk_piece]
    if len({unk, start, eos}) < 3 or (pad != start and pad in (unk, eos)):
        raise XfError(f"{directory}: special ids pad {pad}, unk {unk}, eos {eos}, decoder start {start} overlap; "
                      "xf needs unk, eos and the decoder start apart (pad may be the decoder start)")
    rows = xf_id_order(size, pad, unk, start, eos)
    return xf_vocabulary(spms["source.spm"], spms["target.spm"], hf_pieces, rows), rows


def check_pieces(model: bytes, where: Path, vocab: dict) -> None:
    """Refuse a sentencepiece model that does not spell vocab.json: one of its pieces (control and
    unknown pieces aside: tokenizer_config.json names those) that vocab.json lacks. MarianTokenizer
    makes such a piece unknown, and OPUS-MT builds vocab.json from every piece of both models, so
    a missing piece means another model's sentencepiece model, whose pieces the weights never saw."""
    sp = spm_processor(model, str(where))
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())
              if not (sp.is_control(i) or sp.is_unknown(i) or sp.is_unused(i))]
    missing = [p for p in pieces if p not in vocab]
    if missing:
        raise XfError(f"{where}: {len(missing):,} of its {len(pieces):,} pieces are not in vocab.json (first: "
                      f"{missing[0]!r}): not the sentencepiece model of these weights, whose every piece has an id")


def read_weights(directory: Path) -> tuple[dict[str, torch.Tensor], Path]:
    """The tensors of model.safetensors, else of pytorch_model.bin (weights_only: plain tensors
    only, no code), with MarianMTModel's names ("model." first)."""
    st_path, bin_path = directory / "model.safetensors", directory / "pytorch_model.bin"
    if st_path.is_file():
        st = import_hf_extra()
        try:
            tensors, path = st.load_file(str(st_path)), st_path
        except Exception as e:  # noqa: BLE001 - safetensors raises its own SafetensorError, and OSError
            raise XfError(f"{st_path}: not a readable safetensors file ({str(e).splitlines()[0][:120]})") from None
    elif bin_path.is_file():
        try:
            tensors, path = torch.load(bin_path, map_location="cpu", weights_only=True), bin_path
        except Exception as e:  # noqa: BLE001 - the unpickler refuses code, or the bytes are corrupt
            raise XfError(f"{bin_path}: not loadable as plain tensors without running code "
                          f"({str(e).splitlines()[0][:120]})") from None
        if not isinstance(tensors, dict) or not all(isinstance(v, torch.Tensor) for v in tensors.values()):
            raise XfError(f"{bin_path}: not a state dict of tensors")
    elif (directory / "model.safetensors.index.json").is_file() or (directory / "pytorch_model.bin.index.json").is_file():
        raise XfError(f"{directory}: sharded weights (*.index.json) are not read; save the model unsharded")
    else:
        raise XfError(f"{directory}: no weights (model.safetensors or pytorch_model.bin)")
    named = {}
    for key, value in tensors.items():
        named[key if key.startswith(("model.", "lm_head.", "final_logits_bias")) else f"model.{key}"] = value
    return named, path


def xf_id_order(size: int, pad: int, unk: int, start: int, eos: int) -> list[Optional[int]]:
    """rows[i] = the MarianMT id of xf id i (None: a new row, xf's pad when MarianMT's pad is its
    decoder start): pad, unk, bos (the decoder start), eos, then every other id in order."""
    first = [pad if pad != start else None, unk, start, eos]
    used = {i for i in first if i is not None}
    return first + [i for i in range(size) if i not in used]


def checked_weights(directory: Path, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """The MarianMT tensors of ``directory``, each checked against the configuration ``cfg``."""
    tensors, weights_path = read_weights(directory)
    expected = marian_state_dict(Transformer(cfg))
    shared = "model.shared.weight" in expected
    size = cfg.vocab_size
    tensors.setdefault("final_logits_bias", torch.zeros(1, size))  # transformers too takes it as zeros when absent
    for key, value in expected.items():
        if key not in tensors and shared and key == "model.shared.weight":
            key = "model.encoder.embed_tokens.weight"
        if key not in tensors:
            raise XfError(f"{weights_path}: {key} is missing")
        got = tuple(tensors[key].shape)
        if got != tuple(value.shape) and not (key == "final_logits_bias" and got == (size,)):
            raise XfError(f"{weights_path}: {key} has shape {got}, config.json says {tuple(value.shape)}")
    known = set(expected) | {"model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight",
                             "model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight", "lm_head.weight"}
    unknown = sorted(set(tensors) - known)
    if unknown:
        raise XfError(f"{weights_path}: {unknown[0]} is not part of MarianMTModel (an architecture xf cannot represent)")
    for key, value in sorted(tensors.items()):  # a NaN would spread through every translation it reaches
        bad = int((~torch.isfinite(value)).sum()) if value.is_floating_point() else 0
        if bad:
            raise XfError(f"{weights_path}: {key} has {bad:,} value{'s that are' if bad > 1 else ' that is'} not "
                          "finite (NaN or infinite); xf imports finite weights only")
    return tensors


def read_marian(directory: Path) -> tuple[Transformer, bytes]:
    """(the xf model, its vocabulary bytes) of the MarianMT directory ``directory``: every file
    checked before any weight is used."""
    directory = Path(directory)
    if not directory.is_dir():
        raise XfError(f"{directory}: not a directory")
    config = _read_json(directory / "config.json")
    cfg = config_from_marian(config, directory / "config.json")
    spm_model, rows = read_tokenizer(directory, config, cfg.vocab_size)
    tensors = checked_weights(directory, cfg)
    # a bias only where it does something: a zero bias and no new row (what xf exports) is none
    needs_bias = bool(tensors["final_logits_bias"].any()) or None in rows
    return marian_to_xf(dataclasses.replace(cfg, output_bias=needs_bias), tensors, rows), spm_model


def marian_languages(directory: Path) -> dict:
    """The checkpoint meta naming the languages of a MarianMT directory: a multilingual model's
    pairs where xf export wrote them (config.json's ``xf_pairs``), else nothing (an OPUS-MT
    multilingual model is then given its tag in the text, ">>deu<< A sentence.")."""
    config = _read_json(Path(directory) / "config.json")
    if "xf_pairs" not in config:
        return {}
    pairs = parse_pairs(config["xf_pairs"], f"{Path(directory) / 'config.json'}: xf_pairs") \
        if isinstance(config["xf_pairs"], list) else None
    if not pairs:
        raise XfError(f"{Path(directory) / 'config.json'}: xf_pairs must be a list of pairs such as \"en-de\"")
    return {"source_lang": "src", "target_lang": "tgt", "pairs": pair_names(pairs)}


def marian_to_xf(cfg, tensors: dict[str, torch.Tensor], rows: list[Optional[int]]) -> Transformer:
    """The xf model of MarianMT ``tensors``, its vocabulary rows in xf's order ``rows``."""
    d, size = cfg.d_model, len(rows)
    inverse = torch.argsort(residual_permutation(d))
    model = Transformer(dataclasses.replace(cfg, vocab_size=size))
    state = model.state_dict()
    parts: dict[str, list] = {}
    for xf_name, hf_name, how in tensor_pairs(cfg.encoder_layers, cfg.decoder_layers):
        t = _permute(tensors[hf_name].float(), how, inverse)
        name, _, part = xf_name.partition(":")
        if part:
            parts.setdefault(name, []).append(t)
        else:
            state[name] = t
    for name, pieces in parts.items():
        state[name] = torch.cat(pieces, dim=0)

    def vocab_rows(t: torch.Tensor, fill: float = 0.0) -> torch.Tensor:
        out = t.new_full((size,) + tuple(t.shape[1:]), fill)
        known = torch.tensor([i for i, r in enumerate(rows) if r is not None])
        out[known] = t[torch.tensor([r for r in rows if r is not None])]
        return out

    def embed(key: str) -> torch.Tensor:
        for k in (key, "model.shared.weight", "model.encoder.embed_tokens.weight"):
            if k in tensors:
                return vocab_rows(tensors[k].float()[:, inverse])
        raise KeyError(key)

    if cfg.share_embeddings == "all":
        e = embed("model.shared.weight")
        state["encoder_embed.weight"] = state["decoder_embed.weight"] = state["output_proj.weight"] = e
    else:
        state["encoder_embed.weight"] = embed("model.encoder.embed_tokens.weight")
        state["decoder_embed.weight"] = embed("model.decoder.embed_tokens.weight")
        state["output_proj.weight"] = (state["decoder_embed.weight"] if cfg.share_embeddings == "decoder"
                                       else vocab_rows(tensors["lm_head.weight"].float()[:, inverse]))
    if cfg.output_bias:
        state["output_bias"] = vocab_rows(tensors["final_logits_bias"].float().view(-1), NEVER_LOGIT)
    model.load_state_dict(state)
    return model.eval()


def xf_vocabulary(source_spm: bytes, target_spm: bytes, hf_pieces: list[str], rows: list[Optional[int]]) -> bytes:
    """The checkpoint's vocabulary bytes: the sentencepiece model itself when MarianMT's vocabulary
    is one xf sentencepiece model in xf's layout (what xf export writes), else a mapped vocabulary
    of both models with the pieces in xf's id order."""
    if source_spm == target_spm and rows == list(range(len(hf_pieces))):
        try:
            sp = load_sentencepiece(source_spm, "source.spm")
        except XfError:
            sp = None
        if sp is not None and [sp.id_to_piece(i) for i in range(sp.get_piece_size())] == hf_pieces:
            return source_spm
    pieces = [hf_pieces[r] if r is not None else None for r in rows]
    new_pad = "<pad>" if "<pad>" not in pieces else "<xf-pad>"
    pieces = [p if p is not None else new_pad for p in pieces]
    return MappedVocabulary(source_spm, target_spm, pieces, "source.spm/target.spm").to_bytes()
