"""xf plot: curves from train_log.jsonl (a run still going, resumes, several runs), attention
heat maps with the pieces on their axes, atomic non-blank PNGs, and the error without matplotlib."""

import json
import os
import sys

import pytest
import torch
from typer.testing import CliRunner

pytest.importorskip("matplotlib", reason="xf plot needs matplotlib (the plot extra)")

from matplotlib.image import imread  # noqa: E402


from xformer_cli.model.attention_maps import AttentionMaps  # noqa: E402
from xformer_cli.cli import app  # noqa: E402
from xformer_cli.base.errors import XfError  # noqa: E402
from xformer_cli.settings.options import PlotAttentionOptions, PlotCurvesOptions  # noqa: E402
from xformer_cli.commands.plot import plot_curves  # noqa: E402
from xformer_cli.train.plots import (  # noqa: E402
    attention_figure,
    attention_heatmaps,
    attention_lines,
    attention_picture,
    curves_figure,
    new_figure,
    read_run,
    run_labels,
    save_figure,
)

runner = CliRunner()
T0 = 1_800_000_000.0


def write_log(path, records, tail=""):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + tail, encoding="utf-8")
    return path


def fake_run(updates=40, log_interval=5, validate_every=10, bleu=True, start_update=0, t0=T0):
    """Records as xf train writes them: a start, train records, validations."""
    records = [{"type": "start", "time": t0, "update": start_update, "epoch": 1}]
    for u in range(start_update + 1, start_update + updates + 1):
        t = t0 + 2.0 * (u - start_update)
        if u % log_interval == 0:
            records.append({"type": "train", "time": t, "epoch": 1, "update": u, "loss": 8 - u / 20, "nll": 7.0,
                            "ppl": 1000.0, "lr": 1e-4 * u, "gnorm": 1.0, "src_tok_s": 2000.0, "tgt_tok_s": 2100.0 + u,
                            "ups": 1.0, "elapsed": 2.0 * u})
        if u % validate_every == 0:
            valid = {"type": "valid", "time": t + 0.5, "epoch": 1, "update": u, "loss": 7.5 - u / 25, "nll": 6.0,
                     "ppl": 400.0, "best": 1.0}
            if bleu:
                valid["bleu"] = u / 2
            records.append(valid)
    return records


def lines_of(ax):
    return {line.get_label(): line for line in ax.get_lines()}


def test_curves_have_a_point_per_validation_and_ignore_a_partial_last_line(tmp_path):
    log = write_log(tmp_path / "run" / "checkpoints" / "train_log.jsonl", fake_run(),
                    tail='{"type": "train", "time": 18000')  # a run still writing its next line
    run = read_run(log, "run")
    assert len(run.valid) == 4 and len(run.train) == 8
    fig = curves_figure([run])
    assert len(fig.axes) == 4
    loss, bleu, lr, speed = fig.axes
    assert list(lines_of(loss)["run valid"].get_xdata()) == [10, 20, 30, 40]
    assert len(lines_of(loss)["run train"].get_xdata()) == 8
    assert list(lines_of(bleu)["run valid"].get_ydata()) == [5, 10, 15, 20]
    assert list(lines_of(lr)["run train"].get_ydata()) == pytest.approx([1e-4 * u for u in range(5, 41, 5)])
    assert "tokens/s" in speed.get_title()

    no_bleu = read_run(write_log(tmp_path / "b" / "train_log.jsonl", fake_run(bleu=False)), "b")
    assert len(curves_figure([no_bleu]).axes) == 3  # no BLEU panel when no run logged BLEU


def test_wall_time_and_resumes(tmp_path):
    # A first process logged updates 1-40 and died; the resume starts from its checkpoint at
    # update 30, an hour later: updates 31-40 of the first process are dropped, the hour is not counted.
    first = fake_run(updates=40)
    second = fake_run(updates=20, start_update=30, t0=T0 + 3600 + 80)
    run = read_run(write_log(tmp_path / "r" / "train_log.jsonl", first + second), "r")
    updates = [r["update"] for r in run.train]
    assert updates == sorted(updates) and updates == list(range(5, 51, 5))
    assert [r["update"] for r in run.valid] == [10, 20, 30, 40, 50]
    # first process: 80.5 s to its last record (valid at update 40); the second counts from there
    minutes = {r["update"]: r["minutes"] for r in run.valid}
    assert minutes[30] == pytest.approx(60.5 / 60)
    assert minutes[40] == pytest.approx((80.5 + 20.5) / 60)
    fig = curves_figure([run], wall_time=True)
    assert list(lines_of(fig.axes[0])["r valid"].get_xdata()) == pytest.approx([m for m in minutes.values()])
    assert "wall time" in fig.axes[0].get_xlabel()


