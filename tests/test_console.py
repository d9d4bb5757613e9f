"""stderr for machines: when it is not a terminal, every record is one line,
never wrapped at 80 columns, and tables are flattened unless a terminal is asked for."""

import os
import re
import subprocess
import sys

import pytest
from helpers import cli_args
from rich.table import Table

from xformer_cli.base.console import print_table, stderr_console, table_line

BOX = re.compile("[\u2500-\u257f]")  # rich's box-drawing characters


def test_table_line_names_every_cell():
    t = Table(title="xf average-checkpoints", show_header=False)
    t.add_column()
    t.add_column()
    t.add_row("averaged", "2 checkpoints")
    t.add_row("[bold]written[/bold]", "avg.pt")
    assert table_line(t) == "xf average-checkpoints | averaged 2 checkpoints | written avg.pt"
    t = Table(title="validation after update 7 (epoch 1)")
    for col in ("loss", "ppl", "best"):
        t.add_column(col)
    t.add_row("3.210", "24.78", "")
    assert table_line(t) == "validation after update 7 (epoch 1) | loss 3.210, ppl 24.78"


def test_a_long_record_is_not_wrapped_when_stderr_is_not_a_terminal(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.delenv("TTY_COMPATIBLE", raising=False)
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    console = stderr_console()
    record = " | ".join(f"field{i} {i * 1.001:.3f}" for i in range(30))
    console.print(record, highlight=False)
    t = Table(title="summary", show_header=False)
    t.add_column()
    t.add_column()
    for i in range(10):
        t.add_row(f"row {i}", "x" * 30)
    print_table(console, t)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == record and len(lines) == 2 and not BOX.search(lines[1])


@pytest.mark.slow
def test_train_log_in_a_file_is_one_line_per_record(data_dir, tmp_path):
    """Records longer than 80 columns (a long save dir, speeds) stay whole: grep finds them."""
    save = tmp_path / ("a-long-save-directory-name-" * 3) / "ck"
    env = {k: v for k, v in os.environ.items() if k not in ("TTY_COMPATIBLE", "FORCE_COLOR")}
    env.update(OMP_NUM_THREADS="1", COLUMNS="80")
    args = [sys.executable, "-m", "xformer_cli", "train", *cli_args(data_dir, save, max_update=3, validate_interval_updates=2)]
    out = subprocess.run(args, capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stderr.splitlines()
    assert not BOX.search(out.stderr), out.stderr  # no tables drawn, no progress bar
    record = re.compile(r"epoch 1 \| update \d \| loss [\d.]+ \| nll [\d.]+ \| ppl [\d.]+ \| lr [\d.e-]+ \| gnorm [\d.]+"
                        r"( \| [\d,]+ src tok/s \| [\d,]+ tgt tok/s \| [\d.]+ upd/s)?")
    assert [bool(record.fullmatch(line)) for line in lines if line.startswith("epoch")] == [True] * 3, out.stderr
    kinds = [line.split(" |")[0].split(" after")[0] for line in lines]
    assert kinds == ["xf train", "epoch 1", "epoch 1", "validation", "epoch 1", "validation", "training summary"], lines
    assert any(len(line) > 80 for line in lines) and f"save dir {save}" in lines[0]

    # asked for (rich's TTY_COMPATIBLE=1): the tables a terminal shows
    env["TTY_COMPATIBLE"] = "1"
    args = [sys.executable, "-m", "xformer_cli", "train", *cli_args(data_dir, save, max_update=4)]
    out = subprocess.run(args, capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0 and BOX.search(out.stderr), out.stderr
