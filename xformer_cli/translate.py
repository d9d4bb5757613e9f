"""xf translate: raw text in, translations out, one output line per input line, as a Unix filter.

The checkpoint carries everything needed: the model, its configuration and the sentencepiece
model, so no data directory is read. Input is read ``buffer_size`` lines at a time (one line at a
time from a terminal); each buffer is sorted by length into batches, searched, and written back
in input order, so memory stays flat on inputs of any size.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Iterator, Optional, Sequence

import torch

from .checkpoint import load_checkpoint, model_from_checkpoint
from .errors import ConfigError, XfError
from .fileio import atomic_write
from .model import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Transformer
from .options import TranslateOptions
from .search import Hypothesis, search

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


# -- loading -------------------------------------------------------------------------------------
def load_sentencepiece(spm_model: bytes, where: str):
    """The sentencepiece processor of a checkpoint's model bytes, with xf's special ids checked."""
    import sentencepiece

    sp = sentencepiece.SentencePieceProcessor()
    try:
        sp.LoadFromSerializedProto(spm_model)
    except (RuntimeError, OSError, TypeError) as e:
        raise XfError(f"{where}: the checkpoint's sentencepiece model is unreadable: {e}") from None
    ids = (sp.pad_id(), sp.unk_id(), sp.bos_id(), sp.eos_id())
    if ids != (PAD_ID, UNK_ID, BOS_ID, EOS_ID):
        raise XfError(f"{where}: sentencepiece ids pad/unk/bos/eos are {ids}, xf needs (0, 1, 2, 3)")
    return sp


def load_ensemble(paths: Sequence[str], device: torch.device, dtype: torch.dtype = torch.float32):
    """Models of ``paths`` in eval mode on ``device`` and the sentencepiece model they share.

    An ensemble must share one vocabulary: the same sentencepiece model (by its sha256).
    """
    if not paths:
        raise ConfigError("give a checkpoint with --path")
    models: list[Transformer] = []
    sp, first_sha = None, None
    for path in paths:
        ckpt = load_checkpoint(path)
        sha = ckpt.get("spm_sha256")
        if sp is None:
            sp, first_sha = load_sentencepiece(ckpt["spm_model"], str(path)), sha
        elif sha != first_sha:
            raise XfError(
                f"{path}: its vocabulary (sentencepiece model) differs from {paths[0]}'s; "
                "an ensemble needs checkpoints trained on the same vocabulary"
            )
        model = model_from_checkpoint(ckpt, path)
        if model.cfg.vocab_size != sp.get_piece_size():
            raise XfError(
                f"{path}: model vocabulary {model.cfg.vocab_size} != sentencepiece vocabulary {sp.get_piece_size()}"
            )
        models.append(model.to(device=device, dtype=dtype).eval())
        del ckpt
    return models, sp


def native_bf16_cpu() -> bool:
    """Whether this CPU has bf16 matrix instructions (avx512_bf16 or amx_bf16, from Linux's
    /proc/cpuinfo); elsewhere bf16 is emulated and slower than fp32."""
    try:
        flags = Path("/proc/cpuinfo").read_text(errors="replace").split()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def resolve_precision(device: torch.device, precision: str, quantize: str = "none") -> str:
    """The precision to run in: auto is bf16 on GPUs with bf16 and on CPUs with bf16
    instructions, else fp32; --quantize int8 runs its int8 layers with fp32 around them."""
    cpu = device.type == "cpu"
    if quantize == "int8":
        if not cpu:
            raise ConfigError("--quantize int8 is for CPUs (dynamic int8 linear layers); on CUDA use --precision")
        if precision not in ("auto", "fp32"):
            raise ConfigError(f"--quantize int8 runs around its int8 layers in fp32, not --precision {precision}")
        return "fp32"
    if precision == "auto":
        bf16 = native_bf16_cpu() if cpu else torch.cuda.is_bf16_supported()
        return "bf16" if bf16 else "fp32"
    if precision == "fp16" and cpu:
        raise ConfigError("--precision fp16 is for CUDA; on CPU translate in fp32 (or bf16 with bf16 instructions)")
    if precision == "bf16" and cpu and not native_bf16_cpu():
        raise ConfigError("--precision bf16 on CPU needs bf16 instructions (avx512_bf16 or amx_bf16), which "
                          "this CPU lacks; use fp32 or auto")
    return precision


def resolve_device(device: str, precision: str, quantize: str = "none") -> tuple[torch.device, str]:
    """The device and the precision (fp32, bf16 or fp16) that --device and --precision ask for."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise XfError("--device cuda: no CUDA device is available")
    return torch.device(device), resolve_precision(torch.device(device), precision, quantize)


