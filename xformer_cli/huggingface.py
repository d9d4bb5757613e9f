"""xf checkpoints <-> Hugging Face MarianMT directories (``xf export huggingface``, ``xf import huggingface``).

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

Not representable, and refused with the option named: pre-LN, learned/rope/alibi positions and
SwiGLU (export); separate source/target id spaces, shared encoder/decoder embeddings with an
untied lm_head, unequal encoder/decoder widths, other activations or layer norms (import).
Loading never runs code from the directory: safetensors, or a pytorch_model.bin through
``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Optional

import torch

from .checkpoint import load_checkpoint, make_checkpoint, model_from_checkpoint, save_checkpoint
from .errors import XfError
from .fileio import atomic_directory
from .model import Transformer, model_config
from .options import ExportOptions, ImportOptions
from .vocab import BOS_ID, EOS_ID, PAD_ID, UNK_ID, MappedVocabulary, load_sentencepiece

# The logit of a row that MarianMT does not have (xf's pad, when MarianMT's pad is its decoder
# start): exp(-1000 - max logit) is 0 in float32, yet finite in the label-smoothed loss.
NEVER_LOGIT = -1000.0
ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "swish": "swish"}  # xf -> MarianMT; import also takes "silu"


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
def refuse_for_marian(cfg, where: str) -> None:
    """A one-line error naming the option when MarianMT cannot compute what the model computes."""
    if cfg.normalize_before:
        raise XfError(f"{where}: --normalize-before (pre-LN) cannot be exported to MarianMT, which is post-LN")
    if cfg.positions != "sinusoidal":
        raise XfError(f"{where}: --positions {cfg.positions} cannot be exported to MarianMT (static sinusoids only)")
    if cfg.activation not in ACTIVATIONS:
        raise XfError(f"{where}: --activation {cfg.activation} cannot be exported to MarianMT "
                      f"({', '.join(ACTIVATIONS)} only)")
    if cfg.d_model % 2:
        raise XfError(f"{where}: --d-model {cfg.d_model} is odd; MarianMT's sinusoids need an even width")
    head_dim = getattr(cfg, "head_dim", None)  # projections d_model -> heads * head_dim, where that option exists
    if head_dim and head_dim * cfg.heads != cfg.d_model:
        raise XfError(f"{where}: --head-dim {head_dim} (heads x head_dim != d_model) cannot be exported to MarianMT, "
                      "whose heads split d_model")


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


def generation_config(cfg, options: ExportOptions) -> dict:
    """xf's beam search as transformers' generate: num_beams, score / |Y|^lenpen (|Y| with eos,
    xf's --lenpen-style length), done when num_beams hypotheses ended (early_stopping, as xf),
    pad and bos never emitted."""
    return {
        "bos_token_id": BOS_ID, "decoder_start_token_id": BOS_ID, "eos_token_id": EOS_ID,
        "forced_eos_token_id": EOS_ID, "pad_token_id": PAD_ID, "bad_words_ids": [[PAD_ID], [BOS_ID]],
        "num_beams": options.beam_size, "length_penalty": options.lenpen, "early_stopping": True,
        "max_length": options.max_length or cfg.max_positions,
    }


def _vocabulary_files(spm_model: bytes, where: str) -> tuple[bytes, bytes, list[str]]:
    """(source.spm, target.spm, pieces in id order) of a checkpoint's vocabulary."""
    sp = load_sentencepiece(spm_model, where)
    if isinstance(sp, MappedVocabulary):
        return sp.source_spm, sp.target_spm, sp.pieces
    return spm_model, spm_model, [sp.id_to_piece(i) for i in range(sp.get_piece_size())]


def model_card(cfg, options: ExportOptions, parameters: int) -> str:
    lines = [f"---\nlanguage:\n- {options.source_lang}\n- {options.target_lang}\ntags:\n- translation\n- marian\n"
             "library_name: transformers\n---\n",
             f"# {options.source_lang}-{options.target_lang} Transformer, exported from xf\n",
             "A MarianMT model written by `xf export huggingface` from an xf checkpoint "
             f"(`{Path(options.path).name}`).\n", "| | |\n|---|---|"]
    rows = [("layers (encoder / decoder)", f"{cfg.encoder_layers} / {cfg.decoder_layers}"),
            ("d_model / d_ff / heads", f"{cfg.d_model} / {cfg.d_ff} / {cfg.heads}"),
            ("activation", cfg.activation), ("embeddings", f"shared: {cfg.share_embeddings}, "
             f"scaled by sqrt(d_model): {'yes' if cfg.scale_embedding else 'no'}"),
            ("vocabulary", str(cfg.vocab_size)), ("parameters", f"{parameters:,}"),
            ("decoding", f"beam {options.beam_size}, length_penalty {options.lenpen}")]
    lines += [f"| {k} | {v} |" for k, v in rows]
    if options.bleu:
        try:
            bleu = json.loads(Path(options.bleu).read_text(encoding="utf-8"))["bleu"]
            score, signature = float(bleu["score"]), str(bleu["signature"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise XfError(f"{options.bleu}: not the output of xf score --json with BLEU ({type(e).__name__}: {e})") from None
        lines += ["", f"Test BLEU: **{score:.2f}** (sacreBLEU `{signature}`)"]
    lines += ["", "```python", "from transformers import MarianMTModel, MarianTokenizer",
              'model = MarianMTModel.from_pretrained("DIR")', 'tokenizer = MarianTokenizer.from_pretrained("DIR")',
              'batch = tokenizer(["A sentence."], return_tensors="pt")',
              "print(tokenizer.batch_decode(model.generate(**batch), skip_special_tokens=True))", "```", ""]
    return "\n".join(lines)


def export_marian(options: ExportOptions) -> Path:
    """Write the MarianMT directory of checkpoint options.path to options.output, atomically."""
    st = import_hf_extra()
    with atomic_directory(options.output, options.overwrite, inputs=(options.path,)) as tmp:
        ckpt = load_checkpoint(options.path)
        model = model_from_checkpoint(ckpt, options.path).eval()
        cfg = model.cfg
        refuse_for_marian(cfg, str(options.path))
        source_spm, target_spm, pieces = _vocabulary_files(ckpt["spm_model"], str(options.path))
        if len(pieces) != cfg.vocab_size:
            raise XfError(f"{options.path}: model vocabulary {cfg.vocab_size} != its vocabulary's {len(pieces)} pieces")
        (tmp / "model.safetensors").write_bytes(st.save(marian_state_dict(model), metadata={"format": "pt"}))
        dump = lambda data: json.dumps(data, indent=2, ensure_ascii=False) + "\n"  # noqa: E731
        (tmp / "config.json").write_text(dump(marian_config(cfg)), encoding="utf-8")
        (tmp / "generation_config.json").write_text(dump(generation_config(cfg, options)), encoding="utf-8")
        (tmp / "source.spm").write_bytes(source_spm)
        (tmp / "target.spm").write_bytes(target_spm)
        (tmp / "vocab.json").write_text(dump({p: i for i, p in enumerate(pieces)}), encoding="utf-8")
        tokenizer = {"tokenizer_class": "MarianTokenizer", "source_lang": options.source_lang,
                     "target_lang": options.target_lang, "unk_token": pieces[UNK_ID], "eos_token": pieces[EOS_ID],
                     "pad_token": pieces[PAD_ID], "model_max_length": cfg.max_positions, "separate_vocabs": False}
        (tmp / "tokenizer_config.json").write_text(dump(tokenizer), encoding="utf-8")
        (tmp / "README.md").write_text(model_card(cfg, options, model.num_parameters()), encoding="utf-8")
    return Path(options.output)


# -- import --------------------------------------------------------------------------------------
def _read_json(path: Path):
    if not path.is_file():
        raise XfError(f"{path}: missing (a MarianMT directory has config.json, model.safetensors, source.spm, "
                      "target.spm and vocab.json)")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise XfError(f"{path}: not readable JSON ({e})") from None


def config_from_marian(config: dict, where: Path):
    """The xf ModelConfig of a MarianMT config.json (vocabulary size as MarianMT's), or a one-line
    refusal naming the key that xf cannot represent."""
    if config.get("model_type") != "marian":
        raise XfError(f"{where}: not a MarianMT model (model_type {config.get('model_type')!r}, not 'marian')")

    def need(key, default=None):
        value = config.get(key, default)
        if value is None:
            raise XfError(f"{where}: '{key}' is missing")
        return value

    vocab = need("vocab_size")
    if config.get("decoder_vocab_size") not in (None, vocab):
        raise XfError(f"{where}: decoder_vocab_size {config['decoder_vocab_size']} != vocab_size {vocab}: "
                      "separate source and target id spaces cannot be represented (xf has one)")
    for a, b in (("encoder_attention_heads", "decoder_attention_heads"), ("encoder_ffn_dim", "decoder_ffn_dim")):
        if need(a) != need(b):
            raise XfError(f"{where}: {a} {config[a]} != {b} {config[b]}; xf's encoder and decoder have one width")
    activation = {"silu": "swish"}.get(need("activation_function"), config["activation_function"])
    if activation not in ACTIVATIONS:
        raise XfError(f"{where}: activation_function {config['activation_function']!r} cannot be represented "
                      "(relu, gelu, swish)")
    for key, bad in (("normalize_before", True), ("normalize_embedding", True), ("add_final_layer_norm", True),
                     ("static_position_embeddings", False), ("add_bias_logits", True)):
        if config.get(key, not bad) == bad:
            raise XfError(f"{where}: {key} {str(bad).lower()} cannot be represented (xf imports post-LN MarianMT "
                          "with static sinusoids)")
    share, tie = config.get("share_encoder_decoder_embeddings", True), config.get("tie_word_embeddings", True)
    if share and not tie:
        raise XfError(f"{where}: share_encoder_decoder_embeddings with tie_word_embeddings false (one source/target "
                      "embedding, a separate lm_head) cannot be represented")
    d_model, heads = need("d_model"), need("encoder_attention_heads")
    if d_model % 2 or d_model % heads:
        raise XfError(f"{where}: d_model {d_model} must be even and divisible by the {heads} heads")
    try:
        return model_config(
            "base", vocab_size=vocab, encoder_layers=need("encoder_layers"), decoder_layers=need("decoder_layers"),
            d_model=d_model, d_ff=need("encoder_ffn_dim"), heads=heads, dropout=float(config.get("dropout", 0.1)),
            attention_dropout=float(config.get("attention_dropout", 0.0)),
            activation_dropout=float(config.get("activation_dropout", 0.0)), normalize_before=False,
            activation=activation, positions="sinusoidal", max_positions=need("max_position_embeddings"),
            share_embeddings="all" if share else "decoder" if tie else "none",
            scale_embedding=bool(config.get("scale_embedding", False)), output_bias=True)
    except XfError as e:
        raise XfError(f"{where}: {e}") from None


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


def import_marian(options: ImportOptions) -> Path:
    """Read the MarianMT directory options.directory and write the xf checkpoint options.output."""
    directory, output = Path(options.directory), Path(options.output)
    if not directory.is_dir():
        raise XfError(f"{directory}: not a directory")
    config = _read_json(directory / "config.json")
    cfg = config_from_marian(config, directory / "config.json")
    size = cfg.vocab_size

    # the tokenizer: two sentencepiece models, one id space (vocab.json)
    vocab_path = directory / "vocab.json"
    vocab = _read_json(vocab_path)
    tok_config = _read_json(directory / "tokenizer_config.json") if (directory / "tokenizer_config.json").is_file() else {}
    if tok_config.get("separate_vocabs") or (directory / "target_vocab.json").is_file():
        raise XfError(f"{directory}: separate source and target vocabularies (target_vocab.json) cannot be represented")
    if not isinstance(vocab, dict) or sorted(vocab.values()) != list(range(size)):
        raise XfError(f"{vocab_path}: its ids are not 0..{size - 1}, the vocab_size of config.json "
                      f"({len(vocab) if isinstance(vocab, dict) else 'no'} pieces)")
    spms = {}
    for name in ("source.spm", "target.spm"):
        if not (directory / name).is_file():
            raise XfError(f"{directory / name}: missing (MarianTokenizer's sentencepiece model)")
        spms[name] = (directory / name).read_bytes()
    hf_pieces = [""] * size
    for piece, i in vocab.items():
        hf_pieces[i] = piece
    unk_piece = tok_config.get("unk_token", "<unk>")
    unk_piece = unk_piece.get("content") if isinstance(unk_piece, dict) else unk_piece
    if unk_piece not in vocab:
        raise XfError(f"{vocab_path}: has no unknown token {unk_piece!r}")
    pad, eos = config.get("pad_token_id"), config.get("eos_token_id")
    start = config.get("decoder_start_token_id", pad)
    eos = eos[0] if isinstance(eos, list) else eos
    for key, value in (("pad_token_id", pad), ("eos_token_id", eos), ("decoder_start_token_id", start)):
        if not isinstance(value, int) or not 0 <= value < size:
            raise XfError(f"{directory / 'config.json'}: {key} {value!r} is not an id below vocab_size {size}")
    unk = vocab[unk_piece]
    if len({unk, start, eos}) < 3 or (pad != start and pad in (unk, eos)):
        raise XfError(f"{directory}: special ids pad {pad}, unk {unk}, eos {eos}, decoder start {start} overlap; "
                      "xf needs unk, eos and the decoder start apart (pad may be the decoder start)")
    rows = xf_id_order(size, pad, unk, start, eos)

    # the weights, checked against the configuration before any is used
    tensors, weights_path = read_weights(directory)
    expected = marian_state_dict(Transformer(cfg))
    shared = "model.shared.weight" in expected
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

    # a bias only where it does something: a zero bias and no new row (what xf exports) is none
    needs_bias = bool(tensors["final_logits_bias"].any()) or None in rows
    model = marian_to_xf(dataclasses.replace(cfg, output_bias=needs_bias), tensors, rows)
    spm_model = xf_vocabulary(spms["source.spm"], spms["target.spm"], hf_pieces, rows)
    meta = {"imported_from": str(directory.resolve()), "format": "huggingface-marian"}
    save_checkpoint(output, make_checkpoint(model, spm_model, meta=meta))
    return output


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
