"""The translation engine interface, and xf's own engine: search over one model or an ensemble.

Every engine speaks one small interface (``Engine``): ``search(sentences, options)`` gives each
sentence's hypotheses best first; ``max_source`` is the longest source it takes;
``supports_alignments`` says whether ``alignments`` (a forced-decoding pass over the hypotheses)
can be asked for. ``XfEngine`` is xf's search (``search.py``); the CTranslate2 engine is in
``ctranslate2_format.py``, and ``translation.open_engine`` opens the one ``--engine`` names.
"""

from __future__ import annotations

import sys
from typing import Optional, Sequence

import torch

from . import distributed
from .attention_maps import hard_alignments, resolve_layer
from .batching import collate_source
from .checkpoint import load_ensemble, vocab_digest
from .errors import ConfigError
from .memory import bound_native_memory
from .model import Transformer
from .options import TranslateOptions
from .precision import precision_warning, resolve_precision
from .search import CompiledStep, Hypothesis, search
from .shortlist import Shortlist
from .vocab import MappedVocabulary


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

    @classmethod
    def open(cls, paths: Sequence[str], device: str = "auto", precision: str = "auto", quantize: str = "none",
             int8_engine: str = "fbgemm", threads: int = 0, workers: int = 1, shortlist: Optional[str] = None,
             compile_step: bool = False):
        """(engine, sentencepiece processor) of the checkpoints ``paths`` (an ensemble when more
        than one): on ``device`` in ``precision`` (resolve_device), int8 with ``quantize``,
        ``workers`` decoding threads sharing ``threads`` (0: torch's), candidates limited to the
        shortlist file ``shortlist``, the decoder step compiled with ``compile_step``."""
        bound_native_memory()  # decoding makes a new product shape at every step: oneDNN's cache stays bounded
        device, precision = resolve_device(device, precision, quantize)
        warning = precision_warning(device, precision)
        if warning:
            print(f"xf: warning: {warning}", file=sys.stderr, flush=True)
        if threads > 0 or workers > 1:  # each worker thread gets its share of the threads
            torch.set_num_threads(max(1, (threads or torch.get_num_threads()) // workers))
        loaded = Shortlist.load(shortlist) if shortlist is not None else None  # fails before loading
        models, sp = load_ensemble(paths, device, DTYPES[precision])
        if loaded is not None:  # an ensemble shares one vocabulary: the first model's
            check_shortlist(loaded, shortlist, sp)
        if quantize == "int8":
            models = [quantize_int8(m, int8_engine) for m in models]
        return cls(models, device, loaded, CompiledStep() if compile_step else None), sp

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


def check_shortlist(shortlist: Shortlist, path: str, sp) -> None:
    """Refuse the shortlist of file ``path`` unless it was built for sp's vocabulary."""
    shortlist.check_vocabulary(path, sp.get_piece_size(), vocab_digest(
        sp.to_bytes() if isinstance(sp, MappedVocabulary) else sp.serialized_model_proto()))
