"""The translation engines behind ``xf translate`` (and anything else that decodes text):
xf's own search over one model or an ensemble, and CTranslate2 over an exported model.

Both speak one small interface (``Engine``): ``search(sentences, options)`` gives each sentence's
hypotheses best first; ``max_source`` is the longest source it takes; ``supports_alignments``
says whether ``alignments`` (a forced-decoding pass over the hypotheses) can be asked for.
``open_engine(options)`` opens the one ``--engine`` names.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Optional, Sequence

import torch

from . import distributed
from .attention_maps import hard_alignments, resolve_layer
from .checkpoint import load_ensemble, vocab_digest
from .batching import collate_source
from .errors import ConfigError, XfError
from .memory import bound_native_memory
from .model import Transformer
from .vocab import PAD_ID, BOS_ID, EOS_ID
from .options import TranslateOptions
from .precision import ct2_compute_type, ct2_precisions, precision_warning, resolve_precision
from .search import CompiledStep, Hypothesis, length_penalty, max_output_lengths, search
from .shortlist import Shortlist, vocabulary_map
from .vocab import MappedVocabulary, load_sentencepiece


class Engine:
    """What ``xf translate`` needs of an engine."""

    device: torch.device
    max_source: int  # the longest source (subwords, without eos) the engine takes
    supports_alignments: bool = False

    def search(self, sentences: Sequence[Sequence[int]], options: TranslateOptions,
               generator: Optional[torch.Generator] = None) -> list[list[Hypothesis]]:
        """Hypotheses of each sentence (subword ids without eos), best first."""
        raise NotImplementedError

    def alignments(self, sentences: Sequence[Sequence[int]], found: list[list[Hypothesis]], layer: int):
        """Per sentence, per hypothesis: the source position each target subword attends to most."""
        raise ConfigError("--print-alignment needs xf's own engine (the attention of --engine ctranslate2 "
                          "is not recorded)")

    def check_alignment_layer(self, layer: int) -> None:
        """Fail now, not at the first batch, when a model lacks the layer --alignment-layer names."""
        raise ConfigError("--print-alignment needs xf's own engine (the attention of --engine ctranslate2 "
                          "is not recorded)")


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


# -- loading -------------------------------------------------------------------------------------


def resolve_device(device: str, precision: str, quantize: str = "none") -> tuple[torch.device, str]:
    """The device and the precision (fp32, bf16 or fp16) that --device and --precision ask for."""
    resolved = distributed.resolve_device(device)
    return resolved, resolve_precision(resolved, precision, quantize)


def quantize_int8(model: Transformer, engine: str = "fbgemm") -> Transformer:
    """Dynamic int8 quantization of every linear layer, the output projection included (weights
    int8 per tensor, activations quantized on the fly): torch.ao's quantize_dynamic, deprecated in
    favour of torchao but the one that ships with torch. Embeddings and layer norms stay fp32.
    ``engine`` (--int8-engine) is torch's quantized engine, which packs the weights for its own
    kernels: fbgemm's pick AVX2, AVX-512 or VNNI at run time, oneDNN's AMX where the CPU has it.
    It is process-wide (torch.backends.quantized.engine): every model of one process uses one."""
    import warnings

    from torch import nn
    from torch.ao.quantization import quantize_dynamic

    from .model import MultiHeadAttention

    for module in model.modules():
        if isinstance(module, MultiHeadAttention):
            module.split_projections()
    torch.backends.quantized.engine = engine
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the deprecation warnings of torch.ao.quantization
        return quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8, inplace=True)


class XfEngine(Engine):
    """xf's own search (``search.py``) over one model or an ensemble: the default --engine."""

    def __init__(self, models: Sequence[Transformer], device: torch.device, shortlist: Optional[Shortlist] = None,
                 compiled: Optional[CompiledStep] = None):
        self.models, self.device, self.shortlist = list(models), device, shortlist
        self.compiled = compiled  # --compile: the compiled decoder step, with its compile time and graph count
        self.supports_alignments = True
        self.max_source = min(m.cfg.max_positions for m in models) - 1  # room for the source's eos

    def search(self, sentences: Sequence[Sequence[int]], options: TranslateOptions, generator=None) -> list[list[Hypothesis]]:
        """Hypotheses of each sentence (subword ids without eos), best first."""
        src = collate_source(sentences).to(self.device)
        candidates = self.shortlist.candidates(src) if self.shortlist is not None else None
        return search(self.models, src, options, generator, candidates, self.compiled)

    def alignments(self, sentences, found, layer):
        return hard_alignments(self.models, collate_source(sentences).to(self.device), found, layer)

    def check_alignment_layer(self, layer: int) -> None:
        for model in self.models:
            resolve_layer(layer, len(model.decoder_layers))


