"""The pictures of ``xf plot``: training curves of runs from their train_log.jsonl, and the
attention of a checkpoint on one sentence (as heat maps, or as lines between the tokens).

matplotlib is an optional extra (``pip install 'xformer-cli[plot]'``); figures are drawn on
matplotlib's Agg canvas without pyplot, so nothing needs a display, and written atomically. The
attention weights themselves are recorded by ``attention_maps.force_decode``; this module selects
what to show and draws it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from ..base.errors import ConfigError, XfError
from ..base.fileio import atomic_write
from ..base.json_input import parse_json
from ..settings.options import DecodingOptions, PlotAttentionOptions

FORMATS = ("png", "pdf", "svg")
DPI = 110


def require_matplotlib() -> None:
    """Without matplotlib, a one-line error saying how to install it (before any other work)."""
    try:
        import matplotlib.backends.backend_agg  # noqa: F401
        import matplotlib.figure  # noqa: F401
    except ImportError:
        raise XfError("xf plot needs matplotlib: pip install 'xformer-cli[plot]' (or pip install matplotlib)") from None


# The largest picture written: what image libraries open without refusing it as a decompression
# bomb (Pillow's MAX_IMAGE_PIXELS, about 89 megapixels), and 32,767 pixels a side (libpng, browsers).
MAX_PIXELS, MAX_SIDE = 89_478_485, 32_767


def new_figure(width: float, height: float):
    """A matplotlib Figure on the headless Agg canvas (no pyplot, no display); refused, before any
    drawing, when ``width`` x ``height`` inches at DPI would be a picture too large to open."""
    w, h = round(width * DPI), round(height * DPI)
    if w * h > MAX_PIXELS or max(w, h) > MAX_SIDE:
        raise XfError(f"the picture would be {w:,} x {h:,} pixels, more than image viewers open ({MAX_PIXELS / 1e6:.0f} "
                      f"megapixels, {MAX_SIDE:,} a side): choose one --layer and --head, or a shorter sentence")
    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def image_format(path: str) -> str:
    """The image format of ``path``: its suffix, one of FORMATS."""
    fmt = Path(path).suffix.lower().lstrip(".")
    if fmt not in FORMATS:
        raise ConfigError(f"{path}: the picture's name must end in {', '.join('.' + f for f in FORMATS)}")
    return fmt


def save_figure(fig, path: str) -> None:
    """Write the figure atomically: the old file stays whole until the new one is complete."""
    fmt = image_format(path)
    with atomic_write(path, "wb") as f:
        fig.savefig(f, format=fmt, dpi=DPI)


# -- training curves -----------------------------------------------------------------------------
@dataclass
class LoggedRun:
    """The records of one training run (all its resumes), with ``minutes`` of wall time added."""

    label: str
    train: list[dict] = field(default_factory=list)
    valid: list[dict] = field(default_factory=list)


def train_log_path(save_dir: str) -> Path:
    path = Path(save_dir)
    return path if path.suffix == ".jsonl" and not path.is_dir() else path / "train_log.jsonl"


def read_train_log(path: Path) -> list[tuple[int, dict]]:
    """(line number, record) of every record. The last line of a run still going may be only
    partly written: it is ignored unless it is complete. Any other bad line is an error."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise XfError(f"{path}: not found (a save directory of xf train holds train_log.jsonl)") from None
    except OSError as e:
        raise XfError(f"{path}: cannot read: {e.strerror}") from None
    lines = data.split(b"\n")
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:  # invalid UTF-8 becomes U+FFFD: outside a string, invalid JSON; inside one, a changed label
            record = parse_json(line.decode("utf-8", "replace"), f"{path} line {number}",
                                hint="not a record of xf train")
        except XfError:
            if number == len(lines):  # no newline yet: being written
                continue
            raise
        if not isinstance(record, dict) or "type" not in record:
            raise XfError(f"{path} line {number}: not a record of xf train (no 'type')")
        records.append((number, record))
    return records


