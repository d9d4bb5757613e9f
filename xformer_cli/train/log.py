"""What ``xf train`` shows and records: a live progress line and log lines on stderr, tables at
start-up, after each validation and at the end (their rows: ``startup_rows``, ``summary_rows``), ``train_log.jsonl`` in the save directory, and
TensorBoard scalars when asked. Only rank 0 reports; on other ranks every method does nothing.

When stderr is not a terminal (a cluster job's log) there is no live line, and every record,
tables included, is one line (see base/console.py).
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from ..base.console import print_table
from ..base.fileio import reporting_write_errors
from ..base.memory import resident_mib
from .loss import perplexity
from .policy import regularization


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


# -- what is measured ----------------------------------------------------------------------------
class Meter:
    """Loss sums and speed: over the run (``timed``: excluding start-up, validation, this
    process's first update, which allocates and warms up, and with --compile every update that
    compiled a graph: ``graphs`` counts them) and since the last log line (``window``)."""

    def __init__(self, device: torch.device, graphs: Optional[Callable[[], int]] = None):
        self.timed = {"seconds": 0.0, "updates": 0, "src": 0.0, "tgt": 0.0}
        self.window = dict(self.timed, finite=0, tokens=0.0)  # finite, tokens: filled by settle()
        # on the device, summed over the window's good updates: loss and nll sums, gradient norms
        self.window_loss = torch.zeros(2, dtype=torch.float64, device=device)
        self.window_gnorm = torch.zeros((), dtype=torch.float64, device=device)
        self.first_update = True
        self.graphs, self.seen_graphs = graphs, graphs() if graphs else 0
        self.compile_seconds = 0.0  # with --compile: the updates that compiled a graph (the first among them)

    def add(self, step, ntokens: float, src_tokens: float, seconds: float) -> None:
        self.window_loss += torch.where(step.finite, step.loss_sums, 0.0)  # no read-back
        self.window_gnorm += torch.where(step.finite, step.gnorm.double(), 0.0)
        graphs = self.graphs() if self.graphs else 0
        compiled, self.seen_graphs = graphs > self.seen_graphs, graphs
        if compiled:  # a recompilation (a new shape class) is not training speed either
            self.compile_seconds += seconds
        elif not self.first_update:
            for d in (self.timed, self.window):
                d["seconds"] += seconds
                d["updates"] += 1
                d["src"] += src_tokens
                d["tgt"] += ntokens
        self.first_update = False

    def good_update(self, ntokens: float) -> None:
        """An update of the window turned out finite (known once settled)."""
        self.window["tokens"] += ntokens
        self.window["finite"] += 1

    def eta(self, remaining_updates: Optional[int], time_left: Optional[float]) -> Optional[float]:
        eta = None
        if remaining_updates is not None and self.timed["updates"]:
            eta = remaining_updates * self.timed["seconds"] / self.timed["updates"]
        if time_left is not None:
            eta = min(eta if eta is not None else math.inf, max(0.0, time_left))
        return eta

    def speed(self, d: dict) -> dict:
        s = d["seconds"]
        return {"src_tok_s": d["src"] / s if s else None, "tgt_tok_s": d["tgt"] / s if s else None,
                "ups": d["updates"] / s if s else None}

    def take_window(self, env, epoch: int, update: int, lr: float) -> Optional[dict]:
        """The log record of the window (None if all its updates were skipped); starts a new one.
        Every rank must call it: the loss sums are summed over ranks."""
        loss_sum, nll_sum = env.sum_tensor(self.window_loss).tolist()
        rec = None
        if self.window["finite"]:
            tok = self.window["tokens"]  # already summed over ranks
            rec = {"epoch": epoch, "update": update, "loss": loss_sum / tok, "nll": nll_sum / tok,
                   "ppl": perplexity(nll_sum / tok), "lr": lr,
                   "gnorm": self.window_gnorm.item() / self.window["finite"]}
            if self.window["seconds"] > 0:
                rec.update(self.speed(self.window))
            rec["elapsed"] = round(self.timed["seconds"], 1)
        self.window_loss.zero_()
        self.window_gnorm.zero_()
        self.window.update(seconds=0.0, updates=0, src=0.0, tgt=0.0, finite=0, tokens=0.0)
        return rec


def peak_memory_mib(device: torch.device) -> float:
    """Peak CUDA memory allocated by tensors, or the process's peak resident set on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    peak = resident_mib().get("VmHWM")  # Linux: this process's own peak (ru_maxrss may be its parent's)
    if peak is not None:
        return peak
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1024 if sys.platform != "darwin" else 2**20)