def open_engine(options: TranslateOptions):
    """(engine, sentencepiece processor, device) of --engine for --path."""
    warning = distributed.threads_warning(options.threads)
    if warning:
        print(f"xf: warning: {warning}", file=sys.stderr, flush=True)
    if options.engine == "ctranslate2":
        return CTranslate2Engine.open(options)
    bound_native_memory()  # decoding makes a new product shape at every step: oneDNN's cache stays bounded
    device, precision = resolve_device(options.device, options.precision, options.quantize)
    warning = precision_warning(device, precision)
    if warning:
        print(f"xf: warning: {warning}", file=sys.stderr, flush=True)
    workers = getattr(options, "workers", 1)
    if options.threads > 0 or workers > 1:  # each worker thread gets its share of the threads
        torch.set_num_threads(max(1, (options.threads or torch.get_num_threads()) // workers))
    shortlist = Shortlist.load(options.shortlist) if options.shortlist is not None else None  # fails before loading
    models, sp = load_ensemble(options.path, device, DTYPES[precision])
    if shortlist is not None:  # an ensemble shares one vocabulary: the first model's
        _check_shortlist(shortlist, options.shortlist, sp)
    if options.quantize == "int8":
        models = [quantize_int8(m, options.int8_engine) for m in models]
    return XfEngine(models, device, shortlist, CompiledStep() if options.compile else None), sp, device


def import_ctranslate2():
    """The ctranslate2 module, or a one-line error saying how to install it."""
    try:
        import ctranslate2
    except ImportError:
        raise XfError("ctranslate2 is not installed: pip install 'xformer-cli[ctranslate2]'") from None
    return ctranslate2


def read_exported_model(path: Path) -> dict:
    """xf.json of a directory written by xf export, after checking what CTranslate2 would report
    without naming the file: config.json and xf.json must be JSON objects, and spm.model must be
    the one exported (xf.json's spm_sha256). Returns xf.json's dict."""
    found = {}
    for name in ("config.json", "xf.json"):
        try:
            found[name] = json.loads((path / name).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise XfError(f"{path / name}: missing (export the model again)") from None
        except (OSError, UnicodeDecodeError) as e:
            raise XfError(f"{path / name}: unreadable ({e}); export the model again") from None
        except json.JSONDecodeError as e:
            raise XfError(f"{path / name}: line {e.lineno}: not valid JSON ({e.msg}); export the model again") from None
        if not isinstance(found[name], dict):
            raise XfError(f"{path / name}: not a JSON object; export the model again")
    info = found["xf.json"]
    if not isinstance(info.get("max_positions"), int):
        raise XfError(f"{path / 'xf.json'}: no max_positions; export the model again")
    try:
        spm_bytes = (path / "spm.model").read_bytes()
    except OSError as e:
        raise XfError(f"{path / 'spm.model'}: unreadable ({e.strerror or e}); export the model again") from None
    recorded = info.get("spm_sha256")
    if recorded and hashlib.sha256(spm_bytes).hexdigest() != recorded:
        raise XfError(f"{path / 'spm.model'}: not the sentencepiece model this directory was exported with (its sha256 "
                      "differs from xf.json's spm_sha256); export the model again")
    return info


def _check_shortlist(shortlist: Shortlist, path: str, sp) -> None:
    """Refuse the shortlist of file ``path`` unless it was built for sp's vocabulary."""
    shortlist.check_vocabulary(path, sp.get_piece_size(), vocab_digest(
        sp.to_bytes() if isinstance(sp, MappedVocabulary) else sp.serialized_model_proto()))


def _with_vocabulary_map(model_dir: Path, shortlist_path: str, sp):
    """A temporary directory of links to model_dir's files plus the shortlist as vmap.txt:
    CTranslate2 reads its vocabulary map from the model directory, which stays untouched."""
    import os
    import tempfile

    shortlist = Shortlist.load(shortlist_path)
    _check_shortlist(shortlist, shortlist_path, sp)
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
    - pad and bos are suppressed, as in xf. Sampling and ensembles are xf-engine only.
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
    def open(cls, options: TranslateOptions):
        """(engine, sentencepiece processor, device) for --engine ctranslate2 --path DIR."""
        ct2 = import_ctranslate2()
        if len(options.path) != 1:
            raise ConfigError("--engine ctranslate2 takes one --path (ensembles are xf-engine only)")
        if options.sampling:
            raise ConfigError("--engine ctranslate2 does not sample: use the xf engine for --sampling")
        path = Path(options.path[0])
        if not (path / "model.bin").is_file() or not (path / "xf.json").is_file():
            raise XfError(f"{path}: not a model directory written by xf export ctranslate2")
        info = read_exported_model(path)
        sp = load_sentencepiece((path / "spm.model").read_bytes(), str(path / "spm.model"))
        device = options.device
        if device == "auto":
            device = "cuda" if ct2.get_cuda_device_count() > 0 else "cpu"
        if device == "cuda" and ct2.get_cuda_device_count() == 0:
            raise XfError("--device cuda: no CUDA device is available to CTranslate2")
        available = ct2_precisions(set(ct2.get_supported_compute_types(device)))
        precision = resolve_precision(torch.device(device), options.precision, options.quantize, available,
                                      "ctranslate2")
        compute_type = ct2_compute_type(precision, options.quantize)
        vmap = None
        if options.shortlist is not None:
            vmap = _with_vocabulary_map(path, options.shortlist, sp)
        try:
            workers = getattr(options, "workers", 1)  # CTranslate2's own parallel batches (inter_threads)
            intra = options.threads  # 0: CTranslate2's default
            if workers > 1:
                intra = max(1, (options.threads or torch.get_num_threads()) // workers)
            translator = ct2.Translator(vmap.name if vmap else str(path), device=device, compute_type=compute_type,
                                        intra_threads=intra, inter_threads=workers)
        except (RuntimeError, ValueError) as e:  # a damaged model.bin: "invalid payload size", ...
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise XfError(f"{path / 'model.bin'}: damaged CTranslate2 model ({first}); export it again") from None
        engine = cls(translator, sp, int(info["max_positions"]), vmap)
        engine.device = torch.device(device)
        return engine, sp, engine.device

    def search(self, sentences: Sequence[Sequence[int]], options: TranslateOptions, generator=None) -> list[list[Hypothesis]]:
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
            suppress_sequences=[[self.pieces[PAD_ID]], [self.pieces[BOS_ID]]], use_vmap=self.vocabulary_map is not None,
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
