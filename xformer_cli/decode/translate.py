"""Lines of text to translations: the line handling that ``xf translate`` and ``xf serve`` share.

One input line gives one output, whatever it holds: invalid UTF-8 is replaced by U+FFFD and
counted (``decode_input_line``), an empty or whitespace-only line gives an empty translation
without a search, a line longer than the engine's ``max_source`` subwords is truncated and
counted (``encode_lines``); with ``--split-sentences`` (``translate_sentences``) each line's
sentences are translated and joined instead, and a sentence too long is split, not cut
(``segment``). ``search_lines`` sorts the lines by length into batches and searches
them; ``translate_buffer`` formats the results as ``xf translate`` writes them. ``open_engine``
opens the engine that ``--engine`` names over ``--path``.
"""

from __future__ import annotations

import contextlib
import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Optional

import torch

from ..base import distributed
from ..base.console import warn
from ..base.errors import ConfigError
from ..data.batching import batch_by_size
from ..model.attention_maps import alignment_pairs, format_alignment, line_word_ids, word_ids
from ..model.facts import ModelFacts
from ..settings.options import TranslateOptions
from ..text.languages import TaggedVocabulary
from ..text.segment import split_texts
from ..text.vocab import decode_line
from .confidence import Calibration, Scorer, mean_log_probability
from .constraints import BatchConstraints, word_boundaries
from .ctranslate2_engine import CTranslate2Engine
from .engines import Engine, XfEngine
from .plan import DecodingPlan, Machine, plan_decoding, plan_scoring
from .search import Hypothesis


def open_engine(options: TranslateOptions, machine: Optional[Machine] = None, plan: Optional[DecodingPlan] = None):
    """(engine, sentencepiece processor, device) of --engine for --path, opened as the decoding
    plan of ``options`` on ``machine`` (this one unless given) says, or as ``plan`` where the
    caller made it already (xf serve's start-up plan): xf's own (``XfEngine``, one model or an
    ensemble) or CTranslate2 over a directory of xf export (``CTranslate2Engine``)."""
    plan = plan or plan_decoding(options, machine or Machine.here())
    warning = distributed.threads_warning(options.threads)
    if warning:
        warn(warning)
    if plan.engine == "ctranslate2":
        engine, sp = CTranslate2Engine.open(options.path[0], plan.device, options.precision, options.quantize,
                                            options.threads, plan.workers, plan.shortlist)
    else:
        engine, sp = XfEngine.open(options.path, plan)
    engine.plan = plan
    return engine, sp, engine.device


def open_scorer(options, plan, calibration: Optional[Calibration] = None, languages: tuple = (),
                facts: Optional[ModelFacts] = None) -> Scorer:
    """The confidence scorer of the options (``--reverse-path``, ``--target-lang``) with the
    ``calibration`` of ``--confidence`` (read before any model: ``Calibration.load``), its
    reverse models opened on the plan's device and precision (``plan_scoring``); ``languages``:
    the other targets an input line may name (a multilingual model's), for the wrong_language
    flag. The target language is --target-lang's, else the one the forward model's record
    (``facts``) names for a bilingual model."""
    reverse = XfEngine.open(options.reverse_path, plan_scoring(options, plan, Machine.here())) \
        if options.reverse_path else None
    if reverse is not None and reverse[0].facts.multilingual:
        raise ConfigError(f"--reverse-path {options.reverse_path[0]}: a multilingual model; the reverse score needs "
                          "a bilingual target->source model")
    target = options.target_lang
    if target is None and facts is not None and not facts.multilingual and facts.targets:
        target = facts.targets[0]
    return Scorer(calibration, reverse, target, options.confidence or "", languages)


@dataclass
class Stats:
    lines: int = 0
    empty: int = 0  # empty or whitespace-only input lines (their translation is empty too)
    empty_outputs: int = 0  # empty translations of lines that were not empty
    src_tokens: int = 0
    tgt_tokens: int = 0
    longest_output: int = 0  # the most subwords before eos of a line's best hypothesis
    invalid_utf8: int = 0
    first_invalid: int = 0
    truncated: int = 0
    first_truncated: int = 0
    sentences: int = 0  # sentences translated (--split-sentences, xf serve: lines otherwise)
    split_long: int = 0  # sentences over the model's positions, split to fit (segment.fit)
    unmet: int = 0  # lines whose lexical constraints no hypothesis met: translated without them
    first_unmet: int = 0


