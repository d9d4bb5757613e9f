"""``xf import huggingface DIR --output CKPT``: a MarianMT directory (an OPUS-MT model, or one that
xf exported) as an xf checkpoint that translate, average, train --init-from and export read.
The reading, checking and mapping are ``huggingface.import_marian``."""

from __future__ import annotations

import contextlib

from ..console import print_summary, stderr_console
from ..options import ImportOptions


def import_model(options: ImportOptions) -> None:
    from ..checkpoint import load_checkpoint
    from ..huggingface import import_marian

    console = stderr_console()
    with console.status(f"reading {options.directory}") if console.is_terminal else contextlib.nullcontext():
        output = import_marian(options)
    ckpt = load_checkpoint(output)
    cfg = ckpt["model_config"]
    tensors = {t.data_ptr(): t for t in ckpt["model"].values()}  # tied tensors once
    print_summary(console, "xf import huggingface", [
        ("from", str(options.directory)),
        ("layers", f"{cfg['encoder_layers']} / {cfg['decoder_layers']}, d_model {cfg['d_model']}, d_ff {cfg['d_ff']}, "
                   f"heads {cfg['heads']}, {cfg['activation']}"),
        ("vocabulary", f"{cfg['vocab_size']} ids, embeddings shared: {cfg['share_embeddings']}"),
        ("parameters", f"{sum(t.numel() for t in tensors.values()):,}"),
        ("written", str(output)),
    ])