def read_run(path: Path, label: str) -> LoggedRun:
    """A run's train and valid records. Wall time counts each process from its start record to
    its last record (validation included, the pauses between resumes not). A resume that starts
    from update U drops the records after U of the process before it: those updates were redone."""
    run = LoggedRun(label)
    offset, started, last = 0.0, None, None
    for number, record in read_train_log(path):
        kind = record["type"]
        if kind not in ("start", "train", "valid", "summary"):
            continue
        if not isinstance(record.get("time"), (int, float)):
            raise XfError(f"{path} line {number}: a '{kind}' record without its 'time'")
        if kind in ("start", "train", "valid") and not isinstance(record.get("update"), int):
            raise XfError(f"{path} line {number}: a '{kind}' record without its 'update'")
        if kind == "start":
            if started is not None:
                offset += last - started
            started = last = record["time"]
            run.train = [r for r in run.train if r["update"] <= record["update"]]
            run.valid = [r for r in run.valid if r["update"] <= record["update"]]
            continue
        if started is None:  # a log without its start record: count from its first record
            started = record["time"]
        last = record["time"]
        if kind in ("train", "valid"):
            getattr(run, kind).append({**record, "minutes": (offset + last - started) / 60})
    if not run.train and not run.valid:
        raise XfError(f"{path}: no training or validation records yet")
    return run


def run_labels(paths: Sequence[Path]) -> list[str]:
    """Legend names: the shortest ends of the save directories' paths (at least two parts, as
    'quickstart/checkpoints') that tell them apart."""
    parts = [p.resolve().parts for p in paths]
    for k in range(2, max(map(len, parts)) + 1):
        labels = ["/".join(p[-k:]) for p in parts]
        if len(set(labels)) == len(labels):
            return labels
    return [str(p) for p in paths]  # the same directory twice


# (panel title, record kind, key); BLEU only when some run logged it
PANELS = [
    ("loss (label-smoothed, nats per target token)", None, "loss"),
    ("validation BLEU (greedy)", "valid", "bleu"),
    ("learning rate", "train", "lr"),
    ("target tokens/s (training)", "train", "tgt_tok_s"),
]


def curves_figure(runs: Sequence[LoggedRun], wall_time: bool = False):
    """Panels of PANELS in a grid of two columns; one colour per run; training loss solid,
    validation loss dashed with a marker per validation."""
    has_bleu = any("bleu" in r for run in runs for r in run.valid)
    panels = [p for p in PANELS if p[2] != "bleu" or has_bleu]
    rows = (len(panels) + 1) // 2
    fig = new_figure(11, 3.4 * rows + 0.5)
    from matplotlib.lines import Line2D

    axes = fig.subplots(rows, 2, squeeze=False).ravel()
    for ax in axes[len(panels):]:
        fig.delaxes(ax)
    x_key = "minutes" if wall_time else "update"
    colors = [f"C{i % 10}" for i in range(len(runs))]
    for ax, (title, kind, key) in zip(axes, panels):
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("minutes of training (wall time)" if wall_time else "updates")
        ax.grid(alpha=0.3)
        for run, color in zip(runs, colors):
            for k in (("train", "valid") if kind is None else (kind,)):
                points = [(r[x_key], r[key]) for r in getattr(run, k) if isinstance(r.get(key), (int, float))]
                if not points:
                    continue
                xs, ys = zip(*points)
                style = dict(linestyle="--", marker="o", markersize=3.5) if k == "valid" else dict(linewidth=1.2)
                ax.plot(xs, ys, color=color, label=f"{run.label} {k}", **style)
        if key == "lr":
            ax.ticklabel_format(axis="y", style="sci", scilimits=(-2, 3))
        if kind is None:
            ax.legend(
                [Line2D([], [], color="0.3"), Line2D([], [], color="0.3", linestyle="--", marker="o", markersize=3.5)],
                ["training", "validation"], fontsize=8,
            )
    fig.legend(
        [Line2D([], [], color=c, linewidth=2) for c in colors], [run.label for run in runs],
        loc="outside upper center", ncol=min(len(runs), 3), frameon=False,
    )
    return fig


# -- attention maps ------------------------------------------------------------------------------
def _resolve_index(value: Optional[int], count: int, what: str) -> list[int]:
    """0-based indices of all layers/heads (None) or of one, given from 1 (negative from the end)."""
    if value is None:
        return list(range(count))
    if 1 <= value <= count:
        return [value - 1]
    if -count <= value <= -1:
        return [count + value]
    raise ConfigError(f"--{what} {value}: the model has {count} {what}s (1 to {count}, or -1 to -{count})")