def decode_input_line(raw: bytes, line_no: int, stats: Stats, where: str) -> str:
    """One input line as text; invalid UTF-8 is replaced by U+FFFD and counted."""
    text = decode_line(raw, where, line_no, "skip")
    if text is None:
        text = decode_line(raw, where, line_no, "replace")
        stats.invalid_utf8 += 1
        stats.first_invalid = stats.first_invalid or line_no
    return text


def encode_lines(sp, lines: list[str], max_source: int, stats: Stats, first_index: int = 0,
                 vocabularies: Optional[list] = None) -> list[list[int]]:
    """The subword ids of each line: [] for an empty or whitespace-only line (counted), at most
    ``max_source`` ids for a longer one (truncated and counted; ``first_index`` numbers the lines).
    vocabularies: each line's own source vocabulary (a jsonl line's target; default: ``sp``)."""
    texts = [line if line.strip() else "" for line in lines]
    pieces = sp.encode(texts, out_type=int) if vocabularies is None else encode_each(vocabularies, texts)
    for i, ids in enumerate(pieces):
        if not ids:
            stats.empty += 1
        elif len(ids) > max_source:
            stats.truncated += 1
            stats.first_truncated = stats.first_truncated or first_index + i + 1
            pieces[i] = ids[:max_source]
    return pieces


def encode_each(vocabularies: list, texts: list[str]) -> list[list[int]]:
    """The source ids of each text by its own vocabulary, the texts of one vocabulary encoded
    together (sentencepiece's batch encoding)."""
    groups: dict[int, tuple] = {}
    for i, vocab in enumerate(vocabularies):
        groups.setdefault(id(vocab), (vocab, []))[1].append(i)
    out: list[list[int]] = [[] for _ in texts]
    for vocab, idx in groups.values():
        for i, ids in zip(idx, vocab.encode([texts[i] for i in idx], out_type=int)):
            out[i] = ids
    return out


def listed(options: TranslateOptions) -> int:
    """Hypotheses written per line: --nbest, or --alternatives where it is on."""
    return options.alternatives or options.nbest


def empty_hypotheses(options: TranslateOptions) -> list[Hypothesis]:
    count = 1 if options.output_format == "text" and listed(options) == 1 else listed(options)
    return [Hypothesis([], 0.0, []) for _ in range(count)]


def search_lines(engine: Engine, pieces: list[list[int]], options: TranslateOptions, stats: Stats,
                 max_tokens: Optional[int], max_sentences: Optional[int], generator=None, on_batch=None,
                 prefixes: Optional[list[list[int]]] = None, constraints: Optional[list] = None,
                 first_index: int = 0, word_starts: Optional[torch.Tensor] = None):
    """(hypotheses, alignments) of each non-empty entry of ``pieces`` (None for the empty ones),
    searched in batches sorted by length, longest first (``batch_by_size``). alignments: with
    options.print_alignment, per hypothesis, else None. on_batch(sentences) is told each batch's
    size. prefixes: each entry's target prefix (ids; [] or None: none); constraints: each entry's
    lexical constraints (``encode_constraints``; None: none); entries whose constraints no
    hypothesis met are counted in stats.unmet (their translation: the unconstrained one;
    first_index: the line number - 1 of entry 0, for stats.first_unmet); word_starts: the
    vocabulary's ``constraints.word_boundaries`` (a constraint must end a word), None: a
    constraint is met by its subwords alone."""
    results: list[Optional[list[Hypothesis]]] = [None] * len(pieces)
    alignments: list[Optional[list[list[int]]]] = [None] * len(pieces)
    todo = [i for i, ids in enumerate(pieces) if ids]
    batches = [[todo[j] for j in batch.tolist()] for batch in batch_by_size(
        [len(pieces[i]) for i in todo], max_tokens=max_tokens, max_sentences=max_sentences, longest_first=True)]

    def run(idx: list[int]):
        if constraints is not None and any(constraints[i] for i in idx):
            given = BatchConstraints([constraints[i] for i in idx], word_starts)
            steer = [prefixes[i] for i in idx] if prefixes is not None else None
            return engine.search([pieces[i] for i in idx], options, generator, steer, given), given.unmet
        if prefixes is None:
            return engine.search([pieces[i] for i in idx], options, generator), []
        return engine.search([pieces[i] for i in idx], options, generator, [prefixes[i] for i in idx]), []

    workers = min(engine.plan.workers if getattr(engine, "plan", None) else getattr(options, "workers", 1), len(batches))
    with contextlib.ExitStack() as stack:
        if workers > 1:  # batches decoded at once by worker threads (torch and CTranslate2 release the GIL)
            pool = stack.enter_context(ThreadPoolExecutor(workers, thread_name_prefix="xf-decode"))
            done = pool.map(run, batches)  # in batch order
        else:
            done = map(run, batches)
        for idx, (found, unmet) in zip(batches, done):
            if on_batch is not None:
                on_batch(len(idx))
            for j in unmet:
                stats.unmet += 1
                line = first_index + idx[j] + 1
                stats.first_unmet = min(stats.first_unmet or line, line)
            for i, hyps in zip(idx, found):
                results[i] = hyps
                stats.src_tokens += len(pieces[i]) + 1
                stats.tgt_tokens += len(hyps[0].tokens) if hyps else 0
                stats.longest_output = max(stats.longest_output, len(hyps[0].tokens) - 1 if hyps else 0)
            if options.print_alignment:  # a forced-decoding pass over the final hypotheses, in this
                # thread: it records attention on the model's modules, which threads would share
                aligned = engine.alignments([pieces[i] for i in idx], found, options.alignment_layer)
                for i, per_hyp in zip(idx, aligned):
                    alignments[i] = per_hyp
    return results, alignments