@pytest.mark.slow
def test_several_runs_are_overlaid_with_their_names(tmp_path):
    a = write_log(tmp_path / "dropout0.3" / "checkpoints" / "train_log.jsonl", fake_run())
    b = write_log(tmp_path / "dropout0.2" / "checkpoints" / "train_log.jsonl", fake_run(updates=20))
    out = tmp_path / "curves.png"
    result = runner.invoke(app, ["plot", "curves", str(a.parent), str(b), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert run_labels([a.parent, b.parent]) == ["dropout0.3/checkpoints", "dropout0.2/checkpoints"]
    assert run_labels([tmp_path / "x" / "ck", tmp_path / "y" / "ck"]) == ["x/ck", "y/ck"]
    image = imread(out)
    assert image.ndim == 3 and image.shape[0] > 300 and image.shape[1] > 600
    assert image[..., :3].std() > 0.05  # not blank


def test_bad_logs_are_one_line_errors(tmp_path):
    def fails(args, message, code=1):
        result = runner.invoke(app, ["plot", "curves", *map(str, args)])
        assert result.exit_code == code, result.output
        assert message in result.output and "Traceback" not in result.output

    fails([tmp_path / "missing"], "train_log.jsonl: not found")
    bad = write_log(tmp_path / "bad" / "train_log.jsonl", fake_run()[:3])
    bad.write_text(bad.read_text() + "{oops\n" + json.dumps(fake_run()[3]) + "\n")
    fails([bad.parent], "train_log.jsonl line 4: not JSON: Expecting property name enclosed in double quotes "
          "(column 2); not a record of xf train")
    write_log(tmp_path / "empty" / "train_log.jsonl", fake_run()[:1])
    fails([tmp_path / "empty"], "no training or validation records yet")
    write_log(tmp_path / "ok" / "train_log.jsonl", fake_run())
    fails([tmp_path / "ok", "-o", tmp_path / "c.jpg"], "must end in .png, .pdf, .svg", code=2)
    fails([tmp_path / "ok", "-o", tmp_path / "no" / "c.png"], "its directory does not exist", code=2)  # the frame's guard


def test_pictures_are_written_atomically(tmp_path, monkeypatch):
    out = tmp_path / "curves.png"
    out.write_bytes(b"the old picture")
    fig = new_figure(2, 2)
    fig.subplots().plot([0, 1], [1, 0])

    def broken(f, **kwargs):
        f.write(b"half a png")
        raise RuntimeError("disk full")

    monkeypatch.setattr(fig, "savefig", broken)
    with pytest.raises(RuntimeError):
        save_figure(fig, str(out))
    assert out.read_bytes() == b"the old picture" and os.listdir(tmp_path) == ["curves.png"]
    monkeypatch.undo()
    save_figure(fig, str(out))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_without_matplotlib_a_one_line_error(tmp_path, monkeypatch):
    write_log(tmp_path / "ok" / "train_log.jsonl", fake_run())
    monkeypatch.setitem(sys.modules, "matplotlib.backends.backend_agg", None)  # import fails as if not installed
    with pytest.raises(XfError, match=r"pip install 'xformer-cli\[plot\]'"):
        plot_curves(PlotCurvesOptions(save_dirs=(str(tmp_path / "ok"),), output=str(tmp_path / "c.png")))
    result = runner.invoke(app, ["plot", "curves", str(tmp_path / "ok"), "-o", str(tmp_path / "c.png")])
    assert result.exit_code == 1 and "xf: error: xf plot needs matplotlib" in result.output
    assert len(result.output.strip().splitlines()) == 1 and not (tmp_path / "c.png").exists()


# -- attention -----------------------------------------------------------------------------------
def fake_maps(layers=2, heads=3, s=5, t=4):
    g = torch.Generator().manual_seed(0)
    soft = lambda *shape: torch.rand(*shape, generator=g).softmax(-1)  # noqa: E731
    return AttentionMaps([soft(1, heads, s, s) for _ in range(layers)], [soft(1, heads, t, t) for _ in range(layers)],
                         [soft(1, heads, t, s) for _ in range(layers)])


SRC = ["\u2581A", "\u2581do", "g", ".", "</s>"]
TGT = ["\u2581Ein", "\u2581Hund", ".", "</s>"]


def options(**kw):
    return PlotAttentionOptions(path="x.pt", source="A dog.", **kw)


def image_axes(fig):
    return [ax for ax in fig.axes if ax.get_images()]


def labels(ticks):
    return [t.get_text() for t in ticks]


@pytest.mark.slow
@pytest.mark.parametrize("kind,rows,columns", [
    ("cross", TGT, SRC), ("encoder", SRC, SRC), ("decoder", ["<s>"] + TGT[:-1], ["<s>"] + TGT[:-1]),
])
def test_heatmap_grid_has_a_panel_per_layer_and_head_and_the_pieces_as_ticks(kind, rows, columns):
    maps = fake_maps()
    fig = attention_heatmaps(attention_picture(options(attention=kind), maps, SRC, TGT))
    axes = image_axes(fig)
    assert len(axes) == 2 * 3
    bottom_left = axes[3]  # layer 2, head 1: both axes labelled
    assert labels(bottom_left.get_xticklabels()) == columns
    assert labels(bottom_left.get_yticklabels()) == rows
    weights = {"cross": maps.cross, "encoder": maps.encoder, "decoder": maps.decoder}[kind]
    torch.testing.assert_close(torch.as_tensor(axes[5].get_images()[0].get_array().data), weights[1][0, 2])
    assert axes[5].get_title() == "layer 2, head 3"

    one = attention_heatmaps(attention_picture(options(attention=kind, layer=-1, head=2), maps, SRC, TGT))
    (ax,) = image_axes(one)
    assert labels(ax.get_xticklabels()) == columns and labels(ax.get_yticklabels()) == rows
    torch.testing.assert_close(torch.as_tensor(ax.get_images()[0].get_array().data), weights[1][0, 1])


def test_lines_style_draws_one_layer():
    maps = fake_maps()
    fig = attention_lines(attention_picture(options(style="lines", layer=1), maps, SRC, TGT))
    (ax,) = fig.axes
    texts = [t.get_text() for t in ax.texts]
    assert texts == TGT + SRC  # queries (target pieces) on the left, keys on the right
    assert len(ax.collections) == 3  # one set of lines per head
    with pytest.raises(Exception, match="--layer 3: the model has 2 layers"):
        attention_picture(options(layer=3), maps, SRC, TGT)


def test_attention_figure_of_a_checkpoint_has_its_pieces(ckpt):
    from xformer_cli.model.checkpoint import load_ensemble

    _, sp = load_ensemble([ckpt], torch.device("cpu"))
    source, target = "A dog runs on the beach.", "Ein Hund rennt am Strand."
    fig = attention_figure(PlotAttentionOptions(path=ckpt, source=source, target=target, layer=-1, device="cpu"))
    axes = image_axes(fig)
    assert len(axes) == 4  # the 4 heads of the last layer
    assert labels(axes[0].get_xticklabels()) == sp.encode(source, out_type=str) + ["</s>"]
    assert labels(axes[0].get_yticklabels()) == sp.encode(target, out_type=str) + ["</s>"]
    rows = axes[0].get_images()[0].get_array().data
    assert abs(rows.sum(axis=1) - 1).max() < 1e-5


@pytest.mark.slow
def test_plot_attention_end_to_end(ckpt, tmp_path):
    out = tmp_path / "attention.png"
    result = runner.invoke(app, ["plot", "attention", "--path", ckpt, "--source", "A dog runs on the beach.",
                                 "--beam", "2", "-o", str(out), "--device", "cpu"])
    assert result.exit_code == 0, result.output
    image = imread(out)
    assert image[..., :3].std() > 0.05
    out2 = tmp_path / "lines.png"
    result = runner.invoke(app, ["plot", "attention", "--path", ckpt, "--source", "A dog runs.", "--target",
                                 "Ein Hund rennt.", "--attention", "encoder", "--style", "lines", "--layer", "1",
                                 "-o", str(out2), "--device", "cpu"])
    assert result.exit_code == 0, result.output
    assert imread(out2)[..., :3].std() > 0.05
    result = runner.invoke(app, ["plot", "attention", "--path", ckpt, "--source", "A dog.", "--style", "lines",
                                 "-o", str(out2)])
    assert result.exit_code == 2 and "--style lines draws one layer" in result.output


@pytest.mark.parametrize("name,cls", [("curves", PlotCurvesOptions), ("attention", PlotAttentionOptions)])
def test_every_option_is_a_flag(name, cls):
    import dataclasses

    result = runner.invoke(app, ["plot", name, "--help"], env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    for f in dataclasses.fields(cls):
        if not f.metadata.get("positional"):
            assert "--" + f.name.replace("_", "-") in result.output, f.name


def test_a_picture_too_large_to_open_is_refused_before_drawing(tmp_path):
    """Regression: a 600-subword sentence gave a 31,930 x 17,362 px PNG that image libraries refuse."""
    long_src = ["\u2581w"] * 599 + ["</s>"]
    long_tgt = ["\u2581v"] * 599 + ["</s>"]
    maps = fake_maps(layers=2, heads=3, s=600, t=600)
    with pytest.raises(XfError, match=r"the picture would be [\d,]+ x [\d,]+ pixels, more than image viewers open"):
        attention_heatmaps(attention_picture(options(), maps, long_src, long_tgt))
    fig = attention_heatmaps(attention_picture(options(), fake_maps(), SRC, TGT))  # an ordinary one: drawn
    assert len(image_axes(fig)) == 6
