"""``xf export ctranslate2|huggingface|argos --path CKPT --output PATH``: an xf checkpoint as a
model of another runtime. The conversions are the format modules' (``ctranslate2_format``:
a CTranslate2 model directory, run by ``xf translate --engine ctranslate2``; ``huggingface``: a
MarianMT directory; ``argos_format``: an Argos Translate package, one file); this command owns the
options, the output (written atomically: built in a temporary directory or file beside it, then
renamed into place; an old output directory with --overwrite renamed aside first, deleted once the
new one is in place) and the summary.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from ..checkpoint import load_checkpoint, model_from_checkpoint
from ..console import print_summary, stderr_console
from ..errors import XfError
from ..fileio import atomic_directory, atomic_write
from ..json_input import read_json
from ..options import ExportOptions


def ctranslate2_rows(options: ExportOptions, model) -> list[tuple[str, str]]:
    """The summary rows of a CTranslate2 model: where from, its shape, its weight type."""
    cfg = model.cfg
    return [("from", str(options.path)),
            ("model", f"{cfg.encoder_layers}+{cfg.decoder_layers} layers, d_model {cfg.d_model}, {cfg.vocab_size:,} subwords"),
            ("weights", options.quantization)]


def export_ctranslate2(options: ExportOptions) -> Path:
    """Write the CTranslate2 model directory of checkpoint options.path to options.output."""
    from ..ctranslate2_format import import_ctranslate2, write_model_directory

    import_ctranslate2()  # the missing extra is said before anything is read or written
    output = Path(options.output)
    with atomic_directory(output) as tmp:
        ckpt = load_checkpoint(options.path)
        model = model_from_checkpoint(ckpt, options.path).eval()
        write_model_directory(tmp, model, ckpt["spm_model"], options.quantization, str(options.path))
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
    from ..huggingface import import_hf_extra, write_marian

    import_hf_extra()
    output = Path(options.output)
    with atomic_directory(output) as tmp:
        ckpt = load_checkpoint(options.path)
        model = model_from_checkpoint(ckpt, options.path).eval()
        bleu: Optional[tuple[float, str]] = read_bleu(options.bleu) if options.bleu else None
        config, generation = write_marian(
            tmp, model, ckpt["spm_model"], str(options.path), options.source_lang, options.target_lang,
            num_beams=options.beam_size, length_penalty=options.lenpen, max_length=options.max_length, bleu=bleu)
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
    from ..argos_format import SENTENCE_ENDS, check_language, check_version, import_argos_extra, write_package

    import_argos_extra()  # the missing extra is said before anything is read or written
    source_lang = check_language(options.source_lang, "--source-lang")
    target_lang = check_language(options.target_lang, "--target-lang")
    version = check_version(options.package_version)
    output = Path(options.output)
    ckpt = load_checkpoint(options.path)
    model = model_from_checkpoint(ckpt, options.path).eval()
    with atomic_write(output, "wb") as f:
        metadata = write_package(f, model, ckpt["spm_model"], source_lang=source_lang, target_lang=target_lang,
                                 source_name=options.source_name or source_lang,
                                 target_name=options.target_name or target_lang, version=version,
                                 quantization=options.quantization, source=str(options.path))
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


def export(options: ExportOptions) -> Path:
    """xf export FORMAT: ctranslate2, huggingface or argos."""
    if options.format == "huggingface":
        return export_huggingface(options)
    if options.format == "argos":
        return export_argos(options)
    return export_ctranslate2(options)