@dataclass
class AttentionPicture:
    """What one attention figure shows: weights (layers, heads, rows, columns) of one sentence."""

    title: str
    weights: Any  # numpy array (L, H, T, S)
    layers: list[int]  # 0-based numbers of the layers shown
    heads: list[int]
    rows: list[str]  # the query tokens
    columns: list[str]  # the key tokens
    axis_names: tuple[str, str] = ("queries", "keys")  # (rows, columns)


def attention_heatmaps(picture: AttentionPicture):
    """A grid of heat maps, layers x heads; pieces on the axes of the outer panels."""
    n_layers, n_heads = len(picture.layers), len(picture.heads)
    n_rows, n_cols = len(picture.rows), len(picture.columns)
    # inches per token: about 14 inches for the widest row of panels, but never below 6-point text
    cell = min(0.24, max(0.12, 14.0 / max(n_cols * n_heads, n_rows * n_layers)))
    panel_w, panel_h = max(1.6, cell * n_cols), max(1.6, cell * n_rows)
    fig = new_figure(panel_w * n_heads + 1.8, panel_h * n_layers + 1.6)
    axes = fig.subplots(n_layers, n_heads, squeeze=False)
    font = 8 if cell >= 0.18 else 6
    image = None
    for i, layer in enumerate(picture.layers):
        for j, head in enumerate(picture.heads):
            ax = axes[i, j]
            image = ax.imshow(picture.weights[i, j], cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto",
                              interpolation="nearest")
            if n_layers * n_heads > 1:
                ax.set_title(f"layer {layer + 1}, head {head + 1}", fontsize=9)
            ax.set_xticks(range(n_cols))
            ax.set_yticks(range(n_rows))
            if i == n_layers - 1:
                ax.set_xticklabels(picture.columns, rotation=90, fontsize=font)
                ax.set_xlabel(picture.axis_names[1], fontsize=9)
            else:
                ax.set_xticklabels([])
            if j == 0:
                ax.set_yticklabels(picture.rows, fontsize=font)
                ax.set_ylabel(picture.axis_names[0], fontsize=9)
            else:
                ax.set_yticklabels([])
            ax.tick_params(length=0)
    fig.colorbar(image, ax=axes, shrink=min(1.0, 4.0 / (panel_h * n_layers + 1)), label="attention weight")
    fig.suptitle(picture.title, fontsize=10)
    return fig


def attention_lines(picture: AttentionPicture):
    """The paper's Figures 3-5, drawn top to bottom: query tokens on the left, key tokens on the
    right, a line from each query to each key as opaque as its weight, one colour per head."""
    (layer,) = picture.layers
    n_rows, n_cols = len(picture.rows), len(picture.columns)
    height = max(n_rows, n_cols)
    fig = new_figure(6.0, 0.28 * height + 1.6)
    from matplotlib.collections import LineCollection
    from matplotlib.colors import to_rgba
    from matplotlib.lines import Line2D

    ax = fig.subplots()
    y_rows = [height - 1 - i * (height - 1) / max(n_rows - 1, 1) for i in range(n_rows)]
    y_cols = [height - 1 - i * (height - 1) / max(n_cols - 1, 1) for i in range(n_cols)]
    colors = [to_rgba(f"C{h % 10}") for h in picture.heads]
    for j, head in enumerate(picture.heads):
        w = picture.weights[0, j]
        segments, rgba = [], []
        for q in range(n_rows):
            for k in range(n_cols):
                weight = float(w[q, k])
                if weight >= 0.05:  # fainter lines would only blur the picture
                    segments.append([(0.0, y_rows[q]), (1.0, y_cols[k])])
                    rgba.append((*colors[j][:3], weight / max(1, len(picture.heads)) ** 0.5))
        ax.add_collection(LineCollection(segments, colors=rgba, linewidths=2.0))
    for y, token in zip(y_rows, picture.rows):
        ax.text(-0.03, y, token, ha="right", va="center", fontsize=9)
    for y, token in zip(y_cols, picture.columns):
        ax.text(1.03, y, token, ha="left", va="center", fontsize=9)
    ax.set_xlim(-0.5, 1.5)
    ax.set_ylim(-0.8, height - 0.2)
    ax.axis("off")
    if len(picture.heads) > 1:
        ax.legend([Line2D([], [], color=c, linewidth=2) for c in colors],
                  [f"head {h + 1}" for h in picture.heads], loc="upper center", bbox_to_anchor=(0.5, 0.0),
                  ncol=min(len(picture.heads), 8), fontsize=8, frameon=False)
    ax.set_title(picture.title, fontsize=10)
    return fig


