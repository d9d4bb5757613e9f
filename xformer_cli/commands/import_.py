"""``xf import huggingface DIR --output CKPT``: a MarianMT directory (an OPUS-MT model, or one that
xf exported) as an xf checkpoint that translate, average, train --init-from and export read.
The reading, checking and mapping are ``huggingface.read_marian``; this command owns the output
and the summary."""

from __future__ import annotations

import contextlib
from pathlib import Path

from ..base.console import print_summary, stderr_console
from ..settings.options import ImportOptions


def import_model(options: ImportOptions) -> Path:
    from ..model.checkpoint import make_checkpoint, save_checkpoint
    from ..formats.huggingface import marian_languages, read_marian

    directory, output = Path(options.directory), Path(options.output)  # the frame guarded the output
    console = stderr_console()
    with console.status(f"reading {directory}") if console.is_terminal else contextlib.nullcontext():
        model, spm_model = read_marian(directory)
        meta = {"imported_from": str(directory.resolve()), "format": "huggingface-marian",
                **marian_languages(directory)}  # a multilingual xf export's pairs
        save_checkpoint(output, make_checkpoint(model, spm_model, meta=meta))
    cfg = model.cfg
    tensors = {t.data_ptr(): t for t in model.state_dict().values()}  # tied tensors once
    print_summary(console, "xf import huggingface", [
        ("from", str(directory)),
        ("layers", f"{cfg.encoder_layers} / {cfg.decoder_layers}, d_model {cfg.d_model}, d_ff {cfg.d_ff}, "
                   f"heads {cfg.heads}, {cfg.activation}"),
        ("vocabulary", f"{cfg.vocab_size} ids, embeddings shared: {cfg.share_embeddings}"),
        ("parameters", f"{sum(t.numel() for t in tensors.values()):,}"),
        *([("languages", ", ".join(meta["pairs"]) + " (xf translate --target-lang)")] if "pairs" in meta else []),
        ("written", str(output)),
    ])
    return output
