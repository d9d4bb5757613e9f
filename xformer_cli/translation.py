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
from dataclasses import dataclass, field
from typing import Optional

import torch

from .console import warn
from . import distributed
from .attention_maps import alignment_pairs, format_alignment, line_word_ids, word_ids
from .batching import batch_by_size
from .confidence import Calibration, Scorer, mean_log_probability
from .constraints import BatchConstraints, word_boundaries
from .ctranslate2_format import CTranslate2Engine
from .engines import Engine, XfEngine
from .decoding_plan import DecodingPlan, Machine, plan_decoding, plan_scoring
from .errors import ConfigError, XfError
from .formality import FORMALITIES
from .glossary import Glossary
from .json_input import parse_json
from .options import TranslateOptions
from .search import Hypothesis
from .segment import split_texts
from .languages import TaggedVocabulary, check_code
from .model_facts import ModelFacts
from .vocab import UNK_ID, decode_line, encode_target


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


def source_vocabulary(engine: Engine, sp, target_lang: Optional[str], where: str, formality: Optional[str] = None):
    """The vocabulary the engine's sources are encoded with to translate into ``target_lang``
    (``ModelFacts.vocabulary``: the model's languages, ``engine.facts``): ``sp`` itself
    for a bilingual model, a ``TaggedVocabulary`` putting the target's tag first for a
    multilingual one; with ``formality`` its formality tag next (formality_tags.py). Target-side
    text is encoded with ``vocab.encode_target(sp, ...)``."""
    return engine.facts.vocabulary(sp, target_lang, where, formality)


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


@dataclass
class SteeredLine:
    """One line of ``--input-format jsonl``: the source text, its target prefix ("" : none), its
    lexical constraints (each a list of alternative forms; [] : none), the language it is
    translated into (None: --target-lang's) and the formality asked for (None: --formality's)."""

    source: str
    prefix: str = ""
    constraints: list = field(default_factory=list)
    target_lang: Optional[str] = None
    formality: Optional[str] = None


def text_field(value, key: str, line_no: int, where: str) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"{where}: line {line_no}: '{key}' must be a string, got {type(value).__name__}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate such as "\ud800": JSON, but not text
        raise ConfigError(f"{where}: line {line_no}: '{key}' is not valid text (a lone surrogate escape)") from None
    if "\n" in value or "\r" in value:
        raise ConfigError(f"{where}: line {line_no}: '{key}' holds a line break: one sentence a line")
    return value


def read_constraints(value, line_no: int, where: str) -> list[list[str]]:
    """A 'constraints' field: a list whose items are a string (a phrase that must appear) or a
    list of strings (alternative forms, any one of which must appear); each form non-empty text."""
    if not isinstance(value, list):
        raise ConfigError(f"{where}: line {line_no}: 'constraints' must be a list of strings or of lists of strings")
    out = []
    for item in value:
        forms = item if isinstance(item, list) else [item]
        if not forms:
            raise ConfigError(f"{where}: line {line_no}: an empty constraint (a list with no form)")
        forms = [text_field(form, "constraints", line_no, where) for form in forms]
        if not all(form.strip() for form in forms):
            raise ConfigError(f"{where}: line {line_no}: an empty constraint (a form with no text)")
        out.append(forms)
    return out


def read_steered_line(text: str, line_no: int, where: str) -> SteeredLine:
    """One ``--input-format jsonl`` line, {"source": ..., "prefix": ..., "constraints": [...],
    "target_lang": ..., "formality": "formal"} (all but source optional); a ConfigError naming
    ``where`` and the line otherwise.
    A blank line is an empty source (an empty translation, as in text input)."""
    if not text.strip():
        return SteeredLine("")
    try:
        record = parse_json(text, f"{where}: line {line_no}",
                            hint='--input-format jsonl takes one object a line, {"source": ..., "prefix": ...}')
    except XfError as e:  # a usage error, as every other refusal of a line here
        raise ConfigError(str(e)) from None
    if not isinstance(record, dict):
        raise ConfigError(f"{where}: line {line_no}: expected a JSON object {{\"source\": ...}}, "
                          f"got {type(record).__name__}")
    unknown = sorted(set(record) - {"source", "prefix", "constraints", "target_lang", "formality"})
    if unknown:
        raise ConfigError(f"{where}: line {line_no}: unknown key {unknown[0]!r} (source, prefix, constraints, "
                          "target_lang, formality)")
    if "source" not in record:
        raise ConfigError(f"{where}: line {line_no}: no 'source' (the text to translate)")
    fields = [text_field(record.get(key, ""), key, line_no, where) for key in ("source", "prefix")]
    target = record.get("target_lang")
    if target is not None:
        try:
            check_code(text_field(target, "target_lang", line_no, where), f"{where}: line {line_no}: 'target_lang'")
        except XfError as e:
            raise ConfigError(str(e)) from None
    formality = record.get("formality")
    if formality is not None and formality not in FORMALITIES:
        raise ConfigError(f"{where}: line {line_no}: 'formality' must be formal or informal, got {formality!r}")
    return SteeredLine(*fields, read_constraints(record.get("constraints", []), line_no, where), target, formality)