def quantize_int8(model: Transformer) -> Transformer:
    """Dynamic int8 quantization of every linear layer (weights int8 per tensor, activations
    quantized on the fly): torch.ao's quantize_dynamic, deprecated in favour of torchao but the
    one that ships with torch. Embeddings and layer norms stay fp32."""
    import warnings

    from torch import nn
    from torch.ao.quantization import quantize_dynamic

    from .model import MultiHeadAttention

    for module in model.modules():
        if isinstance(module, MultiHeadAttention):
            module.split_projections()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the deprecation warnings of torch.ao.quantization
        return quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8, inplace=True)


class XfEngine:
    """xf's own search (``search.py``) over one model or an ensemble: the default --engine."""

    def __init__(self, models: Sequence[Transformer], device: torch.device):
        self.models, self.device = list(models), device
        self.max_source = min(m.cfg.max_positions for m in models) - 1  # room for the source's eos

    def search(self, sentences: Sequence[Sequence[int]], options: TranslateOptions, generator=None) -> list[list[Hypothesis]]:
        """Hypotheses of each sentence (subword ids without eos), best first."""
        return search(self.models, source_batch(sentences, self.device), options, generator)


def open_engine(options: TranslateOptions):
    """(engine, sentencepiece processor, device) of --engine for --path."""
    if options.engine == "ctranslate2":
        from .export import CTranslate2Engine

        return CTranslate2Engine.open(options)
    device, precision = resolve_device(options.device, options.precision, options.quantize)
    if options.threads > 0:
        torch.set_num_threads(options.threads)
    models, sp = load_ensemble(options.path, device, DTYPES[precision])
    if options.quantize == "int8":
        models = [quantize_int8(m) for m in models]
    return XfEngine(models, device), sp, device


