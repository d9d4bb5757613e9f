"""What ``xf train`` shows and records: a live progress line and log lines on stderr, tables at
start-up, after each validation and at the end, ``train_log.jsonl`` in the save directory, and
TensorBoard scalars when asked. Only rank 0 reports; on other ranks every method does nothing.

When stderr is not a terminal (a cluster job's log) there is no live line, and every record,
tables included, is one line (see console.py).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any, Optional

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from .console import print_table
from .fileio import reporting_write_errors


def format_seconds(seconds: Optional[float]) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "-:--:--"
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def format_train_stats(r: dict) -> str:
    """One log line's numbers: loss, nll and ppl per target token (nats), lr, grad norm, speed."""
    parts = [
        f"loss {r['loss']:.3f}",
        f"nll {r['nll']:.3f}",
        f"ppl {r['ppl']:.2f}",
        f"lr {r['lr']:.3g}",
        f"gnorm {r['gnorm']:.3f}",
    ]
    if r.get("tgt_tok_s"):
        parts += [f"{r['src_tok_s']:,.0f} src tok/s", f"{r['tgt_tok_s']:,.0f} tgt tok/s", f"{r['ups']:.2f} upd/s"]
    return " | ".join(parts)


def drop_torn_line(path: Path) -> None:
    """Cut a last line without its newline (a run killed mid-write, a full disk) off ``path``,
    so that every line of the log stays a whole JSON record."""
    with open(path, "r+b") as f:
        end = f.seek(0, 2)
        start = end
        while start > 0:
            start = max(0, start - (1 << 16))
            f.seek(start)
            block = f.read(end - start)
            if block.endswith(b"\n"):
                return
            newline = block.rfind(b"\n")
            if newline >= 0:
                f.truncate(start + newline + 1)
                return
        f.truncate(0)


class TrainProgress(Progress):
    """A progress bar (epoch, update, elapsed, ETA) with the latest training numbers below it."""

    stats = ""

    def get_renderables(self):
        yield self.make_tasks_table(self.tasks)
        if self.stats:
            yield Text(self.stats, style="cyan")


class Reporter:
    def __init__(self, console: Console, save_dir: Path, enabled: bool, tensorboard_logdir: Optional[str]):
        self.console = console
        self.enabled = enabled
        self.progress: Optional[Progress] = None
        self.task = None
        self._jsonl_path = save_dir / "train_log.jsonl"
        self._jsonl = None
        if enabled:
            with reporting_write_errors(self._jsonl_path):
                self._jsonl = open(self._jsonl_path, "a", encoding="utf-8")
                drop_torn_line(self._jsonl_path)
        self._tb = None
        if enabled and tensorboard_logdir:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                console.print("[yellow]warning:[/yellow] --tensorboard-logdir: tensorboard is not installed "
                              "(pip install 'xformer-cli[tensorboard]'); logging to train_log.jsonl only")
            else:
                self._tb = SummaryWriter(tensorboard_logdir)

    # -- records -------------------------------------------------------------------------------
    def record(self, kind: str, values: dict[str, Any]) -> None:
        """One JSON line (and TensorBoard scalars under ``kind/``)."""
        if not self.enabled:
            return
        with reporting_write_errors(self._jsonl_path):
            self._jsonl.write(json.dumps({"type": kind, "time": round(time.time(), 3), **values}) + "\n")
            self._jsonl.flush()
        if self._tb is not None and "update" in values:
            for key, value in values.items():
                if isinstance(value, (int, float)) and key not in ("update", "epoch"):
                    self._tb.add_scalar(f"{kind}/{key}", value, values["update"])

    def print(self, *args, **kwargs) -> None:
        if self.enabled:
            self.console.print(*args, **kwargs)

    def table(self, title: str, rows: list[tuple[str, Any]]) -> None:
        if not self.enabled:
            return
        table = Table(title=title, show_header=False, title_justify="left")
        table.add_column(style="bold")
        table.add_column()
        for name, value in rows:
            table.add_row(name, str(value))
        print_table(self.console, table)

    # -- the live line -------------------------------------------------------------------------
    def start(self, total: Optional[int], done: int, epoch: int) -> None:
        if not self.enabled or not self.console.is_terminal:  # a log file gets the log lines only
            return
        self.progress = TrainProgress(
            TextColumn("[bold]epoch {task.fields[epoch]}"),
            BarColumn(bar_width=30),
            TextColumn("update {task.completed:,.0f}{task.fields[of]}"),
            TimeElapsedColumn(),
            TextColumn("ETA {task.fields[eta]}"),
            console=self.console,
            refresh_per_second=2,  # an update takes about a second on CPU; rendering costs CPU too
        )
        self.progress.start()
        of = f"/{total:,}" if total else ""
        self.task = self.progress.add_task("train", total=total, completed=done, epoch=epoch, of=of,
                                           eta=format_seconds(None))

    def advance(self, update: int, epoch: int, eta: Optional[float]) -> None:
        if self.progress is not None:
            self.progress.update(self.task, completed=update, epoch=epoch, eta=format_seconds(eta))

    def train_log(self, r: dict) -> None:
        """A log line above the live display (the only output when stderr is not a terminal)."""
        if not self.enabled:
            return
        self.record("train", r)
        stats = format_train_stats(r)
        if self.progress is not None:
            self.progress.stats = stats
        self.console.print(f"epoch {r['epoch']} | update {r['update']:,} | {stats}", highlight=False)

    def validation(self, r: dict, best: bool) -> None:
        if not self.enabled:
            return
        self.record("valid", r)
        table = Table(title=f"validation after update {r['update']:,} (epoch {r['epoch']})", title_justify="left")
        for col in ("loss", "nll", "ppl") + (("bleu",) if "bleu" in r else ()) + ("best",):
            table.add_column(col, justify="right")
        cells = [f"{r['loss']:.3f}", f"{r['nll']:.3f}", f"{r['ppl']:.2f}"]
        if "bleu" in r:
            cells.append(f"{r['bleu']:.2f}")
        cells.append("new" if best else f"{r['best']:.3f}" if r.get("best") is not None else "")
        table.add_row(*cells)
        print_table(self.console, table)

    def warn(self, message: str, kind: Optional[str] = None, values: Optional[dict] = None) -> None:
        if not self.enabled:
            return
        self.console.print(f"[yellow]warning:[/yellow] {message}", highlight=False)
        if kind:
            self.record(kind, values or {})

    def stop(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None

    def close(self) -> None:
        self.stop()
        if self._jsonl is not None:
            jsonl, self._jsonl = self._jsonl, None
            with reporting_write_errors(self._jsonl_path):
                jsonl.close()
        if self._tb is not None:
            self._tb.close()
            self._tb = None
