"""``xf export ctranslate2|huggingface|marian --path CKPT --output DIR``: an xf checkpoint as a model
directory of another runtime. The conversions are the format modules' (``ctranslate2_format``:
a CTranslate2 model directory, run by ``xf translate --engine ctranslate2``; ``huggingface``: a
MarianMT directory; ``marian_format``: a Marian model.npz, vocabulary and decoder.yml); this
command owns the options, the output (written atomically: built in a temporary directory beside
it, then renamed into place; an old output with --overwrite renamed aside first, deleted once the
new one is in place) and the summary.
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
    """xf export FORMAT: ctranslate2, huggingface or marian."""
    if options.format == "huggingface":
        return export_huggingface(options)
    if options.format == "marian":
        return export_marian(options)
    return export_ctranslate2(options)