# -- batching and search -------------------------------------------------------------------------
def make_batches(lengths: Sequence[int], batch_size: int, max_tokens: int = 0) -> list[list[int]]:
    """Indices of ``lengths`` sorted longest first and cut into batches of at most batch_size
    sentences, or, when max_tokens > 0, of at most max_tokens padded source tokens (a longer
    sentence alone is a batch of its own)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    for i in order:
        if batches:
            batch = batches[-1]
            longest = lengths[batch[0]]  # sorted: the first is the longest
            if (max_tokens and longest * (len(batch) + 1) <= max_tokens) or (
                not max_tokens and len(batch) < batch_size
            ):
                batch.append(i)
                continue
        batches.append([i])
    return batches


def source_batch(sentences: Sequence[Sequence[int]], device: torch.device) -> torch.Tensor:
    """(B, S) ids + [eos], right-padded with pad."""
    src = torch.full((len(sentences), max(len(s) for s in sentences) + 1), PAD_ID, dtype=torch.long)
    for i, ids in enumerate(sentences):
        src[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        src[i, len(ids)] = EOS_ID
    return src.to(device)


# -- reading and writing -------------------------------------------------------------------------
@dataclass
class Stats:
    lines: int = 0
    empty: int = 0
    src_tokens: int = 0
    tgt_tokens: int = 0
    invalid_utf8: int = 0
    first_invalid: int = 0
    truncated: int = 0
    first_truncated: int = 0


def decode_line(raw: bytes, line_no: int, stats: Stats) -> str:
    """One input line as text: line ending removed, invalid UTF-8 replaced by U+FFFD (counted)."""
    raw = raw.rstrip(b"\r\n")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = raw.decode("utf-8", errors="replace")
        stats.invalid_utf8 += 1
        stats.first_invalid = stats.first_invalid or line_no
    if line_no == 1:
        text = text.removeprefix("\ufeff")  # a byte-order mark is not part of the sentence
    return text


def read_buffers(stream: IO[bytes], size: int) -> Iterator[list[bytes]]:
    buffer: list[bytes] = []
    for raw in stream:
        buffer.append(raw)
        if len(buffer) >= size:
            yield buffer
            buffer = []
    if buffer:
        yield buffer


def format_result(line_index: int, source: str, hyps: list[Hypothesis], texts: list[str], options: TranslateOptions, sp) -> str:
    """The output for one input line (text: one line; text with --nbest K: K lines; jsonl: one line)."""
    if options.output_format == "jsonl":
        record = {
            "id": line_index,
            "source": source,
            "hypotheses": [
                {
                    "text": text,
                    "score": round(h.score, 6),
                    "tokens": [sp.id_to_piece(t) for t in h.tokens],
                    "positional_scores": [round(s, 6) for s in h.positional_scores],
                }
                for h, text in zip(hyps, texts)
            ],
        }
        return json.dumps(record, ensure_ascii=False) + "\n"
    if options.nbest == 1:
        return (texts[0] if texts else "") + "\n"
    # Moses n-best format: "SENTENCE_ID ||| hypothesis ||| score", ids counting from 0.
    return "".join(f"{line_index} ||| {text} ||| {h.score:.6f}\n" for h, text in zip(hyps, texts))


def empty_hypotheses(options: TranslateOptions) -> list[Hypothesis]:
    count = 1 if options.output_format == "text" and options.nbest == 1 else options.nbest
    return [Hypothesis([], 0.0, []) for _ in range(count)]


def translate_buffer(engine, sp, lines: list[str], first_index: int, options: TranslateOptions, stats: Stats,
                     generator=None) -> list[str]:
    """Outputs (one string per input line, in input order) for a buffer of input lines."""
    max_source = engine.max_source
    pieces = sp.encode([line if line.strip() else "" for line in lines], out_type=int)
    results: list[Optional[list[Hypothesis]]] = [None] * len(lines)
    todo = []
    for i, ids in enumerate(pieces):
        if not ids:  # empty or whitespace-only
            stats.empty += 1
            results[i] = empty_hypotheses(options)
            continue
        if len(ids) > max_source:
            stats.truncated += 1
            stats.first_truncated = stats.first_truncated or first_index + i + 1
            pieces[i] = ids = ids[:max_source]
        todo.append(i)
    for batch in make_batches([len(pieces[i]) + 1 for i in todo], options.batch_size, options.max_tokens):
        idx = [todo[j] for j in batch]
        for i, hyps in zip(idx, engine.search([pieces[i] for i in idx], options, generator)):
            results[i] = hyps
            stats.src_tokens += len(pieces[i]) + 1
            stats.tgt_tokens += len(hyps[0].tokens) if hyps else 0
    out = []
    for i, hyps in enumerate(results):
        # Output stays one line: sentencepiece pieces never hold line breaks, but be sure.
        texts = [sp.decode(h.tokens[:-1]).replace("\n", " ").replace("\r", " ") if h.tokens else "" for h in hyps]
        out.append(format_result(first_index + i, lines[i], hyps, texts, options, sp))
    return out


@contextlib.contextmanager
def _open_output(path: Optional[str]) -> Iterator[IO[bytes]]:
    if path is None:
        yield sys.stdout.buffer
    else:
        with atomic_write(path, "wb") as f:  # nothing half-written if translation fails
            yield f


@contextlib.contextmanager
def _open_input(path: Optional[str]) -> Iterator[IO[bytes]]:
    if path is None:
        yield sys.stdin.buffer
        return
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        raise XfError(f"{path}: input file not found") from None
    except OSError as e:
        raise XfError(f"{path}: cannot read input: {e.strerror}") from None
    with f:
        yield f


def _input_size(stream: IO[bytes]) -> Optional[int]:
    """Bytes in the input when it is a regular file (for the progress bar's ETA), else None."""
    try:
        st = os.fstat(stream.fileno())
    except (OSError, ValueError, AttributeError):
        return None
    return st.st_size if stat.S_ISREG(st.st_mode) else None


def _warn(message: str) -> None:
    print(f"xf: warning: {message}", file=sys.stderr, flush=True)


# -- the command ---------------------------------------------------------------------------------
def translate(options: TranslateOptions) -> None:
    """Translate the input (stdin or --input) to the output (stdout or --output)."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    if options.input is not None and not Path(options.input).is_file():
        raise XfError(f"{options.input}: input file not found")
    if options.output is not None and not Path(options.output).resolve().parent.is_dir():
        raise XfError(f"{options.output}: its directory does not exist")
    engine, sp, device = open_engine(options)
    generator = torch.Generator(device=device).manual_seed(options.seed) if options.sampling else None

    console = Console(stderr=True)
    stats = Stats()
    start = time.perf_counter()
    where = options.input or "stdin"
    with _open_input(options.input) as source, _open_output(options.output) as sink:
        interactive = options.input is None and sys.stdin.isatty()
        buffer_size = 1 if interactive else options.buffer_size  # answer each line as it is typed
        total = _input_size(source)
        progress = Progress(
            TextColumn("translating"), BarColumn(), TextColumn("{task.fields[lines]:,} lines"),
            TextColumn("{task.fields[rate]:.1f} sent/s"), TimeElapsedColumn(), TimeRemainingColumn(),
            console=console, transient=True, disable=options.quiet or interactive or not console.is_terminal,
        )
        with progress:
            task = progress.add_task("translate", total=total, lines=0, rate=0.0)
            for raw_lines in read_buffers(source, buffer_size):
                lines = [decode_line(raw, stats.lines + i + 1, stats) for i, raw in enumerate(raw_lines)]
                outputs = translate_buffer(engine, sp, lines, stats.lines, options, stats, generator)
                sink.write("".join(outputs).encode("utf-8"))
                sink.flush()
                stats.lines += len(lines)
                rate = (stats.lines - stats.empty) / max(time.perf_counter() - start, 1e-9)
                progress.update(task, advance=sum(map(len, raw_lines)), lines=stats.lines, rate=rate)
    elapsed = time.perf_counter() - start

    if stats.invalid_utf8:
        _warn(f"{where}: {stats.invalid_utf8} line(s) had invalid UTF-8, replaced with U+FFFD "
              f"(first: line {stats.first_invalid})")
    if stats.truncated:
        _warn(f"{where}: {stats.truncated} line(s) longer than the model's {engine.max_source} source subwords "
              f"were truncated (first: line {stats.first_truncated})")
    if not options.quiet and not interactive:
        _summary(console, stats, elapsed, options)


def _summary(console, stats: Stats, elapsed: float, options: TranslateOptions) -> None:
    from rich.table import Table

    translated = stats.lines - stats.empty
    mode = "sampling" if options.sampling else "greedy" if options.beam_size == 1 else f"beam {options.beam_size}"
    table = Table(title=f"xf translate ({mode}, {len(options.path)} model(s))", show_header=False)
    table.add_column(justify="left")
    table.add_column(justify="right")
    table.add_row("lines", f"{stats.lines:,}")
    table.add_row("translated / empty", f"{translated:,} / {stats.empty:,}")
    table.add_row("source / target subwords", f"{stats.src_tokens:,} / {stats.tgt_tokens:,}")
    table.add_row("time", f"{elapsed:.2f} s")
    table.add_row("sentences/s", f"{translated / max(elapsed, 1e-9):,.1f}")
    table.add_row("target subwords/s", f"{stats.tgt_tokens / max(elapsed, 1e-9):,.0f}")
    if stats.invalid_utf8 or stats.truncated:
        table.add_row("invalid UTF-8 / truncated lines", f"{stats.invalid_utf8:,} / {stats.truncated:,}")
    console.print(table)
