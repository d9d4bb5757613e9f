"""``xf import huggingface DIR --output CKPT``: a MarianMT directory (an OPUS-MT model, or one that
xf exported) as an xf checkpoint that translate, average, train --init-from and export read.
The reading, checking and mapping are ``huggingface.import_marian``."""

from __future__ import annotations

from ..console import print_table, stderr_console
from ..options import ImportOptions


def import_model(options: ImportOptions) -> None:
    from rich.table import Table

    from ..checkpoint import load_checkpoint
    from ..huggingface import import_marian

    console = stderr_console()
    with console.status(f"reading {options.directory}", spinner="dots") if console.is_terminal else _nothing():
        output = import_marian(options)
    ckpt = load_checkpoint(output)
    cfg = ckpt["model_config"]
    table = Table(title="xf import huggingface", show_header=False)
    table.add_column()
    table.add_column()
    table.add_row("from", str(options.directory))
    table.add_row("layers", f"{cfg['encoder_layers']} / {cfg['decoder_layers']}, d_model {cfg['d_model']}, "
                  f"d_ff {cfg['d_ff']}, heads {cfg['heads']}, {cfg['activation']}")
    table.add_row("vocabulary", f"{cfg['vocab_size']} ids, embeddings shared: {cfg['share_embeddings']}")
    table.add_row("parameters", f"{sum(t.numel() for t in {id(t): t for t in ckpt['model'].values()}.values()):,}")
    table.add_row("written", str(output))
    print_table(console, table)


def _nothing():
    import contextlib

    return contextlib.nullcontext()
