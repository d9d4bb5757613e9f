"""CTranslate2 interop: ``xf export ctranslate2`` and ``xf translate --engine ctranslate2``.

Export maps an xf checkpoint onto CTranslate2's ``TransformerSpec`` with its converter API and
writes a model directory (model.bin, vocabularies, config.json) with the checkpoint's
sentencepiece model (``spm.model``) and ``xf.json`` beside it. What maps to what:

    embeddings           encoder/decoder embeddings (one array when tied), scaled by sqrt(d_model)
    positions            xf's own table as the spec's position encodings: sinusoidal (interleaved
                         sin/cos from position 0, which is not CTranslate2's built-in table) or learned
    attention            self-attention: in_proj as one fused qkv linear; cross-attention: its q
                         rows, then its k/v rows fused, then out_proj
    feed-forward         fc1/fc2; SwiGLU: fc1's gate rows as linear_0, its value rows as linear_0_noact
    layer norms          post-LN (the paper's) or pre-LN with the final encoder/decoder norms
    output projection    the decoder's projection (tied or not)

RoPE and ALiBi models are refused (xf's encoder-side ALiBi has no CTranslate2 equivalent, and
rotary export is not verified). The CTranslate2 engine runs xf's search rules where CTranslate2
allows them: see ``CTranslate2Engine``.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Sequence

from .errors import ConfigError, XfError
from .fileio import fsync_dir
from .model import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Transformer
from .options import ExportOptions, TranslateOptions
from .search import Hypothesis, length_penalty, max_output_lengths

QUANTIZATIONS = {"float32": "float32", "int8": "int8", "bfloat16": "bfloat16"}


def import_ctranslate2():
    """The ctranslate2 module, or a one-line error saying how to install it."""
    try:
        import ctranslate2
    except ImportError:
        raise XfError("ctranslate2 is not installed: pip install 'xformer-cli[ctranslate2]'") from None
    return ctranslate2


# -- export --------------------------------------------------------------------------------------
def transformer_spec(model: Transformer, pieces: Sequence[str]):
    """CTranslate2 TransformerSpec of ``model`` with vocabulary ``pieces`` (id order)."""
    import_ctranslate2()
    from ctranslate2.specs import common_spec, transformer_spec as ts

    cfg = model.cfg
    if cfg.positions in ("rope", "alibi"):
        raise XfError(f"{cfg.positions} positions cannot be exported to CTranslate2 (sinusoidal or learned only)")
    activation = {"relu": common_spec.Activation.RELU, "gelu": common_spec.Activation.GELU,
                  "swiglu": common_spec.Activation.SWISH}[cfg.activation]
    spec = ts.TransformerSpec.from_config(
        (cfg.encoder_layers, cfg.decoder_layers), cfg.heads, pre_norm=cfg.normalize_before,
        activation=activation, ffn_glu=cfg.activation == "swiglu",
    )
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

    d = cfg.d_model
    for stack, embed in ((spec.encoder, model.encoder_embed), (spec.decoder, model.decoder_embed)):
        embeddings = stack.embeddings[0] if isinstance(stack.embeddings, list) else stack.embeddings
        embeddings.weight = np_(embed.weight)
        stack.scale_embeddings = True  # sqrt(d_model), Sec. 3.4
        stack.position_encodings.encodings = positions
    for spec_layer, layer in zip(spec.encoder.layer, model.encoder_layers):
        self_attention(spec_layer.self_attention, layer.self_attn, layer.attn_block)
        ffn(spec_layer.ffn, layer.ffn, layer.ffn_block)
    for spec_layer, layer in zip(spec.decoder.layer, model.decoder_layers):
        self_attention(spec_layer.self_attention, layer.self_attn, layer.self_block)
        cross, w, b = layer.cross_attn, layer.cross_attn.in_proj.weight, layer.cross_attn.in_proj.bias
        norm(spec_layer.attention.layer_norm, layer.cross_block.norm)
        linear(spec_layer.attention.linear[0], w[:d], b[:d])  # q
        linear(spec_layer.attention.linear[1], w[d:], b[d:])  # fused k, v
        linear(spec_layer.attention.linear[2], cross.out_proj.weight, cross.out_proj.bias)
        ffn(spec_layer.ffn, layer.ffn, layer.ffn_block)
    if cfg.normalize_before:
        norm(spec.encoder.layer_norm, model.encoder_norm)
        norm(spec.decoder.layer_norm, model.decoder_norm)
    spec.decoder.projection.weight = np_(model.output_proj.weight)

    spec.register_source_vocabulary(list(pieces))
    spec.register_target_vocabulary(list(pieces))
    spec.config.unk_token, spec.config.eos_token = pieces[UNK_ID], pieces[EOS_ID]
    spec.config.bos_token = spec.config.decoder_start_token = pieces[BOS_ID]  # xf's target starts with bos
    spec.config.add_source_eos = True  # xf's source is ids + [eos]
    spec.config.layer_norm_epsilon = 1e-5  # torch's LayerNorm default
    return spec


def export_ctranslate2(options: ExportOptions) -> Path:
    """Write the CTranslate2 model directory of options.path to options.output, atomically:
    built in a temporary directory beside it, then renamed into place."""
    from .checkpoint import load_checkpoint, model_from_checkpoint
    from .vocab import load_sentencepiece

    ct2 = import_ctranslate2()
    output = Path(options.output)
    if output.exists() and (not output.is_dir() or any(output.iterdir())) and not options.overwrite:
        raise XfError(f"{output}: exists and is not an empty directory (--overwrite replaces it)")
    parent = output.resolve().parent
    if not parent.is_dir():
        raise XfError(f"{output}: its directory does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise XfError(f"{output}: its directory {parent} is not writable")
    ckpt = load_checkpoint(options.path)
    sp = load_sentencepiece(ckpt["spm_model"], str(options.path))
    model = model_from_checkpoint(ckpt, options.path).eval()
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    if len(pieces) != model.cfg.vocab_size:
        raise XfError(f"{options.path}: model vocabulary {model.cfg.vocab_size} != sentencepiece vocabulary {len(pieces)}")
    spec = transformer_spec(model, pieces)
    spec.validate()
    spec.optimize(quantization=QUANTIZATIONS[options.quantization])
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{output.name}.", dir=parent))
    except OSError as e:
        raise XfError(f"{output}: cannot write there: {e.strerror}") from None
    try:
        umask = os.umask(0)
        os.umask(umask)
        tmp.chmod(0o777 & ~umask)  # mkdtemp makes it private; the result is an ordinary directory
        spec.save(str(tmp))
        (tmp / "spm.model").write_bytes(ckpt["spm_model"])
        info = {"format": "xf-ctranslate2", "version": 1, "checkpoint": str(options.path),
                "spm_sha256": ckpt.get("spm_sha256"), "max_positions": model.cfg.max_positions,
                "quantization": options.quantization, "ctranslate2": ct2.__version__}
        (tmp / "xf.json").write_text(json.dumps(info, indent=1) + "\n", encoding="utf-8")
        if output.exists():
            shutil.rmtree(output) if output.is_dir() else output.unlink()
        os.replace(tmp, output)
    except OSError as e:
        raise XfError(f"{output}: cannot write the model: {e.strerror or e}") from None
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    fsync_dir(parent)
    return output


# -- the ctranslate2 engine ----------------------------------------------------------------------
class CTranslate2Engine:
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
    - pad and bos are suppressed, as in xf. Sampling and ensembles are xf-engine only.
    """

    def __init__(self, translator, sp, max_positions: int):
        self.translator, self.sp = translator, sp
        self.max_positions = max_positions
        self.max_source = max_positions - 1  # room for the source's eos
        self.pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
        self.ids = {p: i for i, p in enumerate(self.pieces)}

    @classmethod
    def open(cls, options: TranslateOptions):
        """(engine, sentencepiece processor, device) for --engine ctranslate2 --path DIR."""
        import torch

        from .precision import cpu_bf16_instructions
        from .vocab import load_sentencepiece

        ct2 = import_ctranslate2()
        if len(options.path) != 1:
            raise ConfigError("--engine ctranslate2 takes one --path (ensembles are xf-engine only)")
        if options.sampling:
            raise ConfigError("--engine ctranslate2 does not sample: use the xf engine for --sampling")
        path = Path(options.path[0])
        if not (path / "model.bin").is_file() or not (path / "xf.json").is_file():
            raise XfError(f"{path}: not a model directory written by xf export ctranslate2")
        try:
            info = json.loads((path / "xf.json").read_text(encoding="utf-8"))
            sp = load_sentencepiece((path / "spm.model").read_bytes(), str(path / "spm.model"))
        except (OSError, ValueError) as e:
            raise XfError(f"{path}: unreadable exported model: {e}") from None
        device = options.device
        if device == "auto":
            device = "cuda" if ct2.get_cuda_device_count() > 0 else "cpu"
        if device == "cuda" and ct2.get_cuda_device_count() == 0:
            raise XfError("--device cuda: no CUDA device is available to CTranslate2")
        compute_type = ct2_compute_type(device, options.precision, options.quantize, bool(cpu_bf16_instructions()))
        translator = ct2.Translator(str(path), device=device, compute_type=compute_type,
                                    intra_threads=max(options.threads, 0), inter_threads=1)
        return cls(translator, sp, int(info["max_positions"])), sp, torch.device(device)

    def search(self, sentences: Sequence[Sequence[int]], options: TranslateOptions, generator=None) -> list[list[Hypothesis]]:
        import torch

        if options.sampling:
            raise ConfigError("--engine ctranslate2 does not sample: use the xf engine for --sampling")
        lengths = torch.tensor([len(s) for s in sentences])
        limits = max_output_lengths(lengths, options.max_len_a, options.max_len_b, self.max_positions).tolist()
        sources = [[self.pieces[t] for t in s] for s in sentences]
        results = self._search(sources, max(limits), options)
        again: dict[int, list[int]] = {}  # limit -> sentences with a hypothesis beyond their own limit
        for i, limit in enumerate(limits):
            if limit < max(limits) and any(len(tokens) > limit for tokens, _ in results[i]):
                again.setdefault(limit, []).append(i)
        for limit, idx in again.items():
            for i, hyps in zip(idx, self._search([sources[i] for i in idx], limit, options)):
                results[i] = hyps
        return self._rank(sources, results, options)

    def _search(self, sources: list[list[str]], limit: int, options: TranslateOptions) -> list[list[tuple]]:
        """(tokens without eos, log-probability with eos or None) of the beam_size hypotheses
        CTranslate2 finishes per sentence; None where it stopped at the limit without eos."""
        if limit == 0:
            return [[((), None)] for _ in sources]  # only eos may follow bos
        eos = self.pieces[EOS_ID]
        out = self.translator.translate_batch(
            sources, beam_size=options.beam_size, num_hypotheses=options.beam_size, length_penalty=0.0,
            max_decoding_length=limit, min_decoding_length=0, return_end_token=True, return_scores=True,
            suppress_sequences=[[self.pieces[PAD_ID]], [self.pieces[BOS_ID]]],
        )
        return [[(tuple(h[:-1]), score) if h and h[-1] == eos else (tuple(h), None)
                 for h, score in zip(r.hypotheses, r.scores)] for r in out]

    def _rank(self, sources: list[list[str]], results: list[list[tuple]], options: TranslateOptions) -> list[list[Hypothesis]]:
        """Rank each sentence's hypotheses by xf's length penalty. score_batch (one call) scores
        the hypotheses cut at the limit (with a forced eos) and, for jsonl, every hypothesis, for
        its per-token log-probabilities; text output leaves positional_scores empty."""
        per_token = options.output_format == "jsonl"
        todo = [(i, j) for i, hyps in enumerate(results) for j, (_, score) in enumerate(hyps) if per_token or score is None]
        scored = self.translator.score_batch([sources[i] for i, _ in todo], [list(results[i][j][0]) for i, j in todo]) if todo else []
        positional = {key: list(r.log_probs) for key, r in zip(todo, scored)}  # eos included
        out = []
        for i, hyps in enumerate(results):
            ranked, seen = [], set()
            for j, (tokens, score) in enumerate(hyps):
                if tokens in seen:
                    continue
                seen.add(tokens)
                pos = positional.get((i, j), [])
                total = sum(pos) if pos else score  # score_batch's sum where there is one (closer to xf's)
                ids = [self.ids[p] for p in tokens] + [EOS_ID]
                ranked.append(Hypothesis(ids, total / length_penalty(len(ids), options.lenpen, options.lenpen_style), pos))
            ranked.sort(key=lambda h: -h.score)
            out.append(ranked[: options.nbest])
        return out


def ct2_compute_type(device: str, precision: str, quantize: str, native_bf16: bool) -> str:
    """CTranslate2's compute_type for xf's --precision and --quantize (same meanings)."""
    if quantize == "int8":
        if device != "cpu":
            raise ConfigError("--quantize int8 is for CPUs; on CUDA use --precision")
        return "int8"
    if precision == "auto":
        precision = "bf16" if (device == "cuda" or native_bf16) else "fp32"
    return {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}[precision]
