"""xf translate: raw text in, translations out, one output line per input line, as a Unix filter.

The checkpoint carries everything needed: the model, its configuration and the sentencepiece
model, so no data directory is read. Input is read ``buffer_size`` lines at a time (one line at a
time from a terminal); each buffer is sorted by length into batches, searched, and written back
in input order, so memory stays flat on inputs of any size.
"""

from __future__ import annotations

import contextlib
import os
import stat
import sys
import time
from pathlib import Path
from typing import IO, Iterator, Optional

import torch

from ..base.console import invalid_utf8_warning, print_summary, stderr_console, warn
from ..base.errors import ConfigError, XfError, memory_detail, out_of_memory
from ..base.fileio import atomic_write
from ..decode.confidence import Calibration
from ..decode.steering import encode_constraints, encode_prefixes, line_vocabularies, crowded_term, over_constraint_limits, read_steered_line, source_vocabulary, unfit_term
from ..decode.translate import Stats, decode_input_line, open_engine, open_scorer, translate_buffer, translate_sentences
from ..settings.options import TranslateOptions
from ..text.glossary import Glossary
from ..text.languages import TaggedVocabulary


# -- reading and writing -------------------------------------------------------------------------
def read_buffers(stream: IO[bytes], size: int) -> Iterator[list[bytes]]:
    buffer: list[bytes] = []
    for raw in stream:
        buffer.append(raw)
        if len(buffer) >= size:
            yield buffer
            buffer = []
    if buffer:
        yield buffer


@contextlib.contextmanager
def _open_output(path: Optional[str]) -> Iterator[IO[bytes]]:
    if path in (None, "-"):
        yield sys.stdout.buffer
    else:
        with atomic_write(path, "wb") as f:  # nothing half-written if translation fails
            yield f


@contextlib.contextmanager
def _open_input(path: Optional[str]) -> Iterator[IO[bytes]]:
    if path in (None, "-"):
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


# -- the command ---------------------------------------------------------------------------------
def translate(options: TranslateOptions) -> None:
    """Translate the input (stdin or --input) to the output (stdout or --output)."""
    # a FIFO or <(...) (/dev/fd/N) is read as a file is (it was "not found", and its writer blocked)
    if options.input not in (None, "-") and (not Path(options.input).exists() or Path(options.input).is_dir()):
        raise XfError(f"{options.input}: input file not found" if not Path(options.input).exists()
                      else f"{options.input}: is a directory, not an input file")
    glossary = Glossary.load(options.glossary) if options.glossary is not None else None  # fails before loading
    calibration = Calibration.load(options.confidence) if options.confidence else None  # as does this
    opening = time.perf_counter()
    engine, sp, device = open_engine(options)
    startup = time.perf_counter() - opening  # the models loaded, --workers' processes started
    try:
        multilingual = engine.facts.multilingual
        per_line = options.input_format == "jsonl"  # a line may name its target
        # the source vocabulary of --target-lang (None: a multilingual model whose jsonl lines name theirs)
        vocab = None if per_line and multilingual and options.target_lang is None else \
            source_vocabulary(engine, sp, options.target_lang, options.path[0], options.formality)
        languages = tuple(engine.facts.targets) if multilingual and per_line else ()
        scorer = open_scorer(options, engine.plan, calibration, languages, engine.facts) if options.output_format == "jsonl" else None
        unfit = glossary is not None and (unfit_term(glossary, sp, engine.max_source)
                                          or crowded_term(glossary, options.max_constraint_forms))
        if unfit:  # its terms against the model, before a line is written
            raise ConfigError(unfit)
        _translate(engine, sp, vocab, device, options, glossary, scorer, startup)
    except (MemoryError, RuntimeError) as e:
        if not out_of_memory(e):
            raise
        raise XfError(f"out of memory while decoding ({memory_detail(e)}); lower --max-tokens, or what one line may "
                      "ask (--max-constraints, --max-constraint-forms, --max-constraint-subwords)") from None
    finally:
        engine.close()  # --workers: its decoding processes


