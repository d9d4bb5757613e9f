"""What one line asks of its search, beside its text: the fields of a jsonl line (``read_steered_line``:
its target language, its formality, a prefix, constraints), the vocabulary (language and
formality tags) each line is encoded with, and its target-side text encoded and checked against the limits (``encode_prefixes``,
``encode_constraints``, ``unfit_term``, ``crowded_term``, ``over_constraint_limits``), as
``xf translate`` and ``xf serve`` both read them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from ..base.errors import ConfigError, XfError
from ..base.json_input import parse_json
from ..text.formality import FORMALITIES
from ..text.glossary import Glossary
from ..text.languages import check_code
from ..text.vocab import UNK_ID, encode_target
from .engines import Engine


def source_vocabulary(engine: Engine, sp, target_lang: Optional[str], where: str, formality: Optional[str] = None):
    """The vocabulary the engine's sources are encoded with to translate into ``target_lang``
    (``ModelFacts.vocabulary``: the model's languages, ``engine.facts``): ``sp`` itself
    for a bilingual model, a ``TaggedVocabulary`` putting the target's tag first for a
    multilingual one; with ``formality`` its formality tag next (text/formality_tags.py).
    Target-side text is encoded with ``vocab.encode_target(sp, ...)``."""
    return engine.facts.vocabulary(sp, target_lang, where, formality)


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
