"""xf serve's directions: the (source, target) pairs a server translates, each with its engine,
vocabulary, glossary and confidence scorer, read from --model at start-up and checked against
the model's own record (``model.facts``): a direction the model does not translate is refused
before the server binds. Also the languages' names of ``GET /languages``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Optional

from ..base.console import warn
from ..base.errors import ConfigError, XfError
from ..decode.confidence import Calibration, Scorer
from ..decode.plan import Machine, plan_decoding
from ..decode.steering import crowded_term, unfit_term
from ..decode.translate import open_engine
from ..model.facts import ModelFacts, from_export, read_facts
from ..settings.options import ServeOptions, check_served, direction_and_path, model_spec
from ..text.glossary import Glossary
from ..text.language_id import LanguageId
from ..text.formality import FORMALITIES
from ..text.languages import pair_names, same_language
from .batch_queue import Direction

# ISO 639-1 names for /languages; a code not listed is shown as itself.
LANGUAGE_NAMES = {
    "ar": "Arabic", "cs": "Czech", "de": "German", "en": "English", "es": "Spanish", "fi": "Finnish",
    "fr": "French", "hi": "Hindi", "it": "Italian", "ja": "Japanese", "ko": "Korean", "nl": "Dutch",
    "pl": "Polish", "pt": "Portuguese", "ro": "Romanian", "ru": "Russian", "tr": "Turkish", "uk": "Ukrainian",
    "zh": "Chinese",
}


def language_name(code: str) -> str:
    return LANGUAGE_NAMES.get(code, code)


# -- start-up ------------------------------------------------------------------------------------
def load_glossaries(options: ServeOptions) -> dict[str, Glossary]:
    """Each --glossary DIRECTION=FILE read, by direction code; a bad file is a one-line error naming
    the direction, the file and its line (read before the port is bound and the models load)."""
    glossaries = {}
    for spec in options.glossary:
        source, target, path = direction_and_path(spec, "--glossary", "FILE", "en-de=terms.tsv")
        try:
            glossaries[f"{source}-{target}"] = Glossary.load(path)
        except ConfigError as e:
            raise XfError(f"--glossary {source}-{target}: {e}") from None
    return glossaries


def model_directions(listed: Optional[list[tuple[str, str]]], facts: ModelFacts, spec: str) -> list[tuple[str, str, bool]]:
    """The directions one --model serves, each (source, target, trained on it), as the model's
    record (``model.facts``) says what it translates.

    Multilingual: ``listed``, or every pair when None. A direction it was not trained on is served
    zero-shot (trained False) when listed and its source is one of the model's sources and its
    target one of its targets; any other is refused, naming the model's pairs. Bilingual: its
    recorded direction, which a listed one may confirm but not contradict (a model that records
    none: the one direction listed, its codes the user's to choose). A direction is served under
    the model's own codes (``en-deu`` of a model that records en-de serves en-de)."""
    if listed is not None:
        listed = [facts.own(source, target) for source, target in listed]
    if not facts.multilingual:
        if listed is None:
            if not facts.pairs:
                raise XfError(f"--model {spec}: the checkpoint does not record its languages: name its direction, "
                              f"e.g. en-de={spec}")
            return [(*facts.pairs[0], True)]
        if len(listed) > 1:
            raise XfError(f"--model {spec}: a bilingual model translates one direction, not "
                          f"{', '.join(pair_names(listed))}")
        if not facts.translates(*listed[0]):
            raise XfError(f"--model {spec}: the model translates {facts.describe()}, not {pair_names(listed)[0]} "
                          "(its recorded languages)")
        return [(*listed[0], True)]
    if listed is None:
        return [(source, target, True) for source, target in facts.pairs]
    out = []
    for source, target in listed:
        if not facts.translates(source, target):
            raise XfError(f"--model {spec}: the model translates {facts.describe()}, not {source}-{target} "
                          f"(from {', '.join(facts.sources)} into {', '.join(facts.targets)})")
        out.append((source, target, (source, target) in facts.pairs))
    return out


def load_directions(options: ServeOptions, glossaries: Optional[dict[str, Glossary]] = None) -> list[Direction]:
    """The directions of every --model (``model_directions``), checked before any model loads
    (errors name the --model value), then one engine per checkpoint, loaded once and shared by
    its directions, each with its own vocabulary (``languages.vocabulary_for``), its glossary
    (``load_glossaries``), whose target terms must fit the model, and its confidence."""
    specs = [(spec, *model_spec(spec)) for spec in options.model]
    plan = plan_decoding(options.translate_options("check"), Machine.here())  # the one start-up plan: every --model's
    for code in glossaries or {}:  # refused by the plan before the models
        plan.refuse_steering(f"--glossary {code}=...")
    from ..decode.ctranslate2_engine import read_exported_model

    facts: dict[str, ModelFacts] = {}  # each model's record, read without loading the model
    for spec, _, path in specs:
        if not Path(path).exists():
            raise XfError(f"--model {spec}: {path} does not exist")
        if path not in facts:
            facts[path] = (from_export(read_exported_model(Path(path)), path) if options.engine == "ctranslate2"
                           else read_facts(path))
    served = [(spec, path, source, target, trained) for spec, listed, path in specs
              for source, target, trained in model_directions(listed, facts[path], spec)]
    codes = [(source, target) for _, _, source, target, _ in served]
    for spec, _, source, target, _ in served:
        if codes.count((source, target)) > 1:
            raise XfError(f"--model {spec}: direction {source}-{target} is given more than once")
    try:
        check_served(options, codes)
    except ValueError as e:
        raise XfError(str(e)) from None
    for spec, path, source, target, trained in served:
        if not trained:
            warn(f"--model {spec}: the model was not trained on {source}-{target} "
                 f"(its pairs: {facts[path].describe()}): served zero-shot")
    engines: dict[str, tuple] = {}
    directions = []
    for spec, path, source, target, _ in served:
        if path not in engines:
            engines[path] = open_engine(options.translate_options(path), plan=plan)[:2]
        engine, sp = engines[path]
        vocab = facts[path].vocabulary(sp, target, f"--model {spec}") if facts[path].multilingual else sp
        direction = Direction(source, target, engine, vocab, options.translate_options(path),
                              (glossaries or {}).get(f"{source}-{target}"), confidence_scorer(options, source, target))
        unfit = direction.glossary is not None and (
            unfit_term(direction.glossary, direction.target_sp, engine.max_source)
            or crowded_term(direction.glossary, options.max_constraint_forms))
        if unfit:
            raise XfError(f"--glossary {source}-{target}: {unfit}")
        direction.variants = formality_variants(direction, facts[path], sp, f"--model {spec}")
        directions.append(direction)
    return directions


def formality_variants(direction: Direction, facts: ModelFacts, sp, where: str) -> dict[str, Direction]:
    """The direction once per formality (``formal``, ``informal``), each source starting with that
    formality's tag, where the model has formality tags for the direction's target language
    (``ModelFacts.formality``); none otherwise. The variants share the direction's engine."""
    if facts.formality is None or not same_language(direction.target, facts.formality):
        return {}
    target = direction.target if facts.multilingual else None
    return {formality: dataclasses.replace(direction, sp=facts.vocabulary(sp, target, where, formality), variants={})
            for formality in FORMALITIES}


def confidence_scorer(options: ServeOptions, source: str, target: str) -> Scorer:
    """The direction's confidence: its --confidence file's calibration (no reverse model: xf serve
    runs none), or the default; the wrong_language flag where py3langid is installed and knows
    the target language."""
    specs = [direction_and_path(spec, "--confidence", "FILE") for spec in options.confidence]
    path = next((file for s, t, file in specs if (s, t) == (source, target)), None)
    calibration = Calibration.load(path) if path is not None else None
    known = LanguageId.load([target])
    flag = target if known is not None and target in known.languages else None
    return Scorer(calibration, None, flag, f"--confidence {source}-{target}={path}")