def _translate(engine, sp, vocab, device, options: TranslateOptions, glossary: Optional[Glossary], scorer,
               startup: Optional[float] = None) -> None:
    """The input's buffers translated and written; sources encoded with ``vocab`` (``translation.
    source_vocabulary``: with a multilingual model's target tag) or a jsonl line's own, target
    text (prefixes, constraints, glossary forms) with ``sp``'s target side."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    if options.print_alignment:  # a layer the models lack fails now, not at the first batch
        engine.check_alignment_layer(options.alignment_layer)
    generator = torch.Generator(device=device).manual_seed(options.seed) if options.sampling else None

    console = stderr_console()
    stats = Stats()
    start = time.perf_counter()
    where = "stdin" if options.input in (None, "-") else options.input
    with _open_input(options.input) as source, _open_output(options.output) as sink:
        interactive = options.input in (None, "-") and sys.stdin.isatty()
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
                if options.split_sentences is not None:
                    outputs = translate_sentences(engine, vocab, lines, options, stats, generator)
                elif options.input_format == "jsonl":
                    steered = [read_steered_line(text, stats.lines + i + 1, where) for i, text in enumerate(lines)]
                    formal = next((i for i, s in enumerate(steered) if s.formality), None)
                    if options.print_alignment and formal is not None:  # as --formality (TranslateOptions)
                        raise ConfigError(f"{where}: line {stats.lines + formal + 1}: 'formality' puts a tag before "
                                          "the source, which --print-alignment does not count yet")
                    vocabularies = line_vocabularies(engine, sp, steered, vocab, options.target_lang, where,
                                                     stats.lines, options.path[0], options.formality)
                    targets = [v.target_lang if isinstance(v, TaggedVocabulary) else None for v in vocabularies]
                    prefixes = encode_prefixes(sp, [s.prefix for s in steered], engine.max_source, where, stats.lines)
                    wanted = [s.constraints + (glossary.constraints(s.source) if glossary else []) for s in steered]
                    constraints = _constraints(sp, wanted, engine, options, where, stats.lines)
                    outputs = translate_buffer(engine, sp, [s.source for s in steered], stats.lines, options, stats,
                                               generator, prefixes, constraints, scorer, vocabularies, targets)
                elif glossary is not None:
                    constraints = _constraints(sp, [glossary.constraints(line) for line in lines], engine, options,
                                               where, stats.lines)
                    outputs = translate_buffer(engine, vocab, lines, stats.lines, options, stats, generator, None,
                                               constraints, scorer)
                else:
                    outputs = translate_buffer(engine, vocab, lines, stats.lines, options, stats, generator,
                                               scorer=scorer)
                sink.write("".join(outputs).encode("utf-8"))
                sink.flush()
                stats.lines += len(lines)
                rate = (stats.lines - stats.empty) / max(time.perf_counter() - start, 1e-9)
                progress.update(task, advance=sum(map(len, raw_lines)), lines=stats.lines, rate=rate)
    elapsed = time.perf_counter() - start

    invalid_utf8_warning(where, stats.invalid_utf8, stats.first_invalid)
    if stats.truncated:
        warn(f"{where}: {stats.truncated} line(s) longer than the model's {engine.max_source} source subwords "
              f"were truncated (first: line {stats.first_truncated})")
    if stats.split_long:
        warn(f"{where}: {stats.split_long} sentence(s) longer than the model's {engine.max_source} source subwords "
              "were split to fit (at clause or word boundaries) and their pieces translated")
    if stats.unmet:
        warn(f"{where}: {stats.unmet} line(s) whose lexical constraints no hypothesis met within the length limit "
             f"(--max-len-a/b) were translated without them (first: line {stats.first_unmet})")
    if stats.empty_outputs:
        warn(f"{stats.empty_outputs:,} of {stats.lines - stats.empty:,} non-empty line(s) got an empty translation "
              "(a model that ends every sentence at once: an untrained or broken checkpoint?)")
    if not options.quiet and not interactive:
        _summary(console, stats, elapsed, options, getattr(engine, "compiled", None), getattr(engine, "int8_engine", None),
                 getattr(getattr(engine, "plan", None), "rules", ()), startup)


def _constraints(sp, wanted: list, engine, options: TranslateOptions, where: str, first_line: int):
    """The buffer's lexical constraints (per line, ``read_constraints``'s form) as subword ids
    (None when no line has any); refused where the engine's plan cannot meet them (CTranslate2,
    sampling) or where a line asks more than the limits (--max-constraints ...), naming the line."""
    if not any(wanted):
        return None
    line = first_line + 1 + next(i for i, c in enumerate(wanted) if c)
    try:
        engine.plan.refuse_steering("'constraints'")
    except ConfigError as e:
        raise ConfigError(f"{where}: line {line}: {e}") from None
    encoded = encode_constraints(sp, wanted, engine.max_source, where, first_line)
    for i, constraints in enumerate(encoded):
        problem = over_constraint_limits(constraints, options)
        if problem:
            raise ConfigError(f"{where}: line {first_line + i + 1}: {problem}")
    return encoded


def compile_cell(compiled) -> str:
    """The summary's compile cell: seconds, packages built and loaded (decoder_step.AotStep)."""
    return (f"{compiled.compile_seconds:.2f} s, ahead of time: {compiled.graphs} package(s) built, "
            f"{compiled.loaded} loaded from the cache")


