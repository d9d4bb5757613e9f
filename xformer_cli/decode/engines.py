"""The translation engine interface, and xf's own engine: search over one model or an ensemble.

Every engine speaks one small interface (``Engine``): ``search(sentences, options)`` gives each
sentence's hypotheses best first; ``max_source`` is the longest source it takes;
``supports_alignments`` says whether ``alignments`` (a forced-decoding pass over the hypotheses)
can be asked for. ``XfEngine`` is xf's search (``decode/search.py``); the CTranslate2 engine is in
``formats/ctranslate2.py``, and ``decode.translate.open_engine`` opens the one ``--engine`` names.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Optional, Sequence

import torch

from ..base import distributed
from ..base.compiling import AotPackages
from ..base.console import warn
from ..base.errors import ConfigError
from ..base.memory import bound_native_memory
from ..data.batching import collate_source
from ..model.attention_maps import hard_alignments, resolve_layer
from ..model.checkpoint import load_models, vocab_digest
from ..model.facts import ModelFacts, facts_from_config
from ..model.quantization import quantize_int8, quantize_int8_matmul, quantize_int8_packed
from ..model.transformer import Transformer
from ..settings.options import TranslateOptions
from ..text.vocab import PAD_ID, MappedVocabulary
from .constraints import BatchConstraints
from .decoder_step import AotStep
from .plan import DecodingPlan
from .search import Hypothesis, next_token_alternatives, search, with_prefix_candidates
from .shortlist import Shortlist
from .workers import DecodeWorkers


class Engine:
    """What ``xf translate`` needs of an engine."""

    device: torch.device
    max_source: int  # the longest source (subwords, without eos) the engine takes
    supports_alignments: bool = False
    plan: DecodingPlan  # how it was opened (translation.open_engine sets it)
    # what the model is (model.facts): its languages and target tags, asked for a direction's
    # vocabulary, the alignments' rule for the tag and the scorer's target language
    facts: ModelFacts = ModelFacts("model")

    def search(self, sentences: Sequence[Sequence[int]], options: TranslateOptions,
               generator: Optional[torch.Generator] = None,
               prefixes: Optional[Sequence[Sequence[int]]] = None,
               constraints: Optional[BatchConstraints] = None) -> list[list[Hypothesis]]:
        """Hypotheses of each sentence (subword ids without eos), best first; prefixes: each
        sentence's target prefix (subword ids, forced; [] or None: none), which every hypothesis
        starts with; constraints: each sentence's lexical constraints, which every hypothesis
        meets (those no hypothesis met are listed in constraints.unmet and searched without). With options.alternatives N: the N most likely ids at the position after the
        prefix, each completed by the search, in that order (CTranslate2's return_alternatives)."""
        raise NotImplementedError

    def close(self) -> None:
        """Release what the engine holds beyond its models (xf's --workers processes)."""

    def alignments(self, sentences: Sequence[Sequence[int]], found: list[list[Hypothesis]], layer: int):
        """Per sentence, per hypothesis: the source position each target subword attends to most.
        One rule for the tag, the record's (``ModelFacts.tagged``): where each sentence starts with
        a target tag (a multilingual model's), nothing aligns to it and positions count the
        sentence's own subwords after it, for xf translate and xf serve alike."""
        raise ConfigError("--print-alignment needs xf's own engine (the attention of --engine ctranslate2 "
                          "is not recorded)")

    def check_alignment_layer(self, layer: int) -> None:
        """Fail now, not at the first batch, when a model lacks the layer --alignment-layer names."""
        raise ConfigError("--print-alignment needs xf's own engine (the attention of --engine ctranslate2 "
                          "is not recorded)")


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


# -- loading -------------------------------------------------------------------------------------


class XfEngine(Engine):
    """xf's own search (``decode/search.py``) over one model or an ensemble: the default --engine."""

    def __init__(self, models: Sequence[Transformer], device: torch.device, shortlist: Optional[Shortlist] = None,
                 step: Optional[AotStep] = None):
        self.models, self.device, self.shortlist = list(models), device, shortlist
        self.compiled = step  # --compile: the ahead-of-time step, with its build time and packages
        self.int8_engine: Optional[str] = None  # --quantize int8: what runs the int8 products
        self.supports_alignments = True
        self.max_source = min(m.cfg.max_positions for m in models) - 1  # room for the source's eos
        # --workers on the CPU: the processes that decode plain batches (``decode/workers.py``);
        # constraints and alternatives are searched here, in the calling thread
        self.workers: Optional[DecodeWorkers] = None

    @classmethod
    def open(cls, paths: Sequence[str], plan: DecodingPlan, packages: Optional[Path] = None):
        """(engine, sentencepiece processor) of the checkpoints ``paths`` (an ensemble when more
        than one), loaded and run as ``plan`` (``decode.plan.plan_decoding``) says: its device,
        precision, int8 layers, step, worker processes and shortlist. ``packages``: the directory
        of compiled steps (a worker gets its parent's: the cache, or the private directory that
        replaces an untrusted one, so that they share what they build and only the parent warns)."""
        bound_native_memory()  # decoding makes a new product shape at every step: oneDNN's cache stays bounded
        if plan.warning:
            warn(plan.warning)
        if plan.threads:
            torch.set_num_threads(plan.threads)
        loaded = Shortlist.load(plan.shortlist) if plan.shortlist is not None else None  # fails before loading
        device = distributed.resolve_device(plan.device)
        models, sp, meta = load_models(paths, device, DTYPES[plan.precision])
        if loaded is not None:  # an ensemble shares one vocabulary: the first model's
            check_shortlist(loaded, plan.shortlist, sp)
        if plan.int8 == "matmul":
            models = [quantize_int8_matmul(m, plan.int8_engine) for m in models]
        elif plan.int8 == "packed":
            models = [quantize_int8_packed(m, plan.int8_engine) for m in models]
        elif plan.int8 == "dynamic":
            models = [quantize_int8(m, plan.int8_engine) for m in models]
        engine = cls(models, device, loaded, AotStep(AotPackages(packages)) if plan.step == "aot" else None)
        engine.plan = plan  # which batches go to its workers is the plan's (DecodingPlan.to_workers)
        engine.facts = facts_from_config(models[0].cfg, meta, isinstance(sp, MappedVocabulary), paths[0])
        rule = plan.rule("--int8-engine")
        chosen = f"{plan.int8_engine} ({rule})" if rule else plan.int8_engine
        engine.int8_engine = {"matmul": f"decoder: int8 matmul, compiled ahead of time; encoder: {chosen}",
                              "packed": f"{chosen}; the decoder's packed kernels called from its compiled step",
                              "dynamic": chosen}.get(plan.int8)
        if plan.processes:  # no shared interpreter lock; each opens one worker's plan
            opener = functools.partial(cls.open, packages=engine.compiled.packages.root) if engine.compiled else cls.open
            engine.workers = DecodeWorkers(opener, tuple(paths), plan.worker_plan(), plan.workers)
        return engine, sp

    def search(self, sentences: Sequence[Sequence[int]], options: TranslateOptions, generator=None,
               prefixes: Optional[Sequence[Sequence[int]]] = None,
               constraints: Optional[BatchConstraints] = None) -> list[list[Hypothesis]]:
        if self.workers is not None and self.plan.to_workers(generator is not None, constraints is not None,
                                                             options.alternatives):
            found = self.workers.search(sentences, options, prefixes)
            if self.compiled is not None:
                self.compiled.remote = self.workers.compile_counters()
            return found
        src = collate_source(sentences).to(self.device)
        candidates = self.shortlist.candidates(src) if self.shortlist is not None else None
        if candidates is not None and constraints:  # constraint tokens are always candidates
            candidates = torch.unique(torch.cat([candidates, torch.tensor(constraints.tokens(), device=self.device)]))
        if options.alternatives:
            return self._alternatives(src, options, generator, candidates, prefixes or [[] for _ in sentences],
                                      constraints)
        prefix = collate_prefix(prefixes, self.device)
        return search(self.models, src, options, generator, with_prefix_candidates(candidates, prefix), self.compiled,
                      prefix, constraints)

    def close(self) -> None:
        if self.workers is not None:
            self.workers.close()
            self.workers = None

    def _alternatives(self, src, options, generator, candidates, prefixes, constraints=None) -> list[list[Hypothesis]]:
        """Each sentence's options.alternatives ids after its prefix, each as the prefix's next
        forced token and completed by one search of all of them (the best hypothesis of each;
        the alternatives are the model's, the completions meet the constraints)."""
        prefix = collate_prefix(prefixes, self.device, keep_empty=True)
        firsts = next_token_alternatives(self.models, src, prefix, options.alternatives,
                                         with_prefix_candidates(candidates, prefix))
        rows = [i for i, ids in enumerate(firsts) for _ in ids]
        longer = collate_prefix([list(prefixes[i]) + [t] for i, ids in enumerate(firsts) for t in ids], self.device)
        every = src.index_select(0, torch.tensor(rows, dtype=torch.long, device=self.device))
        one = dataclasses.replace(options, nbest=1, alternatives=0)
        given = constraints.rows(rows) if constraints else None
        found = search(self.models, every, one, generator, with_prefix_candidates(candidates, longer), self.compiled,
                       longer, given)
        if given is not None:
            constraints.unmet = sorted({rows[j] for j in given.unmet})
        out: list[list[Hypothesis]] = [[] for _ in firsts]
        for i, hyps in zip(rows, found):
            out[i].append(hyps[0])
        return out

    def alignments(self, sentences, found, layer):
        tagged = self.facts.tagged
        aligned = hard_alignments(self.models, collate_source(sentences).to(self.device), found, layer, skip_first=tagged)
        return [[[i - 1 for i in row] for row in rows] for rows in aligned] if tagged else aligned

    def check_alignment_layer(self, layer: int) -> None:
        for model in self.models:
            resolve_layer(layer, len(model.decoder_layers))


def collate_prefix(prefixes: Optional[Sequence[Sequence[int]]], device: torch.device,
                   keep_empty: bool = False) -> Optional[torch.Tensor]:
    """Target prefixes (lists of ids) as one (B, P) LongTensor, PAD_ID after each one's end;
    None when there are none or all are empty (then the search is exactly the one without),
    unless ``keep_empty``."""
    if prefixes is None or not (keep_empty or any(prefixes)):
        return None
    width = max(1, max(len(p) for p in prefixes))
    return torch.tensor([list(p) + [PAD_ID] * (width - len(p)) for p in prefixes], dtype=torch.long, device=device)


def check_shortlist(shortlist: Shortlist, path: str, sp) -> None:
    """Refuse the shortlist of file ``path`` unless it was built for sp's vocabulary."""
    shortlist.check_vocabulary(path, sp.get_piece_size(), vocab_digest(
        sp.to_bytes() if isinstance(sp, MappedVocabulary) else sp.serialized_model_proto()))