def startup_rows(o, cfg, data, train_pairs: int, valid_pairs: int, parameters: int, batches, device: torch.device,
                 world_size: int, precision_note: str, num_updates: int, epoch: int) -> list[tuple[str, str]]:
    """The rows of xf train's start-up table (``o``: TrainOptions, ``cfg``: ModelConfig, ``data``:
    DataDir, ``batches``: EpochBatches)."""
    threads = torch.get_num_threads()
    return [
        ("data", f"{data.path} ({', '.join(data.pairs or [f'{data.source_lang}-{data.target_lang}'])}, {train_pairs:,} training pairs, "
                 f"{valid_pairs:,} validation)"),
        ("model", f"{o.arch or ('--init-from' if o.init_from else 'base')}: {cfg.encoder_layers}+{cfg.decoder_layers} layers, d_model {cfg.d_model}, "
                  f"d_ff {cfg.d_ff}, {cfg.heads} heads, vocabulary {cfg.vocab_size:,}"),
        ("parameters", f"{parameters:,}"),
        ("effective batch", f"{o.max_tokens:,} tokens x {o.update_freq} (update freq) x {world_size} "
                            f"(processes) = {o.max_tokens * batches.per_update:,} tokens per update"),
        *directions_rows(data, batches),
        ("updates per epoch", f"{batches.updates_per_epoch(max(epoch, 1)):,} ({batches.num_batches(max(epoch, 1)):,} "
                              f"batches{', drawn anew each epoch' if batches.draw else ''})"),
        ("device", f"{device} x {world_size}, {threads} thread{'s' * (threads != 1)}"
                   + (", compiled (torch.compile, dynamic shapes)" if o.compile else "")),
        ("precision", f"{o.precision} ({precision_note})"),
        ("schedule", f"{o.lr_scheduler}, warmup {o.warmup_updates}"
                     + (f", lr {o.lr:g}" if o.lr is not None else f", lr factor {o.lr_factor:g}")),
        ("regularization", f"dropout {cfg.dropout:g}, label smoothing {o.label_smoothing:g}"
                           + ("; after {:,} updates: dropout {:g}, label smoothing {:g}".format(
                               o.late_after, *regularization(o, o.late_after + 1, cfg.dropout)) if o.late_after else "")),
        ("save dir", f"{o.save_dir}" + (f" (resuming at update {num_updates:,}, epoch {epoch})" if num_updates else "")),
    ]


def directions_rows(data, batches) -> list[tuple[str, str]]:
    """A multilingual run's row: each direction's training pairs, and its share of an epoch when
    epochs are drawn by temperature (data/sampling.py)."""
    directions = data.directions("train")
    if not directions:
        return []
    text = ", ".join(f"{name} {n:,}" for name, n in directions.items())
    if batches.draw is not None:
        from ..data.sampling import direction_probabilities

        shares = direction_probabilities(list(directions.values()), data.sampling_temperature)
        text += f"; drawn at temperature {data.sampling_temperature:g}: " + ", ".join(
            f"{name} {p:.1%}" for name, p in zip(directions, shares))
    return [("directions", text)]


def summary_rows(summary: dict, batch_offset: int, compiled: bool, device: torch.device,
                 save_dir: Path) -> list[tuple[str, Any]]:
    """The rows of xf train's closing table, from the summary record."""
    epoch, seconds = summary["epoch"], summary["train_seconds"]
    best = summary["best"]
    return [
        ("stopped", summary["stop_reason"]),
        ("updates", f"{summary['num_updates']:,} (epoch {epoch if batch_offset else epoch - 1} "
                    f"{'in progress' if batch_offset else 'done'})"),
        (f"best validation {summary['best_metric']}", f"{best:.3f}" if best is not None else "-"),
        ("skipped updates", summary["skipped_updates"]),
        ("training time", format_seconds(seconds) + " (excluding start-up and validation)"),
        ("speed", f"{summary['src_tok_s']:,.0f} src tok/s, {summary['tgt_tok_s']:,.0f} tgt tok/s, "
                  f"{summary['ups']:.2f} upd/s" if seconds else "- (the first update is not timed)"),
        *([("compile", f"{summary['compile_seconds']:.1f} s (the updates that compiled), {summary['compiled_graphs']} "
                       "graph(s)")] if compiled else []),
        ("peak memory", f"{summary['peak_memory_mib']:,.0f} MiB ({'CUDA allocated' if device.type == 'cuda' else 'RSS'})"),
        ("checkpoints", str(save_dir)),
    ]
