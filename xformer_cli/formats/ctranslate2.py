"""CTranslate2's model directory: an xf model written as one (``write_model_directory``).

``write_model_directory`` maps an xf model onto CTranslate2's ``TransformerSpec`` with its
converter API and writes a model directory (model.bin, vocabularies, config.json) with the
sentencepiece model (``spm.model``) and ``xf.json`` beside it. What maps to what:
    embeddings           encoder/decoder embeddings (one array when tied), scaled by sqrt(d_model)
    positions            xf's own table as the spec's position encodings: sinusoidal (interleaved
                         sin/cos from position 0, which is not CTranslate2's built-in table) or learned;
                         --decoder-start zero as the decoder spec's start_from_zero_embedding
    attention            self-attention: in_proj as one fused qkv linear; cross-attention: its q
                         rows, then its k/v rows fused, then out_proj; --head-dim as the specs'
                         head_dim
    feed-forward         fc1/fc2; SwiGLU: fc1's gate rows as linear_0, its value rows as linear_0_noact
    layer norms          post-LN (the paper's) or pre-LN with the final encoder/decoder norms
    output projection    the decoder's projection (tied or not)

RoPE and ALiBi models are refused (xf's encoder-side ALiBi has no CTranslate2 equivalent, and
rotary export is not verified). Reading a directory back and translating with it is
``decode.ctranslate2_engine``'s. This module never imports ctranslate2 at the top: it is an
extra (``import_ctranslate2`` says how to install it).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional, Sequence

from ..base.errors import XfError
from ..decode.ctranslate2_engine import import_ctranslate2
from ..model.checkpoint import spm_digest
from ..model.transformer import Transformer
from ..text.languages import languages_of
from ..text.vocab import BOS_ID, EOS_ID, UNK_ID, load_sentencepiece


QUANTIZATIONS = ("float32", "int8", "bfloat16")  # the weight types of an exported model (xf export --quantization)


# -- writing ----------------------------------------------------------------------------------------
def transformer_spec(model: Transformer, pieces: Sequence[str]):
    """CTranslate2 TransformerSpec of ``model`` with vocabulary ``pieces`` (id order)."""
    import_ctranslate2()
    from ctranslate2.specs import common_spec, transformer_spec as ts

    cfg = model.cfg
    if cfg.positions in ("rope", "alibi"):
        raise XfError(f"{cfg.positions} positions cannot be exported to CTranslate2 (sinusoidal or learned only)")
    activation = {"relu": common_spec.Activation.RELU, "gelu": common_spec.Activation.GELU,
                  "swish": common_spec.Activation.SWISH, "swiglu": common_spec.Activation.SWISH}[cfg.activation]
    # TransformerSpec.from_config has no head size; its encoder and decoder specs do, and write it
    # only where it is not d_model / heads (--head-dim, Table 3 row B)
    head_dim = None if cfg.head_dim * cfg.heads == cfg.d_model else cfg.head_dim
    both = dict(pre_norm=cfg.normalize_before, activation=activation, ffn_glu=cfg.activation == "swiglu",
                head_dim=head_dim)
    spec = ts.TransformerSpec(ts.TransformerEncoderSpec(cfg.encoder_layers, cfg.heads, **both),
                              ts.TransformerDecoderSpec(cfg.decoder_layers, cfg.heads, **both))
    spec.decoder.start_from_zero_embedding = cfg.decoder_start == "zero"  # CTranslate2's flag for Marian's start
    np_ = lambda t: t.detach().float().cpu().numpy()  # noqa: E731
    if cfg.positions == "sinusoidal":
        positions = np_(model.pos_table)
    else:
        positions = np_(model.learned_pos.weight)

    def linear(spec_linear, weight, bias=None):
        spec_linear.weight = np_(weight)
        if bias is not None:
            spec_linear.bias = np_(bias)

    def norm(spec_norm, ln):
        spec_norm.gamma, spec_norm.beta = np_(ln.weight), np_(ln.bias)

    def ffn(spec_ffn, module, block):
        norm(spec_ffn.layer_norm, block.norm)
        if cfg.activation == "swiglu":  # xf: silu(gate) * value, gate and value stacked in fc1
            linear(spec_ffn.linear_0, module.fc1.weight[: cfg.d_ff], module.fc1.bias[: cfg.d_ff])
            linear(spec_ffn.linear_0_noact, module.fc1.weight[cfg.d_ff :], module.fc1.bias[cfg.d_ff :])
        else:
            linear(spec_ffn.linear_0, module.fc1.weight, module.fc1.bias)
        linear(spec_ffn.linear_1, module.fc2.weight, module.fc2.bias)

    def self_attention(spec_attn, attn, block):
        norm(spec_attn.layer_norm, block.norm)
        linear(spec_attn.linear[0], attn.in_proj.weight, attn.in_proj.bias)  # fused q, k, v
        linear(spec_attn.linear[1], attn.out_proj.weight, attn.out_proj.bias)

    e = cfg.heads * cfg.head_dim  # the rows of each of q, k, v in in_proj
    for stack, embed in ((spec.encoder, model.encoder_embed), (spec.decoder, model.decoder_embed)):
        embeddings = stack.embeddings[0] if isinstance(stack.embeddings, list) else stack.embeddings
        embeddings.weight = np_(embed.weight)
        stack.scale_embeddings = cfg.scale_embedding  # sqrt(d_model), Sec. 3.4
        stack.position_encodings.encodings = positions
    for spec_layer, layer in zip(spec.encoder.layer, model.encoder_layers):
        self_attention(spec_layer.self_attention, layer.self_attn, layer.attn_block)
        ffn(spec_layer.ffn, layer.ffn, layer.ffn_block)
    for spec_layer, layer in zip(spec.decoder.layer, model.decoder_layers):
        self_attention(spec_layer.self_attention, layer.self_attn, layer.self_block)
        cross, w, b = layer.cross_attn, layer.cross_attn.in_proj.weight, layer.cross_attn.in_proj.bias
        norm(spec_layer.attention.layer_norm, layer.cross_block.norm)
        linear(spec_layer.attention.linear[0], w[:e], b[:e])  # q
        linear(spec_layer.attention.linear[1], w[e:], b[e:])  # fused k, v
        linear(spec_layer.attention.linear[2], cross.out_proj.weight, cross.out_proj.bias)
        ffn(spec_layer.ffn, layer.ffn, layer.ffn_block)
    if cfg.normalize_before:
        norm(spec.encoder.layer_norm, model.encoder_norm)
        norm(spec.decoder.layer_norm, model.decoder_norm)
    spec.decoder.projection.weight = np_(model.output_proj.weight)
    if model.output_bias is not None:
        spec.decoder.projection.bias = np_(model.output_bias)

    spec.register_source_vocabulary(list(pieces))
    spec.register_target_vocabulary(list(pieces))
    spec.config.unk_token, spec.config.eos_token = pieces[UNK_ID], pieces[EOS_ID]
    spec.config.bos_token = spec.config.decoder_start_token = pieces[BOS_ID]  # xf's target starts with bos
    spec.config.add_source_eos = True  # xf's source is ids + [eos]
    spec.config.layer_norm_epsilon = 1e-5  # torch's LayerNorm default
    return spec

def write_model_directory(directory: Path, model: Transformer, spm_model: bytes, quantization: str = "float32",
                          source: str = "checkpoint", meta: Optional[dict] = None) -> dict:
    """Write the CTranslate2 model directory of ``model`` (its sentencepiece model ``spm_model``)
    into ``directory``, created if missing, weights stored as ``quantization``; ``source`` (the
    checkpoint's path) is recorded in xf.json and names it in errors, as are the languages of
    the checkpoint's ``meta`` (a multilingual model's pairs: xf translate --target-lang puts the
    tag first from them). Returns xf.json's dict."""
    ct2 = import_ctranslate2()
    if quantization not in QUANTIZATIONS:
        raise XfError(f"quantization {quantization!r}: CTranslate2 weights are one of {', '.join(QUANTIZATIONS)}")
    sp = load_sentencepiece(spm_model, source)
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    if len(pieces) != model.cfg.vocab_size:
        raise XfError(f"{source}: model vocabulary {model.cfg.vocab_size} != sentencepiece vocabulary {len(pieces)}")
    spec = transformer_spec(model, pieces)
    spec.validate()
    spec.optimize(quantization=quantization)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    spec.save(str(directory))
    (directory / "spm.model").write_bytes(spm_model)
    info = {"format": "xf-ctranslate2", "version": 1, "checkpoint": source, "spm_sha256": spm_digest(spm_model),
            "max_positions": model.cfg.max_positions, "quantization": quantization, "ctranslate2": ct2.__version__,
            "languages": languages_of(meta or {})}
    (directory / "xf.json").write_text(json.dumps(info, indent=1) + "\n", encoding="utf-8")
    return info
