"""CTranslate2, xf's second engine: an xf model as a CTranslate2 model directory (the writer),
that directory checked (the reader), and ``xf translate``'s search over it (the engine).

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
rotary export is not verified). ``read_exported_model`` checks a directory before CTranslate2
reads it (CTranslate2's own errors do not name the file); ``CTranslate2Engine`` runs xf's search
rules where CTranslate2 allows them. This module never imports ctranslate2 at the top: it is an
extra (``import_ctranslate2`` says how to install it).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Optional, Sequence

import torch

from .checkpoint import spm_digest
from .config import file_number, option_range
from .engines import Engine, check_shortlist
from .languages import languages_of
from .model_facts import from_export
from .errors import XfError
from .json_input import read_json
from .model import Transformer
from .options import ModelConfig, TranslateOptions
from .precision import ct2_compute_type, ct2_precisions, resolve_precision
from .search import Hypothesis, length_penalty, max_output_lengths
from .shortlist import Shortlist, vocabulary_map
from .vocab import BOS_ID, EOS_ID, PAD_ID, UNK_ID, load_sentencepiece

QUANTIZATIONS = ("float32", "int8", "bfloat16")  # the weight types of an exported model (xf export --quantization)


def import_ctranslate2():
    """The ctranslate2 module, or a one-line error saying how to install it."""
    try:
        import ctranslate2
    except ImportError:
        raise XfError("ctranslate2 is not installed: pip install 'xformer-cli[ctranslate2]'") from None
    return ctranslate2


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


# -- reading ----------------------------------------------------------------------------------------
def read_exported_model(path: Path) -> dict:
    """xf.json of a directory written by xf export, after checking what CTranslate2 would report
    without naming the file: config.json and xf.json must be JSON objects, and spm.model must be
    the one exported (xf.json's spm_sha256). Returns xf.json's dict."""
    found = {}
    for name in ("config.json", "xf.json"):
        found[name] = read_json(path / name, hint="export the model again")
        if not isinstance(found[name], dict):
            raise XfError(f"{path / name}: not a JSON object; export the model again")
    info = found["xf.json"]
    try:
        file_number(info, "max_positions", str(path / "xf.json"), int, option_range(ModelConfig, "max_positions"))
    except XfError as e:
        raise XfError(f"{e}; export the model again") from None
    if not isinstance(info.get("languages", {}), dict):
        raise XfError(f"{path / 'xf.json'}: 'languages' is not a JSON object; export the model again")
    try:
        spm_bytes = (path / "spm.model").read_bytes()
    except OSError as e:
        raise XfError(f"{path / 'spm.model'}: unreadable ({e.strerror or e}); export the model again") from None
    recorded = info.get("spm_sha256")
    if recorded and hashlib.sha256(spm_bytes).hexdigest() != recorded:
        raise XfError(f"{path / 'spm.model'}: not the sentencepiece model this directory was exported with (its sha256 "
                      "differs from xf.json's spm_sha256); export the model again")
    return info


# -- the engine -------------------------------------------------------------------------------------
def _with_vocabulary_map(model_dir: Path, shortlist_path: str, sp):
    """A temporary directory of links to model_dir's files plus the shortlist as vmap.txt:
    CTranslate2 reads its vocabulary map from the model directory, which stays untouched."""
    import os
    import tempfile

    shortlist = Shortlist.load(shortlist_path)
    check_shortlist(shortlist, shortlist_path, sp)
    tmp = tempfile.TemporaryDirectory(prefix="xf-ct2-vmap-")
    for f in model_dir.iterdir():
        if f.name != "vmap.txt":
            os.symlink(f.resolve(), Path(tmp.name) / f.name)
    (Path(tmp.name) / "vmap.txt").write_text(vocabulary_map(shortlist, [sp.id_to_piece(i) for i in range(sp.get_piece_size())]),
                                             encoding="utf-8")
    return tmp


class CTranslate2Engine(Engine):
    """xf translate's search over an exported model, with xf's rules where CTranslate2 allows:

    - CTranslate2 returns its beam_size finished hypotheses (it also stops at beam_size finished,
      as xf) with their log-probabilities (length_penalty 0: no normalization), which xf re-ranks
      with its own length penalty (GNMT by default; CTranslate2's is |Y|^alpha);
    - CTranslate2 never forces eos at the length limit: a hypothesis that stops there is given
      its eos by ``score_batch``, which scores it, as xf would; jsonl output takes every
      hypothesis's per-token log-probabilities from ``score_batch`` too;
    - empty outputs are allowed (min_decoding_length 0), as in xf;
    - the length limit a*|X|+b is one per CTranslate2 call: a batch runs at its longest
      sentence's limit, and a sentence with a hypothesis beyond its own limit runs again alone;
    - pad and bos are suppressed, as in xf. Sampling and ensembles are xf-engine only;
    - target prefixes are its target_prefix; --alternatives its return_alternatives, which
      completes each alternative with its one best hypothesis by log-probability (length_penalty
      0), where xf's is the best by --lenpen: the two agree at --lenpen 0 or beam 1.
    """

    def __init__(self, translator, sp, max_positions: int, vocabulary_map=None):
        self.translator, self.sp = translator, sp
        self.vocabulary_map = vocabulary_map  # the directory CTranslate2 read vmap.txt from, or None
        self.max_positions = max_positions
        self.device = torch.device("cpu")
        self.max_source = max_positions - 1  # room for the source's eos
        self.pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
        self.ids = {p: i for i, p in enumerate(self.pieces)}

    @classmethod
    def open(cls, path: str | Path, device: str = "auto", precision: str = "auto", quantize: str = "none",
             threads: int = 0, workers: int = 1, shortlist: Optional[str] = None):
        """(engine, sentencepiece processor) of the directory ``path`` written by xf export
        ctranslate2: on ``device`` (auto, cpu, cuda) in ``precision`` (resolve_precision's rule
        for this engine), ``workers`` parallel batches (CTranslate2's inter_threads) sharing
        ``threads`` (0: CTranslate2's default), candidates limited to the shortlist file
        ``shortlist`` (its vocabulary map)."""
        ct2 = import_ctranslate2()
        path = Path(path)
        if not (path / "model.bin").is_file() or not (path / "xf.json").is_file():
            raise XfError(f"{path}: not a model directory written by xf export ctranslate2")
        info = read_exported_model(path)
        sp = load_sentencepiece((path / "spm.model").read_bytes(), str(path / "spm.model"))
        if device == "auto":
            device = "cuda" if ct2.get_cuda_device_count() > 0 else "cpu"
        if device == "cuda" and ct2.get_cuda_device_count() == 0:
            raise XfError("--device cuda: no CUDA device is available to CTranslate2")
        available = ct2_precisions(set(ct2.get_supported_compute_types(device)))
        precision = resolve_precision(torch.device(device), precision, quantize, available, "ctranslate2")
        compute_type = ct2_compute_type(precision, quantize)
        vmap = None
        if shortlist is not None:
            vmap = _with_vocabulary_map(path, shortlist, sp)
        try:
            intra = threads  # 0: CTranslate2's default
            if workers > 1:
                intra = max(1, (threads or torch.get_num_threads()) // workers)
            translator = ct2.Translator(vmap.name if vmap else str(path), device=device, compute_type=compute_type,
                                        intra_threads=intra, inter_threads=workers)
        except (RuntimeError, ValueError) as e:  # a damaged model.bin: "invalid payload size", ...
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise XfError(f"{path / 'model.bin'}: damaged CTranslate2 model ({first}); export it again") from None
        engine = cls(translator, sp, int(info["max_positions"]), vmap)
        engine.device = torch.device(device)
        engine.facts = from_export(info, path)  # exports before languages were recorded: bilingual
        return engine, sp

    def search(self, sentences: Sequence[Sequence[int]], options: TranslateOptions, generator=None,
               prefixes: Optional[Sequence[Sequence[int]]] = None, constraints=None) -> list[list[Hypothesis]]:
        """As ``Engine.search``; a target prefix is CTranslate2's target_prefix, alternatives its
        return_alternatives (the prefix raises a sentence's length limit to its length, as xf).
        CTranslate2 has no lexical constraints."""
        lengths = torch.tensor([len(s) for s in sentences])
        limits = max_output_lengths(lengths, options.max_len_a, options.max_len_b, self.max_positions).tolist()
        sources = [[self.pieces[t] for t in s] for s in sentences]
        targets = [[self.pieces[t] for t in p] for p in prefixes] if prefixes else [[] for _ in sentences]
        limits = [max(limit, len(p)) for limit, p in zip(limits, targets)]
        results = self._search(sources, targets, max(limits), options)
        again: dict[int, list[int]] = {}  # limit -> sentences with a hypothesis beyond their own limit
        for i, limit in enumerate(limits):
            if limit < max(limits) and any(len(tokens) > limit for tokens, _ in results[i]):
                again.setdefault(limit, []).append(i)
        for limit, idx in again.items():
            for i, hyps in zip(idx, self._search([sources[i] for i in idx], [targets[i] for i in idx], limit, options)):
                results[i] = hyps
        return self._rank(sources, results, options)

    def _search(self, sources: list[list[str]], targets: list[list[str]], limit: int,
                options: TranslateOptions) -> list[list[tuple]]:
        """(tokens without eos, log-probability with eos or None) of the beam_size hypotheses
        CTranslate2 finishes per sentence (with alternatives: one per alternative); None where it
        stopped at the limit without eos. targets: each sentence's target prefix (pieces)."""
        if limit == 0:
            return [[((), None)] for _ in sources]  # only eos may follow bos
        eos = self.pieces[EOS_ID]
        steer = dict(target_prefix=targets) if any(targets) or options.alternatives else {}
        out = self.translator.translate_batch(
            sources, beam_size=options.beam_size, num_hypotheses=options.alternatives or options.beam_size,
            length_penalty=0.0, max_decoding_length=limit, min_decoding_length=0, return_end_token=True,
            return_scores=True, return_alternatives=bool(options.alternatives),
            suppress_sequences=[[self.pieces[PAD_ID]], [self.pieces[BOS_ID]]], use_vmap=self.vocabulary_map is not None,
            **steer,
        )
        return [[(tuple(h[:-1]), score) if h and h[-1] == eos else (tuple(h), None)
                 for h, score in zip(r.hypotheses, r.scores)] for r in out]

    def _rank(self, sources: list[list[str]], results: list[list[tuple]], options: TranslateOptions) -> list[list[Hypothesis]]:
        """Rank each sentence's hypotheses by xf's length penalty. score_batch (one call) scores
        the hypotheses cut at the limit (with a forced eos) and, for jsonl, every hypothesis, for
        its per-token log-probabilities; text output leaves positional_scores empty. Alternatives
        stay in CTranslate2's order (most likely first token first), one each."""
        per_token = options.output_format == "jsonl"
        todo = [(i, j) for i, hyps in enumerate(results) for j, (_, score) in enumerate(hyps) if per_token or score is None]
        scored = self.translator.score_batch([sources[i] for i, _ in todo], [list(results[i][j][0]) for i, j in todo]) if todo else []
        positional = {key: list(r.log_probs) for key, r in zip(todo, scored)}  # eos included
        out = []
        for i, hyps in enumerate(results):
            ranked, seen = [], set()
            for j, (tokens, score) in enumerate(hyps):
                if tokens in seen and not options.alternatives:
                    continue
                seen.add(tokens)
                pos = positional.get((i, j), [])
                total = sum(pos) if pos else score  # score_batch's sum where there is one (closer to xf's)
                ids = [self.ids[p] for p in tokens] + [EOS_ID]
                ranked.append(Hypothesis(ids, total / length_penalty(len(ids), options.lenpen, options.lenpen_style), pos))
            if options.alternatives:
                out.append(ranked)
                continue
            ranked.sort(key=lambda h: -h.score)
            out.append(ranked[: options.nbest])
        return out
