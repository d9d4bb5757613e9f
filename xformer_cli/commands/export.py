"""``xf export ctranslate2|huggingface|marian|bergamot --path CKPT --output DIR``: an xf checkpoint
as a model directory of another runtime. The conversions are the format modules' (``ctranslate2_format``:
a CTranslate2 model directory, run by ``xf translate --engine ctranslate2``; ``huggingface``: a
MarianMT directory; ``marian_format``: a Marian model.npz, vocabulary and decoder.yml;
``bergamot_format``: Bergamot's files over ``marian_format``'s parameters, and a page that translates
in the browser); this command owns the options, the output (written atomically: built in a
temporary directory beside it, then renamed into place; an old output with --overwrite renamed
aside first, deleted once the new one is in place) and the summary.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from ..checkpoint import load_checkpoint, model_from_checkpoint
from ..console import print_summary, stderr_console
from ..errors import XfError
from ..fileio import atomic_directory
from ..json_input import read_json
from ..options import ExportOptions


def export_ctranslate2(options: ExportOptions) -> Path:
    """Write the CTranslate2 model directory of checkpoint options.path to options.output."""
    from ..ctranslate2_format import import_ctranslate2, write_model_directory

    import_ctranslate2()  # the missing extra is said before anything is read or written
    output = Path(options.output)
    with atomic_directory(output) as tmp:
        ckpt = load_checkpoint(options.path)
        model = model_from_checkpoint(ckpt, options.path).eval()
        write_model_directory(tmp, model, ckpt["spm_model"], options.quantization, str(options.path))
    cfg = model.cfg
    print_summary(stderr_console(), "xf export ctranslate2", [
        ("from", str(options.path)),
        ("model", f"{cfg.encoder_layers}+{cfg.decoder_layers} layers, d_model {cfg.d_model}, "
                  f"{cfg.vocab_size:,} subwords"),
        ("weights", options.quantization),
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


def export_bergamot(options: ExportOptions) -> Path:
    """Write the Bergamot directory (model, shortlist, vocabulary, engine, page) of options.path."""
    from ..bergamot_format import (binary_model, binary_shortlist, check_int8_shapes, direction_name, engine_package,
                                   refuse_untied_output, write_directory)
    from ..checkpoint import vocab_digest
    from ..marian_format import marian_config, marian_params, refuse_unmarian
    from ..shortlist import Shortlist
    from ..vocab import MappedVocabulary, load_sentencepiece

    package = engine_package(options.bergamot_package)  # a missing engine is said before anything is read
    if options.quantization == "bfloat16":
        raise XfError("xf export bergamot: --quantization bfloat16 has no Bergamot form; its WebAssembly engine "
                      "multiplies float32 or int8 (--quantization float32 or int8)")
    direction = direction_name(options.source_lang, options.target_lang)
    output = Path(options.output)
    ckpt = load_checkpoint(options.path)
    model = model_from_checkpoint(ckpt, options.path).eval()
    refuse_unmarian(model, str(options.path))
    if isinstance(load_sentencepiece(ckpt["spm_model"], str(options.path)), MappedVocabulary):  # as write_marian_model
        raise XfError(f"{options.path}: its vocabulary is a mapped one (two sentencepiece models, from xf import "
                      "huggingface); Bergamot reads one sentencepiece model's own ids")
    refuse_untied_output(model.cfg)
    int8 = options.quantization == "int8"
    if int8:
        check_int8_shapes(model.cfg)
    shortlist = None
    if options.shortlist is not None:
        shortlist = Shortlist.load(options.shortlist)
        shortlist.check_vocabulary(options.shortlist, model.cfg.vocab_size, vocab_digest(ckpt["spm_model"]))
    model_bytes = binary_model(marian_params(model), marian_config(model), int8)
    with atomic_directory(output) as tmp:
        decoding = {"beam-size": options.beam_size, "normalize": options.lenpen, "allow-unk": True}  # unk: as xf
        lex = binary_shortlist(shortlist) if shortlist is not None else None
        names = write_directory(tmp, model_bytes, int8, lex, ckpt["spm_model"], package, direction, decoding)
    print_summary(stderr_console(), "xf export bergamot", [
        ("from", str(options.path)),
        ("model", f"{names['model']}, {'int8 (intgemm8)' if int8 else 'float32'}, {len(model_bytes) / 2**20:.1f} MiB"),
        ("shortlist", f"{names['lex']}: {len(shortlist.frequent)} frequent pieces, top {shortlist.k} a source piece"
                      if shortlist is not None else "none (--shortlist FILE from xf shortlist makes the page faster)"),
        ("decoding", f"beam {options.beam_size}, normalize {options.lenpen:g} (score / |Y|^normalize)"),
        ("written", f"{output}: open index.html through a static file server (python -m http.server)"),
    ])
    return output


def export_marian(options: ExportOptions) -> Path:
    """Write the Marian model directory of checkpoint options.path to options.output."""
    from ..marian_format import write_marian_model

    output = Path(options.output)
    with atomic_directory(output) as tmp:
        ckpt = load_checkpoint(options.path)
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
    """xf export FORMAT: ctranslate2, huggingface, marian or bergamot."""
    if options.format == "huggingface":
        return export_huggingface(options)
    if options.format == "marian":
        return export_marian(options)
    if options.format == "bergamot":
        return export_bergamot(options)
    return export_ctranslate2(options)