def hypothesis_texts(sp, hyps: list[Hypothesis]) -> list[str]:
    """The detokenized text of each hypothesis (its eos dropped), always one line."""
    # Output stays one line: sentencepiece pieces never hold line breaks, but be sure.
    return [sp.decode(h.tokens[:-1]).replace("\n", " ").replace("\r", " ") if h.tokens else "" for h in hyps]


def format_result(line_index: int, source: str, hyps: list[Hypothesis], texts: list[str], options: TranslateOptions, sp,
                  alignments: Optional[list[list[tuple[int, int]]]] = None,
                  confidences: Optional[list[float]] = None) -> str:
    """The output for one input line (text: one line; text with --nbest K: K lines; jsonl: one line).

    alignments (with --print-alignment): the (source, target) pairs of each hypothesis;
    confidences (jsonl): each hypothesis's (``confidence.Scorer``).
    """
    if options.output_format == "jsonl":
        record = {
            "id": line_index,
            "source": source,
            "hypotheses": [
                {
                    "text": text,
                    "score": round(h.score, 6),
                    "tokens": [sp.id_to_piece(t) for t in h.tokens],
                    "positional_scores": [round(s, 6) for s in h.positional_scores],
                }
                for h, text in zip(hyps, texts)
            ],
        }
        if alignments is not None:
            for hyp_record, pairs in zip(record["hypotheses"], alignments):
                hyp_record["alignment"] = [list(pair) for pair in pairs]
        if confidences is not None:
            for hyp_record, value in zip(record["hypotheses"], confidences):
                hyp_record["confidence"] = round(value, 6)
        return json.dumps(record, ensure_ascii=False) + "\n"
    # --print-alignment adds a last field " ||| 0-0 1-2" (Pharaoh pairs), as Marian and Moses do.
    links = [f" ||| {format_alignment(pairs)}" for pairs in alignments] if alignments is not None else [""] * len(hyps)
    if listed(options) == 1:
        return (texts[0] if texts else "") + (links[0] if links else "") + "\n"
    # Moses n-best format: "SENTENCE_ID ||| hypothesis ||| score", ids counting from 0.
    return "".join(f"{line_index} ||| {text} ||| {h.score:.6f}{link}\n" for h, text, link in zip(hyps, texts, links))