def attention_picture(options: PlotAttentionOptions, maps, src_pieces: list[str], tgt_pieces: list[str]) -> AttentionPicture:
    """Select what the options ask for from AttentionMaps of one sentence.

    src_pieces and tgt_pieces end with </s>. Cross-attention rows are the target pieces each
    position predicts (as --print-alignment counts them); in decoder self-attention both axes are
    the decoder's input, <s> and the target without its </s>.
    """
    import torch

    per_layer = {"cross": maps.cross, "encoder": maps.encoder, "decoder": maps.decoder}[options.attention]
    layers = _resolve_index(options.layer, len(per_layer), "layer")
    heads = _resolve_index(options.head, per_layer[0].size(1), "head")
    weights = torch.stack([per_layer[i][0] for i in layers])[:, heads]  # (L, H, T, S)
    decoder_input = ["<s>"] + tgt_pieces[:-1]
    rows, columns = {
        "cross": (tgt_pieces, src_pieces), "encoder": (src_pieces, src_pieces),
        "decoder": (decoder_input, decoder_input),
    }[options.attention]
    name = {"cross": "encoder-decoder attention", "encoder": "encoder self-attention",
            "decoder": "decoder self-attention"}[options.attention]
    where = f"layer {layers[0] + 1} of {len(per_layer)}" if len(layers) == 1 else f"{len(per_layer)} layers"
    if len(heads) == 1:
        where += f", head {heads[0] + 1} of {per_layer[0].size(1)}"
    axis_names = {"cross": ("target (the piece each row predicts)", "source"), "encoder": ("source (queries)", "source (keys)"),
                  "decoder": ("decoder input (queries)", "decoder input (keys)")}[options.attention]
    return AttentionPicture(f"{name}, {where}", weights.cpu().numpy(), layers, heads, rows, columns, axis_names)


def attention_figure(options: PlotAttentionOptions):
    """The figure of ``xf plot attention``: load the checkpoint, translate unless --target, record."""
    import torch

    from ..model.attention_maps import force_decode
    from ..data.batching import collate_source
    from ..model.checkpoint import load_ensemble
    from ..base.distributed import resolve_device
    from ..decode.search import beam_search
    from ..text.vocab import EOS_ID, encode_target

    if options.style == "lines" and options.layer is None:
        raise ConfigError("--style lines draws one layer: choose it with --layer N")
    device = resolve_device(options.device)
    models, sp = load_ensemble([options.path], device)
    model = models[0]
    src_ids = sp.encode(options.source, out_type=int)
    if not src_ids:
        raise ConfigError("--source is empty")
    limit = model.cfg.max_positions - 1
    if len(src_ids) > limit:
        raise XfError(f"--source has {len(src_ids)} subwords; the model takes at most {limit}")
    src = collate_source([src_ids]).to(device)
    if options.target is None:
        tokens = beam_search([model], src, DecodingOptions(beam_size=options.beam_size))[0][0].tokens
    else:
        tokens = encode_target(sp, options.target, out_type=int) + [EOS_ID]  # an imported model's target model
        if len(tokens) > limit:
            raise XfError(f"--target has {len(tokens) - 1} subwords; the model takes at most {limit - 1}")
    with torch.inference_mode():
        maps = force_decode(model, src, [tokens])
    src_pieces = [sp.id_to_piece(i) for i in src_ids] + ["</s>"]
    tgt_pieces = [sp.id_to_piece(i) for i in tokens[:-1]] + ["</s>"]
    picture = attention_picture(options, maps, src_pieces, tgt_pieces)
    return (attention_lines if options.style == "lines" else attention_heatmaps)(picture)
