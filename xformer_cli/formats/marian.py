"""xf models as Marian models (marian-nmt/marian-dev, and the Marian builds under Bergamot,
translateLocally and pymarian): ``marian_params`` gives the weights under Marian's names,
``marian_config`` its model configuration (the ``special:model.yml`` of a model.npz),
``write_marian_model`` the files of a model directory; ``xf export marian`` owns the options,
the output guard and the summary.

Marian's transformer (src/models/transformer.h) computes x W + b with W as (in, out), so every
weight is torch's transposed; its names are these, layers counted from 1:

    xf                                   Marian
    encoder_embed / decoder_embed        Wemb (tied-embeddings-all) or encoder_Wemb, decoder_Wemb
    output_proj (untied)                 decoder_ff_logit_out_Wt (V, D); tied: Wemb or decoder_Wemb
    output_bias (zeros when absent)      decoder_ff_logit_out_b (1, V)
    layers.N.self_attn.in_proj (q,k,v)   {encoder,decoder}_lN_self_Wq, _bq, _Wk, _bk, _Wv, _bv
    .out_proj, block norm                ..._self_Wo, _bo, _self_Wo_ln_scale, _self_Wo_ln_bias
    cross_attn, cross_block.norm         decoder_lN_context_W*, _b*, _context_Wo_ln_scale/_bias
    ffn.fc1, ffn.fc2, ffn_block.norm     _ffn_W1, _ffn_b1, _ffn_W2, _ffn_b2, _ffn_ffn_ln_scale/_bias

The residual stream is permuted as for MarianMT (``huggingface.residual_permutation``: Marian's
sinusoids too put every sine in the first half of the model dimension), and the weights are
otherwise the MarianMT export's (``huggingface.marian_state_dict``), renamed and transposed.

Two of Marian's conventions are not the paper's, and no weight can carry the difference: its
sinusoids use tensor2tensor's frequencies, 10000^(-i/(D/2-1)) for the i-th sine, and its decoder
starts from a zero vector, not from a token's embedding. An xf model trained with
``--sinusoids tensor2tensor --decoder-start zero`` computes what Marian computes (per-token
log-probabilities equal to 1e-4; Marian's layer norm adds 1e-6 to the variance, torch's 1e-5); any
other is refused: with the paper's conventions not one of 200 test translations came out the same.
Special ids need no reordering: Marian takes eos and unk from the sentencepiece model (xf's 3
and 1), and never feeds its pad or bos.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Optional

import numpy as np
import torch
import yaml

from ..model.facts import facts_from_config
from ..model.transformer import Transformer
from ..text.vocab import MappedVocabulary, load_sentencepiece
from .huggingface import ACTIVATIONS, marian_state_dict

# MarianMT's name of a layer tensor (huggingface.tensor_pairs) -> Marian's, after the layer prefix
_LAYER_NAMES = {
    "self_attn": "self", "encoder_attn": "context",
    "q_proj.weight": "Wq", "q_proj.bias": "bq", "k_proj.weight": "Wk", "k_proj.bias": "bk",
    "v_proj.weight": "Wv", "v_proj.bias": "bv", "out_proj.weight": "Wo", "out_proj.bias": "bo",
}
_NORMS = {"self_attn_layer_norm": "self_Wo_ln", "encoder_attn_layer_norm": "context_Wo_ln",
          "final_layer_norm": "ffn_ffn_ln"}
_FFN = {"fc1.weight": "ffn_W1", "fc1.bias": "ffn_b1", "fc2.weight": "ffn_W2", "fc2.bias": "ffn_b2"}


def refuse_unmarian(model: Transformer, where: str = "checkpoint", spm_model: Optional[bytes] = None) -> None:
    """A one-line error naming every option Marian's transformer cannot hold in ``model``
    (``model.facts.marian_reasons``: the record's rule); given the checkpoint's ``spm_model``,
    a mapped vocabulary too (Marian reads one sentencepiece model's ids)."""
    mapped = spm_model is not None and isinstance(load_sentencepiece(spm_model, where), MappedVocabulary)
    facts_from_config(model.cfg, mapped=mapped, where=where).refuse_export("marian")


def _marian_name(hf_name: str) -> str:
    """Marian's name of a MarianMT layer tensor, e.g. model.decoder.layers.0.encoder_attn.q_proj.weight
    -> decoder_l1_context_Wq."""
    _, side, _, index, rest = hf_name.split(".", 4)
    prefix = f"{side}_l{int(index) + 1}_"
    module, _, tail = rest.partition(".")
    if module in _NORMS:
        return prefix + _NORMS[module] + ("_scale" if tail == "weight" else "_bias")
    if module in ("self_attn", "encoder_attn"):
        return prefix + _LAYER_NAMES[module] + "_" + _LAYER_NAMES[tail]
    return prefix + _FFN[rest]


def marian_params(model: Transformer) -> dict[str, np.ndarray]:
    """Marian's parameters of ``model``: name -> float32 array in Marian's layout (weights
    (in, out), biases and norms (1, n), embeddings (V, D)), the residual stream permuted."""
    out: dict[str, np.ndarray] = {}
    for name, t in marian_state_dict(model).items():
        if name == "model.shared.weight":
            out["Wemb"] = t
        elif name.startswith("model.") and name.endswith("embed_tokens.weight"):
            out[f"{name.split('.')[1]}_Wemb"] = t
        elif name == "lm_head.weight":
            out["decoder_ff_logit_out_Wt"] = t  # (V, D): Marian's transposed output layer
        elif name == "final_logits_bias":
            out["decoder_ff_logit_out_b"] = t.view(1, -1)
        else:
            out[_marian_name(name)] = t.t() if t.dim() == 2 else t.view(1, -1)
    return {k: np.ascontiguousarray(v.numpy(), dtype=np.float32) for k, v in out.items()}


def marian_config(model: Transformer) -> dict:
    """Marian's model configuration of ``model`` (the YAML of ``special:model.yml``): a post-LN
    transformer ("dan" after each sub-layer, nothing before), Marian's sinusoids, the embeddings
    tied as xf ties them."""
    cfg = model.cfg
    return {
        "type": "transformer", "dim-vocabs": [cfg.vocab_size, cfg.vocab_size], "dim-emb": cfg.d_model,
        "enc-depth": cfg.encoder_layers, "dec-depth": cfg.decoder_layers,
        "transformer-heads": cfg.heads, "transformer-dim-ffn": cfg.d_ff, "transformer-decoder-dim-ffn": cfg.d_ff,
        "transformer-ffn-depth": 2, "transformer-decoder-ffn-depth": 2,
        "transformer-ffn-activation": ACTIVATIONS[cfg.activation],
        "transformer-decoder-autoreg": "self-attention", "transformer-tied-layers": [],
        "transformer-preprocess": "", "transformer-postprocess": "dan", "transformer-postprocess-emb": "d",
        "transformer-postprocess-top": "", "transformer-train-position-embeddings": False,
        "transformer-depth-scaling": False, "transformer-no-projection": False,
        "tied-embeddings-all": cfg.share_embeddings == "all", "tied-embeddings-src": cfg.share_embeddings == "all",
        "tied-embeddings": cfg.share_embeddings == "decoder", "output-omit-bias": False,
        "skip": False, "layer-normalization": False, "right-left": False,
    }


def yaml_text(data: dict) -> str:
    """``data`` as YAML, keys in their order, lists inline as Marian writes them."""
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=None, allow_unicode=True)


def model_yml_item(config: dict) -> np.ndarray:
    """The ``special:model.yml`` entry of a model.npz as Marian writes it (common/io.cpp
    addMetaToItems): the YAML's bytes, 0-terminated, zero-padded to a multiple of 256, as int8."""
    data = yaml_text(config).encode("utf-8") + b"\0"
    data += b"\0" * (-len(data) % 256)
    return np.frombuffer(data, dtype=np.int8)


def npz_bytes(model: Transformer) -> bytes:
    """model.npz: Marian's parameters of ``model`` and its ``special:model.yml``."""
    items = {**marian_params(model), "special:model.yml": model_yml_item(marian_config(model))}
    buffer = io.BytesIO()
    np.savez(buffer, **items)
    return buffer.getvalue()


def decoder_config(beam_size: int = 4, lenpen: float = 1.0, max_length_factor: float = 3.0) -> dict:
    """decoder.yml: what ``marian-decoder -c decoder.yml`` needs beside the model. xf's search
    as Marian has it: beam ``beam_size``, score / |Y|^lenpen with |Y| counting eos (Marian's
    --normalize is xf's --lenpen-style length), unk allowed as xf allows it; paths relative to
    decoder.yml. Marian's length limit is max-length-factor x the longest source in its batch (3,
    its default), xf's a*|X|+b per sentence (|X|+50)."""
    return {"relative-paths": True, "models": ["model.npz"], "vocabs": ["vocab.spm", "vocab.spm"],
            "beam-size": beam_size, "normalize": lenpen, "word-penalty": 0, "allow-unk": True,
            "max-length-factor": max_length_factor, "mini-batch": 16, "maxi-batch": 100, "maxi-batch-sort": "src"}


def write_marian_model(directory: Path, model: Transformer, spm_model: bytes, where: str = "checkpoint",
                       beam_size: int = 4, lenpen: float = 1.0) -> dict:
    """Write model.npz, vocab.spm and decoder.yml of ``model`` into the existing ``directory``;
    ``spm_model``: the checkpoint's sentencepiece model. Returns the model configuration."""
    refuse_unmarian(model, where, spm_model)
    directory = Path(directory)
    with torch.no_grad():
        (directory / "model.npz").write_bytes(npz_bytes(model))
    (directory / "vocab.spm").write_bytes(spm_model)
    (directory / "decoder.yml").write_text(yaml_text(decoder_config(beam_size, lenpen)), encoding="utf-8")
    return marian_config(model)