def translate_buffer(engine: Engine, sp, lines: list[str], first_index: int, options: TranslateOptions, stats: Stats,
                     generator=None, prefixes: Optional[list[list[int]]] = None,
                     constraints: Optional[list] = None, scorer: Optional[Scorer] = None,
                     vocabularies: Optional[list] = None, targets: Optional[list[Optional[str]]] = None) -> list[str]:
    """Outputs (one string per input line, in input order) for a buffer of input lines;
    prefixes: each line's target prefix (ids, ``encode_prefixes``; None: none); constraints:
    each line's lexical constraints (``encode_constraints``; None: none); scorer: gives each
    jsonl hypothesis its confidence; vocabularies: each line's source vocabulary (``sp`` for
    every line when None), so that lines of a buffer may go into different languages (searched
    together: the target tag is just the first source id); targets: each line's target language
    for the confidence (None: the scorer's). An empty line gives an empty
    translation whatever its prefix (there is nothing to translate)."""
    vocabularies = vocabularies or [sp] * len(lines)
    pieces = encode_lines(sp, lines, engine.max_source, stats, first_index, vocabularies)
    results, alignments = search_lines(engine, pieces, options, stats, max_tokens=options.max_tokens or None,
                                       max_sentences=None if options.max_tokens else options.batch_size,
                                       generator=generator, prefixes=prefixes, constraints=constraints,
                                       first_index=first_index,
                                       word_starts=word_boundaries(sp) if constraints is not None else None)
    found = [hyps if hyps is not None else empty_hypotheses(options) for hyps in results]
    texts_of = [hypothesis_texts(sp, hyps) for hyps in found]
    targets = targets or [None] * len(lines)
    confidences = _confidences(scorer, lines, found, texts_of, targets) if scorer is not None else [None] * len(lines)
    out = []
    for i, (hyps, texts) in enumerate(zip(found, texts_of)):
        if results[i] is not None:
            stats.empty_outputs += not texts[0].strip()
        pairs = None
        if options.print_alignment:
            words = options.alignment_level == "word"  # source words: those of the line as given
            own = vocabularies[i]  # the words of the line's own subwords (alignments skip a tag)
            own = own.sp if isinstance(own, TaggedVocabulary) else own
            src_words = line_word_ids(own, lines[i])[: len(pieces[i]) - (own is not vocabularies[i])] if words else None
            pairs = [alignment_pairs(a, src_words, word_ids([sp.id_to_piece(t) for t in h.tokens[:-1]]) if words else None)
                     for h, a in zip(hyps, alignments[i] or [[]] * len(hyps))]  # empty lines: none
        out.append(format_result(first_index + i, lines[i], hyps, texts, options, sp, pairs, confidences[i]))
    return out


def _confidences(scorer: Scorer, lines: list[str], found: list[list[Hypothesis]],
                 texts_of: list[list[str]], targets: list[Optional[str]]) -> list[list[float]]:
    """Each line's hypotheses' confidences, the buffer's scored at once (one reverse pass);
    targets: each line's target language (None: the scorer's own)."""
    flat = [(line, text, mean_log_probability(h.positional_scores), target)
            for line, hyps, texts, target in zip(lines, found, texts_of, targets) for h, text in zip(hyps, texts)]
    values = iter(scorer.confidences(*zip(*flat))) if flat else iter(())
    return [[next(values) for _ in hyps] for hyps in found]


def translate_sentences(engine: Engine, sp, lines: list[str], options: TranslateOptions, stats: Stats,
                        generator=None) -> list[str]:
    """``--split-sentences``: each line's sentences translated as lines (batched across the buffer)
    and joined again with the line's own spacing; one output line per input line (text output)."""
    units = split_texts([[line] for line in lines], options.split_sentences, sp, engine.max_source)
    stats.sentences += units.sentences
    stats.split_long += units.split_long
    results, _ = search_lines(engine, units.pieces, options, stats, max_tokens=options.max_tokens or None,
                              max_sentences=None if options.max_tokens else options.batch_size, generator=generator)
    texts = [hypothesis_texts(sp, hyps)[0] if hyps is not None else "" for hyps in results]
    out = []
    for line, layout in zip(lines, units.layouts):
        translated = layout.render(texts.__getitem__)
        stats.empty += not line.strip()
        stats.empty_outputs += bool(line.strip()) and not translated.strip()
        out.append(translated + "\n")
    return out


def translate_with_features(engine: Engine, sp, lines: list[str], options: TranslateOptions,
                            scorer: Scorer) -> tuple[list[str], list[list[float]]]:
    """(the best translation of each line, its ``confidence.FEATURES``), lines in batches as
    xf translate searches them: what ``xf calibrate`` fits on and the bench measures."""
    stats = Stats()
    pieces = encode_lines(sp, lines, engine.max_source, stats)
    results, _ = search_lines(engine, pieces, options, stats, max_tokens=options.max_tokens or None,
                              max_sentences=None if options.max_tokens else options.batch_size)
    best = [hyps[0] if hyps else Hypothesis([], 0.0, []) for hyps in results]
    texts = hypothesis_texts(sp, best)
    return texts, scorer.rows(lines, texts, [mean_log_probability(h.positional_scores) for h in best])
