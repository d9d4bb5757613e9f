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

from . import distributed
from .attention_maps import alignment_pairs, format_alignment, hard_alignments, resolve_layer
from .checkpoint import is_training_checkpoint, load_ensemble
from .console import print_table, stderr_console
from .data import batch_by_size, collate_source
from .errors import ConfigError, XfError
from .fileio import atomic_write
from .model import Transformer
from .options import TranslateOptions
from .precision import cpu_bf16_instructions, cuda_has_bf16
from .safety import refuse_overwriting_inputs
from .search import Hypothesis, search
from .vocab import decode_line

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


# -- loading -------------------------------------------------------------------------------------


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
        bf16 = bool(cpu_bf16_instructions()) if cpu else cuda_has_bf16(device)
        return "bf16" if bf16 else "fp32"
    if precision == "fp16" and cpu:
        raise ConfigError("--precision fp16 is for CUDA; on CPU translate in fp32 (or bf16 with bf16 instructions)")
    if precision == "bf16" and cpu and not bool(cpu_bf16_instructions()):
        raise ConfigError("--precision bf16 on CPU needs bf16 instructions (avx512_bf16 or amx_bf16), which "
                          "this CPU lacks; use fp32 or auto")
    return precision


def resolve_device(device: str, precision: str, quantize: str = "none") -> tuple[torch.device, str]:
    """The device and the precision (fp32, bf16 or fp16) that --device and --precision ask for."""
    resolved = distributed.resolve_device(device)
    return resolved, resolve_precision(resolved, precision, quantize)


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
        return search(self.models, collate_source(sentences).to(self.device), options, generator)


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


def decode_input_line(raw: bytes, line_no: int, stats: Stats, where: str) -> str:
    """One input line as text; invalid UTF-8 is replaced by U+FFFD and counted."""
    text = decode_line(raw, where, line_no, "skip")
    if text is None:
        text = decode_line(raw, where, line_no, "replace")
        stats.invalid_utf8 += 1
        stats.first_invalid = stats.first_invalid or line_no
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


def format_result(line_index: int, source: str, hyps: list[Hypothesis], texts: list[str], options: TranslateOptions, sp,
                  alignments: Optional[list[list[tuple[int, int]]]] = None) -> str:
    """The output for one input line (text: one line; text with --nbest K: K lines; jsonl: one line).

    alignments (with --print-alignment): the (source, target) pairs of each hypothesis.
    """
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
        if alignments is not None:
            for hyp_record, pairs in zip(record["hypotheses"], alignments):
                hyp_record["alignment"] = [list(pair) for pair in pairs]
        return json.dumps(record, ensure_ascii=False) + "\n"
    # --print-alignment adds a last field " ||| 0-0 1-2" (Pharaoh pairs), as Marian and Moses do.
    links = [f" ||| {format_alignment(pairs)}" for pairs in alignments] if alignments is not None else [""] * len(hyps)
    if options.nbest == 1:
        return (texts[0] if texts else "") + (links[0] if links else "") + "\n"
    # Moses n-best format: "SENTENCE_ID ||| hypothesis ||| score", ids counting from 0.
    return "".join(f"{line_index} ||| {text} ||| {h.score:.6f}{link}\n" for h, text, link in zip(hyps, texts, links))


def empty_hypotheses(options: TranslateOptions) -> list[Hypothesis]:
    count = 1 if options.output_format == "text" and options.nbest == 1 else options.nbest
    return [Hypothesis([], 0.0, []) for _ in range(count)]


def translate_buffer(engine, sp, lines: list[str], first_index: int, options: TranslateOptions, stats: Stats,
                     generator=None) -> list[str]:
    """Outputs (one string per input line, in input order) for a buffer of input lines."""
    max_source = engine.max_source
    pieces = sp.encode([line if line.strip() else "" for line in lines], out_type=int)
    results: list[Optional[list[Hypothesis]]] = [None] * len(lines)
    alignments: list[Optional[list[list[int]]]] = [None] * len(lines)  # --print-alignment: per hypothesis
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
    for batch in batch_by_size([len(pieces[i]) for i in todo], max_tokens=options.max_tokens or None,
                               max_sentences=None if options.max_tokens else options.batch_size, longest_first=True):
        idx = [todo[j] for j in batch.tolist()]
        sentences = [pieces[i] for i in idx]
        found = engine.search(sentences, options, generator)
        for i, hyps in zip(idx, found):
            results[i] = hyps
            stats.src_tokens += len(pieces[i]) + 1
            stats.tgt_tokens += len(hyps[0].tokens) if hyps else 0
        if options.print_alignment:  # a forced-decoding pass over the final hypotheses
            src = collate_source(sentences).to(engine.device)
            for i, per_hyp in zip(idx, hard_alignments(engine.models, src, found, options.alignment_layer)):
                alignments[i] = per_hyp
    out = []
    for i, hyps in enumerate(results):
        # Output stays one line: sentencepiece pieces never hold line breaks, but be sure.
        texts = [sp.decode(h.tokens[:-1]).replace("\n", " ").replace("\r", " ") if h.tokens else "" for h in hyps]
        pairs = None
        if options.print_alignment:
            src_pieces, words = [sp.id_to_piece(t) for t in pieces[i]], options.alignment_level == "word"
            pairs = [alignment_pairs(a, src_pieces, [sp.id_to_piece(t) for t in h.tokens[:-1]], words)
                     for h, a in zip(hyps, alignments[i] or [[]] * len(hyps))]  # empty lines: none
        out.append(format_result(first_index + i, lines[i], hyps, texts, options, sp, pairs))
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
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    if options.input is not None and not Path(options.input).is_file():
        raise XfError(f"{options.input}: input file not found")
    if options.output is not None and not Path(options.output).resolve().parent.is_dir():
        raise XfError(f"{options.output}: its directory does not exist")
    refuse_overwriting_inputs(options.output, [options.input, *options.path])
    if options.output is not None and is_training_checkpoint(Path(options.output)) and Path(options.output).exists():
        raise XfError(f"--output {options.output} is a training checkpoint; a translation would replace it "
                      "(choose another output file)")
    engine, sp, device = open_engine(options)
    if options.print_alignment:  # a layer the models lack fails now, not at the first batch
        if not isinstance(engine, XfEngine):
            raise ConfigError("--print-alignment needs xf's own engine (the attention of --engine ctranslate2 "
                              "is not recorded)")
        for model in engine.models:
            resolve_layer(options.alignment_layer, len(model.decoder_layers))
    generator = torch.Generator(device=device).manual_seed(options.seed) if options.sampling else None

    console = stderr_console()
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
                lines = [decode_input_line(raw, stats.lines + i + 1, stats, where) for i, raw in enumerate(raw_lines)]
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
    print_table(console, table)