def _summary(console, stats: Stats, elapsed: float, options: TranslateOptions, compiled=None,
             int8_engine: Optional[str] = None, rules: tuple = (), startup: Optional[float] = None) -> None:
    """The summary table; with --compile (``compiled``, a decoder_step.AotStep) the time that
    built or loaded its packages is reported on its own row and left out of the speeds; with
    --quantize int8 what runs the int8 products (``int8_engine``, with its rule); the decoding
    plan's other rules that fired (``rules``: --precision auto, --workers 0), a row each; the
    start-up before the first line (``startup``: the models loaded, --workers' processes started)
    on a row of its own, out of the time and the speeds (--workers 16 on 2 cores took 50 s for
    3 lines, and the summary said "time 0.08 s")."""
    translated = stats.lines - stats.empty
    mode = "sampling" if options.sampling else "greedy" if options.beam_size == 1 else f"beam {options.beam_size}"
    compiling = compiled.compile_seconds if compiled is not None else 0.0
    decoding = max(elapsed - compiling, 1e-9)
    rows = [
        ("lines", f"{stats.lines:,}"),
        ("translated / empty input lines", f"{translated:,} / {stats.empty:,}"),
        *([("empty translations", f"{stats.empty_outputs:,} of {translated:,}")] if stats.empty_outputs else []),
        *([("sentences (--split-sentences) / split to fit", f"{stats.sentences:,} / {stats.split_long:,}")]
          if options.split_sentences is not None else []),
        ("source / target subwords", f"{stats.src_tokens:,} / {stats.tgt_tokens:,}"),
        *([("start-up (models, workers; not in the speeds)", f"{startup:.2f} s")] if startup is not None else []),
        ("time", f"{elapsed:.2f} s"),
        *([("compile (not in the speeds)", compile_cell(compiled))] if compiled else []),
        *([("int8 engine", int8_engine)] if int8_engine else []),
        *[("rule", rule) for rule in rules if not rule.startswith("--int8-engine")],
        ("sentences/s", f"{translated / decoding:,.1f}"),
        ("target subwords/s", f"{stats.tgt_tokens / decoding:,.0f}"),
    ]
    if stats.unmet:
        rows.append(("lines translated without their constraints", f"{stats.unmet:,}"))
    if stats.invalid_utf8 or stats.truncated:
        rows.append(("invalid UTF-8 / truncated lines", f"{stats.invalid_utf8:,} / {stats.truncated:,}"))
    print_summary(console, f"xf translate ({mode}, {len(options.path)} model(s))", rows, values="right")
