"""``xf export ctranslate2|huggingface|argos|marian|bergamot --path CKPT --output PATH``: an xf
checkpoint as a model of another runtime. The conversions are the format modules'
(``formats.ctranslate2``: a CTranslate2 model directory, run by ``xf translate --engine
ctranslate2``; ``huggingface``: a MarianMT directory; ``formats.argos``: an Argos Translate package,
one file; ``formats.marian``: a Marian model.npz, vocabulary and decoder.yml; ``formats.bergamot``:
Bergamot's files over ``formats.marian``'s parameters, and a page that translates in the browser);
this command owns the options, the output (written atomically: built in a temporary directory or
file beside it, then renamed into place; an old output directory with --overwrite renamed aside
first, deleted once the new one is in place) and the summary.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from ..base.console import print_summary, stderr_console
from ..base.errors import XfError
from ..base.fileio import atomic_directory, atomic_write
from ..base.json_input import read_json
from ..model.checkpoint import load_checkpoint, model_from_checkpoint
from ..model.facts import ModelFacts, facts_of
from ..settings.options import ExportOptions
from ..text.languages import same_language

# Which options each format reads; one it does not read, given, is refused (it would mean nothing).
USED_BY = {
    "quantization": ("ctranslate2", "argos", "bergamot"), "beam_size": ("huggingface", "marian", "bergamot"),
    "lenpen": ("huggingface", "marian", "bergamot"), "max_length": ("huggingface",),
    "source_lang": ("huggingface", "argos", "bergamot"), "target_lang": ("huggingface", "argos", "bergamot"),
    "source_name": ("argos",), "target_name": ("argos",), "package_version": ("argos",), "bleu": ("huggingface",),
    "shortlist": ("bergamot",), "bergamot_package": ("bergamot",),
}
UNRECORDED = ("en", "de")  # the languages of a checkpoint that records none (written before xf recorded them)


def refuse_unused(options: ExportOptions) -> None:
    """One line naming every option given that the chosen format does not read."""
    from dataclasses import fields

    defaults = {f.name: f.default for f in fields(ExportOptions)}
    unused = [f"--{name.replace('_', '-')}" for name, formats in USED_BY.items()
              if options.format not in formats and getattr(options, name) != defaults[name]]
    if unused:
        raise XfError(f"xf export {options.format}: {', '.join(unused)} {'means' if len(unused) == 1 else 'mean'} "
                      f"nothing to a {options.format} export; leave {'it' if len(unused) == 1 else 'them'} out")


def direction(options: ExportOptions, facts: ModelFacts) -> tuple[str, str]:
    """(source, target) of a bilingual export: the model's recorded languages, which --source-lang
    and --target-lang may confirm but not contradict; the flags (else en, de) where it records none."""
    flags = (options.source_lang, options.target_lang)
    if facts.multilingual:
        given = [f"--{n}-lang {v}" for n, v in zip(("source", "target"), flags) if v is not None]
        if given:
            raise XfError(f"xf export {options.format}: {', '.join(given)}: {facts.where} is multilingual "
                          f"({facts.describe()}); its languages come from its pairs (leave the flags out)")
        return "+".join(facts.sources), "+".join(facts.targets)
    if not facts.pairs:
        return tuple(flag or default for flag, default in zip(flags, UNRECORDED))
    own = facts.pairs[0]
    for name, flag, mine in zip(("source", "target"), flags, own):
        if flag is not None and not same_language(flag, mine):  # ISO 639-1 or 639-3 alike
            raise XfError(f"xf export {options.format}: --{name}-lang {flag}: {facts.where} translates "
                          f"{own[0]}-{own[1]} (its recorded languages); leave the flag out")
    return own


def prepare(options: ExportOptions) -> tuple[dict, ModelFacts, tuple[str, str]]:
    """The checkpoint, its facts and the export's direction, every refusal said before a file is
    written: options the format does not read, languages that contradict the model's, and what the
    format cannot hold (the record's ``export_refusal``)."""
    refuse_unused(options)
    ckpt = load_checkpoint(options.path)
    facts = facts_of(ckpt, options.path)
    facts.refuse_export(options.format)
    return ckpt, facts, direction(options, facts)


def weight_type(options: ExportOptions) -> str:
    """The weight type of a CTranslate2 or Argos export: --quantization, float32 for auto."""
    return "float32" if options.quantization == "auto" else options.quantization


def ctranslate2_rows(options: ExportOptions, model) -> list[tuple[str, str]]:
    """The summary rows of a CTranslate2 model: where from, its shape, its weight type."""
    cfg = model.cfg
    return [("from", str(options.path)),
            ("model", f"{cfg.encoder_layers}+{cfg.decoder_layers} layers, d_model {cfg.d_model}, {cfg.vocab_size:,} subwords"),
            ("weights", weight_type(options))]


def export_ctranslate2(options: ExportOptions) -> Path:
    """Write the CTranslate2 model directory of checkpoint options.path to options.output."""
    from ..decode.ctranslate2_engine import import_ctranslate2
    from ..formats.ctranslate2 import write_model_directory

    import_ctranslate2()  # the missing extra is said before anything is read or written
    output = Path(options.output)
    ckpt, _, _ = prepare(options)
    with atomic_directory(output) as tmp:
        model = model_from_checkpoint(ckpt, options.path).eval()
        write_model_directory(tmp, model, ckpt["spm_model"], weight_type(options), str(options.path), ckpt.get("meta"))
    print_summary(stderr_console(), "xf export ctranslate2", [
        *ctranslate2_rows(options, model),
        ("size", f"{sum(p.stat().st_size for p in output.iterdir()) / 2**20:.1f} MiB"),
        ("written", str(output)),
    ])
    return output


def read_bleu(path: str) -> tuple[float, str]:
    """(BLEU, its sacreBLEU signature) of a file written by xf score --json, for the model card."""
    bleu = read_json(path, hint="not the output of xf score --json")
    try:
        bleu = bleu["bleu"]
        return float(bleu["score"]), str(bleu["signature"])
    except (ValueError, KeyError, TypeError) as e:
        raise XfError(f"{path}: not the output of xf score --json with BLEU ({type(e).__name__}: {e})") from None


def export_huggingface(options: ExportOptions) -> Path:
    """Write the MarianMT directory of checkpoint options.path to options.output."""
    from ..formats.huggingface import import_hf_extra, write_marian

    import_hf_extra()
    output = Path(options.output)
    ckpt, _, (source_lang, target_lang) = prepare(options)
    with atomic_directory(output) as tmp:
        model = model_from_checkpoint(ckpt, options.path).eval()
        bleu: Optional[tuple[float, str]] = read_bleu(options.bleu) if options.bleu else None
        config, generation = write_marian(
            tmp, model, ckpt["spm_model"], str(options.path), source_lang, target_lang,
            num_beams=options.beam_size, length_penalty=options.lenpen, max_length=options.max_length, bleu=bleu,
            meta=ckpt.get("meta"))
    print_summary(stderr_console(), "xf export huggingface", [
        ("from", str(options.path)),
        ("model", f"MarianMT, {config['encoder_layers']} / {config['decoder_layers']} layers, d_model "
                  f"{config['d_model']}, {config['activation_function']}, vocabulary {config['vocab_size']}"),
        ("generation", f"num_beams {generation['num_beams']}, length_penalty {generation['length_penalty']}, "
                       f"max_length {generation['max_length']} (--max-length sets it)"),
        ("written", ", ".join(sorted(p.name for p in output.iterdir())) + f" in {output}"),
    ])
    return output


def export_argos(options: ExportOptions) -> Path:
    """Write the Argos Translate package (.argosmodel) of checkpoint options.path to options.output."""
    from ..formats.argos import SENTENCE_ENDS, check_language, check_version, import_argos_extra, write_package

    import_argos_extra()  # the missing extra is said before anything is read or written
    ckpt, _, (source_lang, target_lang) = prepare(options)
    source_lang = check_language(source_lang, "--source-lang")
    target_lang = check_language(target_lang, "--target-lang")
    version = check_version(options.package_version)
    output = Path(options.output)
    model = model_from_checkpoint(ckpt, options.path).eval()
    with atomic_write(output, "wb") as f:
        metadata = write_package(f, model, ckpt["spm_model"], source_lang=source_lang, target_lang=target_lang,
                                 source_name=options.source_name or source_lang,
                                 target_name=options.target_name or target_lang, version=version,
                                 quantization=weight_type(options), source=str(options.path))
    named = lambda code, name: code if name == code else f"{name} ({code})"  # noqa: E731
    print_summary(stderr_console(), "xf export argos", [
        *ctranslate2_rows(options, model),
        ("package", f"{named(source_lang, metadata['from_name'])} -> {named(target_lang, metadata['to_name'])}, "
                    f"version {metadata['package_version']}"),
        ("sentences", f"end at {' '.join(SENTENCE_ENDS)} before a space (its own splitter: nothing downloaded)"),
        ("size", f"{output.stat().st_size / 2**20:.1f} MiB" if output.is_file() else "streamed"),
        ("written", str(output)),
    ])
    return output


def export_bergamot(options: ExportOptions) -> Path:
    """Write the Bergamot directory (model, shortlist, vocabulary, engine, page) of options.path."""
    from ..formats.bergamot import (binary_model, binary_shortlist, check_int8_shapes, direction_name, engine_package,
                                   int8_shape_problem, worker_options, write_directory)
    from ..model.checkpoint import vocab_digest
    from ..formats.marian import marian_config, marian_params
    from ..decode.shortlist import Shortlist

    package = engine_package(options.bergamot_package)  # a missing engine is said before anything is read
    if options.quantization == "bfloat16":
        raise XfError("xf export bergamot: --quantization bfloat16 has no Bergamot form; its WebAssembly engine "
                      "multiplies float32 or int8 (--quantization float32 or int8)")
    ckpt, _, languages = prepare(options)  # what Marian cannot hold, an untied output included
    direction = direction_name(*languages)
    output = Path(options.output)
    model = model_from_checkpoint(ckpt, options.path).eval()
    # auto: int8 where the engine can multiply the model in int8 (smaller and faster in the page,
    # docs/export.md), else float32 and the summary says why
    float32_why = int8_shape_problem(model.cfg) if options.quantization == "auto" else ""
    if options.quantization == "int8":  # asked for: a model the engine cannot multiply is refused
        check_int8_shapes(model.cfg)
    int8 = options.quantization == "int8" or (options.quantization == "auto" and not float32_why)
    shortlist = None
    if options.shortlist is not None:
        shortlist = Shortlist.load(options.shortlist)
        shortlist.check_vocabulary(options.shortlist, model.cfg.vocab_size, vocab_digest(ckpt["spm_model"]))
    model_bytes = binary_model(marian_params(model), marian_config(model), int8)
    with atomic_directory(output) as tmp:
        decoding = worker_options(options.beam_size, options.lenpen)
        lex = binary_shortlist(shortlist) if shortlist is not None else None
        names = write_directory(tmp, model_bytes, int8, lex, ckpt["spm_model"], package, direction, decoding)
    print_summary(stderr_console(), "xf export bergamot", [
        ("from", str(options.path)),
        ("model", f"{names['model']}, {'int8 (intgemm8)' if int8 else 'float32'}, {len(model_bytes) / 2**20:.1f} MiB"
                  + (f" (--quantization auto: float32, as {float32_why})" if float32_why else "")),
        ("shortlist", f"{names['lex']}: {len(shortlist.frequent)} frequent pieces, top {shortlist.k} a source piece"
                      if shortlist is not None else "none (--shortlist FILE from xf shortlist makes the page faster)"),
        ("decoding", f"beam {options.beam_size}, normalize {options.lenpen:g} (score / |Y|^normalize), skip-cost "
                     f"{str(decoding['skip-cost']).lower()}"),
        ("written", f"{output}: open index.html through a static file server (python -m http.server)"),
    ])
    return output


def export_marian(options: ExportOptions) -> Path:
    """Write the Marian model directory of checkpoint options.path to options.output."""
    from ..formats.marian import write_marian_model

    output = Path(options.output)
    ckpt, _, _ = prepare(options)
    with atomic_directory(output) as tmp:
        model = model_from_checkpoint(ckpt, options.path).eval()
        config = write_marian_model(tmp, model, ckpt["spm_model"], str(options.path), options.beam_size, options.lenpen)
    print_summary(stderr_console(), "xf export marian", [
        ("from", str(options.path)),
        ("model", f"Marian transformer, {config['enc-depth']} / {config['dec-depth']} layers, dim-emb "
                  f"{config['dim-emb']}, {config['transformer-ffn-activation']}, vocabulary {config['dim-vocabs'][0]}"),
        ("decoding", f"beam-size {options.beam_size}, normalize {options.lenpen} (decoder.yml)"),
        ("written", ", ".join(sorted(p.name for p in output.iterdir())) + f" in {output}"),
    ])
    return output


def export(options: ExportOptions) -> Path:
    """xf export FORMAT: ctranslate2, huggingface, argos, marian or bergamot."""
    exports = {"huggingface": export_huggingface, "argos": export_argos, "marian": export_marian,
               "bergamot": export_bergamot}
    return exports.get(options.format, export_ctranslate2)(options)
