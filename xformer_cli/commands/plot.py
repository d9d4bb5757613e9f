"""xf plot: training curves from train_log.jsonl, and attention maps of a checkpoint.

The pictures are the library's (``train/plots.py``); this module checks the options and the picture's
format before any work (the frame's guard has checked the output's directory), writes the figure
and says where.
"""

from __future__ import annotations

import sys

from ..base.errors import ConfigError
from ..settings.options import PlotAttentionOptions, PlotCurvesOptions
from ..train.plots import (attention_figure, curves_figure, image_format, read_run, require_matplotlib, run_labels,
                     save_figure, train_log_path)


def write(fig, path: str) -> None:
    save_figure(fig, path)
    print(f"xf: wrote {path}", file=sys.stderr)


def plot_curves(options: PlotCurvesOptions) -> None:
    """xf plot curves: one figure of one or more runs, from their train_log.jsonl only."""
    if not options.save_dirs:
        raise ConfigError("give one or more save directories of xf train")
    image_format(options.output)  # refused before any work
    require_matplotlib()
    paths = [train_log_path(d) for d in options.save_dirs]
    labels = run_labels([p.parent for p in paths])
    runs = [read_run(path, label) for path, label in zip(paths, labels)]
    write(curves_figure(runs, options.wall_time), options.output)


def plot_attention(options: PlotAttentionOptions) -> None:
    """xf plot attention: the model's attention on one sentence, force-decoding a translation."""
    image_format(options.output)  # refused before any work
    require_matplotlib()
    write(attention_figure(options), options.output)