def line_vocabularies(engine: Engine, sp, steered: list[SteeredLine], default, target_lang: Optional[str],
                      where: str, first_line: int, model: str = "the model", formality: Optional[str] = None) -> list:
    """The source vocabulary of each jsonl line: ``default`` (--target-lang's and --formality's,
    None for a multilingual model without --target-lang), or that of the line's own "target_lang"
    and "formality"; a line naming a language the model lacks, or (multilingual, no --target-lang)
    naming none, or a formality a model without its tags, is a ConfigError naming its line."""
    own = {(target_lang, formality): default} if default is not None else {}
    out = []
    for i, line in enumerate(steered):
        lang = line.target_lang or target_lang
        key = (lang, line.formality or formality)
        if key not in own:
            try:
                own[key] = source_vocabulary(engine, sp, lang, model, key[1])
            except XfError as e:
                raise ConfigError(f"{where}: line {first_line + i + 1}: {e}"
                                  + (" (or give the line a \"target_lang\")" if lang is None else "")) from None
        out.append(own[key])
    return out


def encode_prefixes(sp, prefixes: list[str], max_prefix: int, where: str, first_line: int) -> list[list[int]]:
    """The subword ids of each target prefix ([] for an empty or whitespace-only one: no prefix);
    a prefix over ``max_prefix`` subwords (the model's positions), or with a character the
    vocabulary cannot spell (``unfit_form``), is a ConfigError naming its line."""
    pieces = encode_target(sp, [p if p.strip() else "" for p in prefixes], out_type=int)
    for i, (prefix, ids) in enumerate(zip(prefixes, pieces)):
        if len(ids) > max_prefix:
            raise ConfigError(f"{where}: line {first_line + i + 1}: the prefix has {len(ids)} subwords, more than "
                              f"the model's {max_prefix} output positions")
        why = ids and unfit_form(sp, prefix, ids, max_prefix)  # forced as written: no ⁇ either
        if why:
            raise ConfigError(f"{where}: line {first_line + i + 1}: the prefix {prefix!r} {why}")
    return pieces


def unfit_form(sp, form: str, ids: list[int], max_target: int) -> Optional[str]:
    """Why a target form that a search must write (a constraint's, a glossary term's), cut into
    ``ids``, cannot be: no subword, more than ``max_target`` (the model's output positions), or a
    character the vocabulary has no piece for (sentencepiece's unknown piece: the search would
    write it, and it decodes as ⁇); None if it can be written."""
    if not ids or len(ids) > max_target:
        return f"has {len(ids)} subwords (1 to the model's {max_target} output positions)"
    if UNK_ID in ids:
        unknown = [c for c in dict.fromkeys(form) if UNK_ID in encode_target(sp, c, out_type=int)]
        return f"has characters the model's vocabulary cannot spell ({' '.join(unknown)}): they would come out as ⁇"
    return None


def unfit_term(glossary: Glossary, sp, max_target: int) -> Optional[str]:
    """The error of the first glossary target form that cannot be written (``unfit_form``),
    naming where the entry was given (a file's line, a request's item); None if every form can."""
    for source, forms in glossary.entries.items():
        for form, ids in zip(forms, encode_target(sp, forms, out_type=int)):
            why = unfit_form(sp, form, ids, max_target)
            if why:
                return f"{glossary.origins[source]}: the target term {form!r} of {source!r} {why}"
    return None


def crowded_term(glossary: Glossary, most: int) -> Optional[str]:
    """The error of the first glossary entry with more than ``most`` target forms (each entry
    found becomes a constraint: --max-constraint-forms), naming where it was given; None if none."""
    for source, forms in glossary.entries.items():
        if len(forms) > most:
            return (f"{glossary.origins[source]}: {source!r} has {len(forms):,} target forms, over the limit of "
                    f"{most:,} (--max-constraint-forms)")
    return None


def encode_constraints(sp, constraints: list[list[list[str]]], max_target: int, where: str,
                       first_line: int) -> list[list[list[list[int]]]]:
    """The subword ids of every form of each line's constraints (``read_constraints``); a form
    that cannot be written (``unfit_form``) is a ConfigError naming its line. A form longer than
    a sentence's own length limit (--max-len-a/b) is no error: that line is translated without
    its constraints and counted."""
    out = []
    for i, line in enumerate(constraints):
        encoded = []
        for forms in line:
            ids = encode_target(sp, forms, out_type=int)
            for form, form_ids in zip(forms, ids):
                why = unfit_form(sp, form, form_ids, max_target)
                if why:
                    raise ConfigError(f"{where}: line {first_line + i + 1}: the constraint {form!r} {why}")
            encoded.append(ids)
        out.append(encoded)
    return out


def over_constraint_limits(constraints: list[list[list[int]]], options) -> Optional[str]:
    """Why one sentence's constraints (subword ids of each form of each, its glossary terms'
    included) ask more than the decoding options allow (``max_constraints`` and the two beside
    it), or None. The limits bound the search's time and memory (docs/decoding.md)."""
    if len(constraints) > options.max_constraints:
        return (f"{len(constraints):,} lexical constraints (its glossary terms included), over the limit of "
                f"{options.max_constraints:,} a sentence (--max-constraints)")
    for n, forms in enumerate(constraints, 1):
        if len(forms) > options.max_constraint_forms:
            return (f"constraint {n} has {len(forms):,} forms, over the limit of {options.max_constraint_forms:,} "
                    "(--max-constraint-forms)")
    subwords = sum(len(form) for forms in constraints for form in forms)
    if subwords > options.max_constraint_subwords:
        return (f"its constraints' forms have {subwords:,} subwords together, over the limit of "
                f"{options.max_constraint_subwords:,} a sentence (--max-constraint-subwords)")
    return None


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
