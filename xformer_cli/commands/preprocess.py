"""xf preprocess: learn a joint sentencepiece BPE and binarize parallel text (see data/dataset.py).

The stages, each streaming over the files so memory stays flat at any corpus size:

1. check   count the lines of every input file (fast byte scan): missing or unreadable files
           and line-count mismatches fail before any real work, and progress bars get totals;
2. sample  draw about ``--bpe-sample-lines`` training pairs (each pair kept with probability
           k/N, seeded) into a temporary file; only that file is ever held by sentencepiece;
3. learn   train the sentencepiece BPE model on the sample (skipped with ``--spm-model``);
4. encode  per split, chunks of CHUNK_LINES pairs go to ``--workers`` processes which decode,
           encode, clean (train only) and return flat numpy arrays; results come back in input
           order and are appended to the .bin/.idx files.

Everything is written into a hidden temporary directory beside ``destdir`` that is renamed into
place at the very end, meta.json last, so an interrupted run never leaves a directory that looks
complete (``DataDir.open`` also requires meta.json).
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import io
import itertools
import json
import multiprocessing
import os
import re
import secrets
import shutil
import signal
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, Optional

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, SpinnerColumn, TextColumn
from rich.progress import TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from .. import __version__
from ..base.console import print_table, stderr_console
from ..base.errors import XfError
from ..base.fileio import directory_target, fsync_dir, remove_stale_temporaries_of, replace_path, reporting_write_errors, temporary_prefix
from ..base.safety import refuse_running_training
from ..data.dataset import FORMAT_VERSION, DataDir, TokenArrayWriter, file_sha256, smallest_dtype
from ..settings.config import option_range
from ..settings.options import PreprocessOptions
from ..text.formality import LANGUAGE, classify
from ..text.formality_tags import TAGS, tag_ids, tagged_targets
from ..text.languages import pair_names, tag
from ..text.vocab import BOS_ID, EOS_ID, PAD_ID, UNK_ID, decode_line, encode_target, load_sentencepiece

CHUNK_LINES = 10_000  # pairs per worker task: large enough that inter-process traffic is noise
DROP_REASONS = ("invalid_utf8", "empty", "too_long", "ratio")  # a pair counts under the first that applies


@dataclass
class Part:
    """The files of one direction of a split: a bilingual split is one part; with --pairs a
    split is one part per pair, in the order of --pairs, binarized one after the other."""

    src: Path
    tgt: Path
    direction: Optional[str] = None  # "en-de" with --pairs
    target: Optional[str] = None  # its target language, whose tag leads every source sentence (--pairs)
    tag_id: Optional[int] = None  # that tag's id, once the vocabulary is known
    lines: int = 0
    # --formality-tags, German targets: the formality tags' ids, and whether the source is English
    # (the classifier's hint where the German is ambiguous)
    formality: Optional[tuple[dict, bool]] = None


@dataclass
class Split:
    """One split to binarize: ``train``, ``valid``, ``valid1``, ..., ``test``, ``test1``, ..."""

    name: str
    parts: list[Part]
    clean: bool  # only the training split is cleaned
    stats: dict = field(default_factory=dict)

    @property
    def lines(self) -> int:
        return sum(p.lines for p in self.parts)

    @property
    def files(self) -> str:
        """Its files, for messages: ``train.en / train.de`` (each pair's, with --pairs)."""
        return ", ".join(f"{p.src} / {p.tgt}" for p in self.parts)


def plan_splits(o: PreprocessOptions) -> list[Split]:
    """The splits named by --trainpref, --validpref and --testpref, fairseq style; with --pairs,
    each split is PREFIX.SOURCE / PREFIX.TARGET of every pair."""
    splits = []
    pairs = o.pair_list()

    def add(name: str, prefix: str) -> None:
        if not pairs:
            parts = [Part(Path(f"{prefix}.{o.source_lang}"), Path(f"{prefix}.{o.target_lang}"))]
        else:
            parts = [Part(*pair_files(prefix, s, t), f"{s}-{t}", t) for s, t in pairs]
        splits.append(Split(name, parts, name == "train"))

    if o.trainpref:
        add("train", o.trainpref)
    for kind, prefs in (("valid", o.validpref), ("test", o.testpref)):
        for i, prefix in enumerate(p.strip() for p in (prefs or "").split(",") if p.strip()):
            add(f"{kind}{i or ''}", prefix)
    return splits


def pair_files(prefix: str, s: str, t: str) -> tuple[Path, Path]:
    """The files of pair s-t: PREFIX.s-t.s / PREFIX.s-t.t when both exist (a corpus of the pair's
    own, fairseq's naming), else PREFIX.s / PREFIX.t (one corpus parallel in several languages)."""
    own = Path(f"{prefix}.{s}-{t}.{s}"), Path(f"{prefix}.{s}-{t}.{t}")
    if all(p.exists() for p in own):
        return own
    shared = Path(f"{prefix}.{s}"), Path(f"{prefix}.{t}")
    for path in shared:
        if not path.exists():
            raise XfError(f"{path}: no such file (pair {s}-{t} reads {shared[0]} and {shared[1]}, or "
                          f"{own[0]} and {own[1]})")
    return shared


def check_destination(o: PreprocessOptions) -> None:
    """Something to read, and a destination that is a directory, empty unless --overwrite (the
    option values themselves are checked by PreprocessOptions)."""
    if not o.trainpref and not o.spm_model and not o.vocab_from:
        raise XfError("--trainpref is required (or --spm-model / --vocab-from to binarize valid/test sets only)")
    dest = Path(o.destdir)  # the frame refused one that is a file, not empty without --overwrite, or holds an input
    if dest.exists() and os.path.ismount(dest):
        raise XfError(f"destdir {dest} is a mount point: xf preprocess writes a new directory beside it and renames "
                      "it into place, which a mount point cannot take; use a directory inside it")
    parent = dest.resolve().parent
    while not parent.exists():  # what the first mkdir writes into
        parent = parent.parent
    if not os.access(parent, os.W_OK | os.X_OK):
        raise XfError(f"destdir {dest}: {parent} is not writable (checked before encoding anything)")


# --------------------------------------------------------------------------- reading text


def count_lines(path: Path, on_bytes=lambda n: None) -> int:
    """Lines of a file, the last one counting even without a final newline."""
    try:
        with open(path, "rb") as f:
            lines, last = 0, b"\n"
            while block := f.read(1 << 24):
                lines += block.count(b"\n")
                last = block[-1:]
                on_bytes(len(block))
    except FileNotFoundError:
        raise XfError(f"{path}: no such file") from None
    except OSError as e:
        raise XfError(f"cannot read {path}: {e.strerror}") from None
    return lines + (last != b"\n")


def check_line_endings(path: Path, head_bytes: int = 1 << 20) -> None:
    """Refuse a file whose lines end in a bare CR (classic Mac OS): read by LF it would be one
    huge line. A stray CR inside a line is left alone; only a file mostly split by CR is refused."""
    try:
        with open(path, "rb") as f:
            head = f.read(head_bytes)
    except OSError:
        return  # count_lines reports it
    bare = head.count(b"\r") - head.count(b"\r\n")
    if bare and bare >= head.count(b"\n"):
        line = head[: re.search(rb"\r(?!\n)", head).start()].count(b"\n") + 1
        raise XfError(f"{path}:{line}: lines end with a bare carriage return (\\r, old Mac "
                      f"line endings), so the file reads as one line; convert it first: tr '\\r' '\\n'")


def read_chunks(part: Part) -> Iterator[tuple[int, list[bytes], list[bytes]]]:
    """(first line index, source lines, target lines) of one part's files in chunks of
    CHUNK_LINES, as raw bytes."""
    with open(part.src, "rb") as fs, open(part.tgt, "rb") as ft:
        start = 0
        while True:
            src, tgt = list(itertools.islice(fs, CHUNK_LINES)), list(itertools.islice(ft, CHUNK_LINES))
            if len(src) != len(tgt):  # the files changed since they were counted
                raise XfError(f"{part.src} and {part.tgt} have different line counts (near line {start + 1})")
            if not src:
                return
            yield start, src, tgt
            start += len(src)


# --------------------------------------------------------------------------- subwords


def sample_for_bpe(part: Part, pairs: int, seed: int, out: Path, invalid: str, advance) -> int:
    """Write about ``pairs`` random training pairs (both sides, one sentence a line) to ``out``.

    Each pair is kept with probability pairs/N, so memory never depends on N; returns the number
    of sentences written. Empty lines are left out.
    """
    keep_p = min(1.0, pairs / max(part.lines, 1))
    rng = np.random.default_rng(seed)
    written = 0
    with open(out, "w", encoding="utf-8") as f:
        for start, src, tgt in read_chunks(part):
            keep = np.flatnonzero(rng.random(len(src)) < keep_p)
            for i in keep.tolist():
                for path, line in ((part.src, src[i]), (part.tgt, tgt[i])):
                    text = decode_line(line, path, start + i + 1, invalid)
                    if text and not text.isspace():
                        f.write(text + "\n")
                        written += 1
            advance(len(src))
    return written


def sample_languages(files: list[tuple[Path, int]], sentences: int, seed: int, out: Path, invalid: str,
                     advance) -> int:
    """With --pairs: write about ``sentences`` random lines of each file (``files``: (path,
    lines), each once, however many pairs share it) to ``out``, so that every language has about
    the same say in the joint vocabulary (a language whose pairs have files of their own has one
    sample of each); returns the lines written (empty ones left out)."""
    written = 0
    with open(out, "w", encoding="utf-8") as f:
        for i, (path, lines) in enumerate(files):
            rng = np.random.default_rng([seed, i])
            keep_p = min(1.0, sentences / max(lines, 1))
            with open(path, "rb") as lines_in:
                start = 0
                while chunk := list(itertools.islice(lines_in, CHUNK_LINES)):
                    for j in np.flatnonzero(rng.random(len(chunk)) < keep_p).tolist():
                        text = decode_line(chunk[j], path, start + j + 1, invalid)
                        if text and not text.isspace():
                            f.write(text + "\n")
                            written += 1
                    start += len(chunk)
                    advance(len(chunk))
    return written


def learn_bpe(sample: Path, model_prefix: Path, vocab_size: int, max_sentences: int, threads: int, seed: int,
              control_symbols: tuple[str, ...] = ()) -> None:
    """Train the BPE model on ``sample``, at most ``max_sentences`` of it (0: all);
    ``control_symbols``: pieces no text encodes into (the target tags of --pairs).

    The sample is fed as an iterator and the model comes back as bytes: given a file name,
    sentencepiece records the (temporary) paths in the model, so two identical runs would differ.
    """
    import sentencepiece as spm

    spm.set_random_generator_seed(seed)
    model = io.BytesIO()
    try:
        with open(sample, encoding="utf-8") as lines:
            spm.SentencePieceTrainer.train(
                sentence_iterator=(line.rstrip("\n") for line in lines),
                model_writer=model,
                model_type="bpe",
                vocab_size=vocab_size,
                character_coverage=1.0,  # keep every character of the sample: no <unk> from rare letters
                normalization_rule_name="nmt_nfkc",  # sentencepiece's default, stated to be explicit
                pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID,
                pad_piece="<pad>", unk_piece="<unk>", bos_piece="<s>", eos_piece="</s>",
                input_sentence_size=max_sentences,
                shuffle_input_sentence=True,
                num_threads=threads,
                minloglevel=2,  # its own log is pages long; rich reports progress instead
                **({"control_symbols": list(control_symbols)} if control_symbols else {}),
            )
        with open(model_prefix.with_name(model_prefix.name + ".model"), "wb") as f:
            f.write(model.getvalue())
    except RuntimeError as e:
        limit = re.search(r"Vocabulary size too high \((\d+)\)\. Please set it to a value <= (\d+)", str(e))
        smallest = int(option_range(PreprocessOptions, "bpe_vocab_size").lo)
        if limit and int(limit[2]) < smallest:  # never suggest a size the option refuses
            raise XfError(
                f"the training data has too few distinct characters for a vocabulary: sentencepiece can make at "
                f"most {limit[2]} pieces from it, and --bpe-vocab-size is at least {smallest} (after nmt_nfkc "
                "normalization, which removes control and zero-width characters: is it text?)"
            ) from None
        if limit:
            raise XfError(
                f"--bpe-vocab-size {limit[1]} is too large for this training data: sentencepiece can make at "
                f"most {limit[2]} pieces from it; pass --bpe-vocab-size {limit[2]} or less"
            ) from None
        raise XfError(f"sentencepiece training failed: {e}") from None


def run_in_child(fn, *args) -> None:
    """``fn(*args)`` in a child process that the parent kills if it is interrupted.

    sentencepiece's training is one long C++ call that Python's signal handlers cannot break
    into: run in-process, Ctrl-C or SIGTERM would wait minutes for it to return. Here the parent
    only waits on a pipe, so it sees the signal at once, kills the child and unwinds (which
    removes the temporary output). The child's XfError comes back as the parent's.
    """
    ctx = multiprocessing.get_context("spawn")  # no fork of a process that runs rich's refresh thread
    receive, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_child_main, args=(send, fn, args), daemon=True)
    child.start()
    send.close()
    try:
        try:
            error = receive.recv()  # blocks until the child reports, or dies (EOF)
        except EOFError:
            child.join()
            error = f"{getattr(fn, '__name__', fn)} died (exit code {child.exitcode}; out of memory?)"
        child.join()
    finally:
        if child.exitcode is None:
            child.kill()
            child.join()
        receive.close()
    if error is not None:
        raise XfError(error)


def _child_main(send, fn, args) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C reaches the parent too; it kills us
    try:
        fn(*args)
        error = None
    except XfError as e:
        error = str(e)
    except Exception as e:  # noqa: BLE001 - reported by the parent as a one-line error
        error = f"{type(e).__name__}: {e}"
    send.send(error)


def explain_no_text(sample: Path, train: Split) -> None:
    """After a failed BPE training: an XfError naming the files when no sampled line has any text
    left after sentencepiece's normalization (zero-width or control characters only, ...)."""
    import sentencepiece as spm

    if not hasattr(spm, "SentencePieceNormalizer"):  # sentencepiece < 0.2
        return
    normalizer = spm.SentencePieceNormalizer(rule_name="nmt_nfkc")
    with open(sample, encoding="utf-8") as f:
        for line in f:
            if normalizer.normalize(line.rstrip("\n")).strip("\u2581"):
                return
    with open(train.parts[0].src, "rb") as f:
        first = decode_line(f.readline(), train.parts[0].src, 1, "replace")
    names = ", ".join(dict.fromkeys(str(f) for p in train.parts for f in (p.src, p.tgt)))
    raise XfError(f"{names}: no text to learn BPE from: every line is empty after sentencepiece's "
                  f"nmt_nfkc normalization, which removes control and zero-width characters (line 1: {first!r})")


# --------------------------------------------------------------------------- encoding (worker side)

_worker: dict = {}  # per process: the sentencepiece model and the cleaning options


def init_worker(spm_path: str, dtype: str, max_len: int, max_len_ratio: float, skip_invalid: bool,
                in_pool: bool = False) -> None:
    if in_pool:  # Ctrl-C: the main process stops the pool; no traceback from every worker
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    _worker.update(sp=load_sentencepiece(Path(spm_path)), dtype=np.dtype(dtype), max_len=max_len,
                   max_len_ratio=max_len_ratio, skip_invalid=skip_invalid)


def encode_chunk(task: tuple) -> tuple:
    """Decode, encode and (train only) clean one chunk of pairs.

    Returns (src tokens, src sizes, tgt tokens, tgt sizes, stats) of the kept pairs, tokens flat.
    With a ``tag_id`` (--pairs), every non-empty source sentence starts with it; with
    ``formality`` (--formality-tags: the tags' ids, whether the source is English) a source whose
    target classifies formal or informal starts with that tag, after ``tag_id``; the cleaning
    counts the sentence without them.
    """
    src_path, tgt_path, clean, start, src_lines, tgt_lines, tag_id, formality = task
    w = _worker
    invalid = "skip" if w["skip_invalid"] else "error"
    stats = collections.Counter(pairs_in=len(src_lines))
    src_text, tgt_text = [], []
    for i, (s, t) in enumerate(zip(src_lines, tgt_lines)):
        lineno = start + i + 1
        s2, t2 = decode_line(s, src_path, lineno, invalid), decode_line(t, tgt_path, lineno, invalid)
        if s2 is None or t2 is None:  # only with --skip-invalid
            if clean:
                stats["invalid_utf8"] += 1
                continue
            # valid/test keep every line, so that outputs stay aligned with their references
            stats["replaced_invalid_utf8"] += 1
            s2 = s2 if s2 is not None else decode_line(s, src_path, lineno, "replace")
            t2 = t2 if t2 is not None else decode_line(t, tgt_path, lineno, "replace")
        src_text.append(s2)
        tgt_text.append(t2)
    labels = None
    if formality is not None:
        labels = [classify(t, s if formality[1] else None) for s, t in zip(src_text, tgt_text)]
    src_ids = w["sp"].encode(src_text, num_threads=1)  # one thread: the parallelism is the workers
    tgt_ids = encode_target(w["sp"], tgt_text, num_threads=1)  # an imported vocabulary's own target model
    src_sizes = np.fromiter(map(len, src_ids), np.int32, len(src_ids))
    tgt_sizes = np.fromiter(map(len, tgt_ids), np.int32, len(tgt_ids))
    if clean:  # as Moses clean-corpus-n.perl (1..max_len, -ratio), but counted in subwords
        empty = (src_sizes == 0) | (tgt_sizes == 0)
        too_long = ~empty & ((src_sizes > w["max_len"]) | (tgt_sizes > w["max_len"]))
        ratio = ~empty & ~too_long & (
            np.maximum(src_sizes, tgt_sizes) > w["max_len_ratio"] * np.minimum(src_sizes, tgt_sizes))
        stats.update(empty=int(empty.sum()), too_long=int(too_long.sum()), ratio=int(ratio.sum()))
        keep = np.flatnonzero(~(empty | too_long | ratio))
        if len(keep) < len(src_ids):
            src_ids, tgt_ids = [src_ids[i] for i in keep], [tgt_ids[i] for i in keep]
            src_sizes, tgt_sizes = src_sizes[keep], tgt_sizes[keep]
            labels = [labels[i] for i in keep] if labels is not None else None
    if labels is not None:  # by id, as the target tag: control symbols
        src_ids = [[formality[0][label], *ids] if ids and label in formality[0] else ids
                   for ids, label in zip(src_ids, labels)]
        src_sizes = np.fromiter(map(len, src_ids), np.int32, len(src_ids))
        stats.update(tagged_formal=labels.count("formal"), tagged_informal=labels.count("informal"))
    if tag_id is not None:  # by id: the tag is a control symbol, which no text encodes into
        src_ids = [[tag_id, *ids] if ids else ids for ids in src_ids]
        src_sizes = src_sizes + (src_sizes > 0)
    src_tokens = np.fromiter(itertools.chain.from_iterable(src_ids), w["dtype"], int(src_sizes.sum()))
    tgt_tokens = np.fromiter(itertools.chain.from_iterable(tgt_ids), w["dtype"], int(tgt_sizes.sum()))
    stats.update(pairs=len(src_sizes), src_tokens=len(src_tokens), tgt_tokens=len(tgt_tokens),
                 src_unk=int(np.count_nonzero(src_tokens == UNK_ID)),
                 tgt_unk=int(np.count_nonzero(tgt_tokens == UNK_ID)))
    return src_tokens, src_sizes, tgt_tokens, tgt_sizes, dict(stats)


def ordered_map(fn, tasks: Iterable, pool: ProcessPoolExecutor | None, window: int) -> Iterator:
    """``map(fn, tasks)`` on a process pool, in input order, with at most ``window`` tasks in
    flight (Pool.imap would read the whole input ahead into memory when workers are slower)."""
    if pool is None:
        yield from map(fn, tasks)
        return
    pending: collections.deque = collections.deque()
    try:
        for task in tasks:
            pending.append(pool.submit(fn, task))
            if len(pending) >= window:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    except BrokenProcessPool:
        raise XfError("a worker process died unexpectedly (killed, or out of memory?); try fewer --workers") from None


def binarize(split: Split, out: Path, o: PreprocessOptions, dtype: np.dtype, pool, advance) -> dict:
    """Encode one split (its parts one after the other) into ``out/{split}.{lang}.bin/.idx``;
    returns its counts (with --pairs, each direction's too)."""
    writers = TokenArrayWriter(out / f"{split.name}.{o.source_lang}", dtype), TokenArrayWriter(
        out / f"{split.name}.{o.target_lang}", dtype)
    per_part = [collections.Counter({k: 0 for k in DROP_REASONS}) for _ in split.parts]
    tasks = ((i, (p.src, p.tgt, split.clean, start, s, t, p.tag_id, p.formality))
             for i, p in enumerate(split.parts) for start, s, t in read_chunks(p))
    parts_of_tasks: collections.deque = collections.deque()  # the part of each task in flight, in order

    def each_task():
        for i, task in tasks:
            parts_of_tasks.append(i)
            yield task

    for src_tokens, src_sizes, tgt_tokens, tgt_sizes, stats in ordered_map(encode_chunk, each_task(), pool,
                                                                            2 * o.workers):
        writers[0].add_flat(src_tokens, src_sizes)
        writers[1].add_flat(tgt_tokens, tgt_sizes)
        per_part[parts_of_tasks.popleft()].update(stats)
        advance(stats["pairs_in"])
    for w in writers:
        w.close()
    totals: collections.Counter = collections.Counter()
    for c in per_part:
        totals.update(c)  # (update keeps the zero counts that + would drop)
    t = dict(totals)
    files = dict(src_file=str(split.parts[0].src), tgt_file=str(split.parts[0].tgt))
    if split.parts[0].direction is not None:  # --pairs: the files and counts of each direction, in row order
        files = {}
        directions = {p.direction: dict(src_file=str(p.src), tgt_file=str(p.tgt), pairs_in=c.get("pairs_in", 0),
                                        pairs=c.get("pairs", 0), dropped={k: c[k] for k in DROP_REASONS})
                      for p, c in zip(split.parts, per_part)}
    return dict(
        **files, pairs_in=t.get("pairs_in", 0), pairs=t.get("pairs", 0),
        dropped={k: t[k] for k in DROP_REASONS},
        replaced_invalid_utf8=t.get("replaced_invalid_utf8", 0),
        src_tokens=t.get("src_tokens", 0), tgt_tokens=t.get("tgt_tokens", 0),
        unk_rate={o.source_lang: t.get("src_unk", 0) / max(t.get("src_tokens", 0), 1),
                  o.target_lang: t.get("tgt_unk", 0) / max(t.get("tgt_tokens", 0), 1)},
        **({"directions": directions} if not files else {}),
        **({"formality": dict(formal=t.get("tagged_formal", 0), informal=t.get("tagged_informal", 0),
                              untagged=t.get("pairs", 0) - t.get("tagged_formal", 0) - t.get("tagged_informal", 0))}
           if o.formality_tags else {}),
    )


# --------------------------------------------------------------------------- the command


class RateColumn(ProgressColumn):
    def render(self, task) -> Text:
        return Text(f"{task.speed:,.0f}/s" if task.speed else "", style="cyan")


def make_progress(console: Console) -> Progress:
    return Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(bar_width=20), MofNCompleteColumn(),
                    RateColumn(), TimeElapsedColumn(), TimeRemainingColumn(), console=console,
                    disable=not console.is_terminal)


def write_vocab(sp, path: Path) -> None:
    path.write_text("".join(f"{sp.id_to_piece(i)}\t{sp.get_score(i):g}\n" for i in range(sp.get_piece_size())), encoding="utf-8")


def replace_dir(tmp: Path, dest: Path, overwrite: bool) -> None:
    """Move the finished ``tmp`` to ``dest``; an old ``dest`` is moved aside first, then removed
    (fileio.replace_path)."""
    if dest.exists():
        if any(dest.iterdir()):
            if not overwrite:  # checked at the start too; this is for a destdir filled meanwhile
                raise XfError(f"destdir {dest} exists and is not empty (pass --overwrite to replace it)")
        else:
            dest.rmdir()
    refuse_running_training(dest)
    replace_path(tmp, dest)
    fsync_dir(dest.parent)


def check_inputs(splits: list[Split], progress: Progress) -> Split | None:
    """Stage 1: count every file's lines (into ``part.lines``); returns the training split."""
    files = list(dict.fromkeys(f for s in splits for p in s.parts for f in (p.src, p.tgt)))  # --pairs share files
    task = progress.add_task("checking inputs, MB", total=sum(f.stat().st_size for f in files if f.is_file()) / 1e6)
    counted: dict[Path, int] = {}

    def lines_of(path: Path) -> int:
        if path not in counted:
            check_line_endings(path)
            counted[path] = count_lines(path, lambda n: progress.advance(task, n / 1e6))
        return counted[path]

    for s in splits:
        for p in s.parts:
            p.lines, tgt_lines = lines_of(p.src), lines_of(p.tgt)
            if p.lines != tgt_lines:
                raise XfError(f"line counts differ: {p.src} has {p.lines} lines but {p.tgt} has {tgt_lines}"
                              + (f" (pair {p.direction})" if p.direction else ""))
    train = splits[0] if splits and splits[0].name == "train" else None
    for p in train.parts if train is not None else ():
        if p.lines == 0:
            raise XfError(f"empty training set: {p.src} and {p.tgt} have no lines")
    for s in splits:
        for p in s.parts:
            if s.name.startswith("valid") and p.lines == 0:  # its loss would be 0 and choose the best checkpoint
                raise XfError(f"empty validation set: {p.src} and {p.tgt} have no lines")
    return train


def make_spm(o: PreprocessOptions, train: Split | None, out: Path, progress: Progress) -> dict:
    """Stages 2-3: ``out/spm.model``, learned on a sample of ``train``, copied from --spm-model, or
    the vocabulary of checkpoint --vocab-from (a sentencepiece model or an imported model's mapped
    vocabulary: the bytes xf train compares).

    Returns how it was made (for meta.json)."""
    tags = tuple(dict.fromkeys(tag(t) for _, t in o.pair_list()))  # of every target language (--pairs)
    tags += tuple(TAGS.values()) if o.formality_tags else ()
    if o.vocab_from:
        from ..model.checkpoint import load_checkpoint

        vocabulary = load_checkpoint(o.vocab_from)["spm_model"]
        check_tags(load_sentencepiece(vocabulary, str(o.vocab_from)), tags, f"--vocab-from {o.vocab_from}")
        (out / "spm.model").write_bytes(vocabulary)
        return dict(learned=False, source=f"{o.vocab_from} (its vocabulary)")
    if o.spm_model:
        spm_path = Path(o.spm_model)
        if not spm_path.is_file():
            raise XfError(f"--spm-model {spm_path}: no such file")
        check_tags(load_sentencepiece(spm_path), tags, f"--spm-model {spm_path}")  # and the special ids, before copying
        shutil.copyfile(spm_path, out / "spm.model")
        return dict(learned=False, source=str(spm_path))
    sample = out / "bpe-sample.txt"
    invalid = "skip" if o.skip_invalid else "error"
    if o.pairs:  # each language's file once: about --bpe-sample-lines sentences of each
        files = {}  # file -> lines: each language's text once, in the order of --pairs
        for p in train.parts:
            files.setdefault(p.src, p.lines)
            files.setdefault(p.tgt, p.lines)
        task = progress.add_task("sampling for BPE", total=sum(files.values()))
        sentences = sample_languages(list(files.items()), o.bpe_sample_lines, o.seed, sample, invalid,
                                     lambda n: progress.advance(task, n))
        wanted = len(files) * o.bpe_sample_lines
    else:
        task = progress.add_task("sampling for BPE", total=train.lines)
        sentences = sample_for_bpe(train.parts[0], o.bpe_sample_lines, o.seed, sample, invalid,
                                   lambda n: progress.advance(task, n))
        wanted = 2 * o.bpe_sample_lines
    if sentences == 0 and o.bpe_sample_lines < train.lines:  # the sample is empty, maybe not the files
        raise XfError(f"the sample to learn BPE from holds no text: --bpe-sample-lines {o.bpe_sample_lines:,} keeps each "
                      f"of the {train.lines:,} pairs of {train.files} with probability "
                      f"{o.bpe_sample_lines / train.lines:.3g}, and kept none with text; raise --bpe-sample-lines")
    if sentences == 0:
        raise XfError(f"no non-empty lines in {train.files} to learn BPE from")
    task = progress.add_task(f"learning BPE {o.bpe_vocab_size}", total=None)
    # the sample is random already; sentencepiece's shuffle only trims a Bernoulli excess
    bound = max(wanted, 101)  # sentencepiece takes 0 (all) or over 100
    try:
        run_in_child(learn_bpe, sample, out / "spm", o.bpe_vocab_size, bound if sentences > bound else 0, o.workers,
                     o.seed, tags)
    except XfError:
        explain_no_text(sample, train)
        raise
    sample.unlink()
    progress.update(task, total=sentences, completed=sentences)
    return dict(learned=True, model_type="bpe", normalization="nmt_nfkc", character_coverage=1.0,
                sample_sentences=sentences, **({"control_symbols": list(tags)} if tags else {}))


def check_tags(sp, tags: tuple[str, ...], where: str) -> None:
    """A given vocabulary for --pairs must hold every target tag as one piece."""
    for piece in tags:
        tag_id = sp.piece_to_id(piece)
        if tag_id == UNK_ID or sp.id_to_piece(tag_id) != piece:
            raise XfError(f"{where}: its vocabulary has no piece {piece}, a tag that "
                          f"{'--formality-tags' if piece in TAGS.values() else '--pairs'} puts before source "
                          "sentences (learn the vocabulary with it as a control symbol, or leave the vocabulary to "
                          "xf preprocess)")


def tag_parts(splits: list[Split], sp, o: PreprocessOptions) -> None:
    """Give every part of --pairs the id of its target's tag, and with --formality-tags every
    part into German the formality tags' ids (all checked to be in the vocabulary)."""
    ids = tag_ids(sp, "the vocabulary") if o.formality_tags else None
    for s in splits:
        for p in s.parts:
            if p.target is not None:
                p.tag_id = sp.piece_to_id(tag(p.target))
            source, target = p.direction.split("-") if p.direction else (o.source_lang, o.target_lang)
            if ids is not None and tagged_targets([target]):
                p.formality = (ids, source in ("en", "eng"))


def encode_splits(o: PreprocessOptions, splits: list[Split], out: Path, dtype: np.dtype, progress: Progress) -> None:
    """Stage 4: binarize every split into ``out`` (stats into ``split.stats``)."""
    init_args = (str(out / "spm.model"), dtype.str, o.max_len, o.max_len_ratio, o.skip_invalid)
    pool = None
    if o.workers > 1:  # spawn: no fork of a process that runs rich's refresh thread
        pool = ProcessPoolExecutor(o.workers, multiprocessing.get_context("spawn"), init_worker, (*init_args, True))
    else:
        init_worker(*init_args)
    try:
        for s in splits:
            task = progress.add_task(f"encoding {s.name}", total=s.lines)
            s.stats = binarize(s, out, o, dtype, pool, lambda n, task=task: progress.advance(task, n))
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)


def preprocess(o: PreprocessOptions) -> dict:
    """Run ``xf preprocess``; returns the meta.json dict written into ``o.destdir``."""
    if o.verify:
        return verify(Path(o.destdir))
    check_destination(o)
    splits = plan_splits(o)
    console = stderr_console()
    dest = directory_target(o.destdir)  # a symlink: its target is replaced, the link stays
    began = time.perf_counter()
    with make_progress(console) as progress, reporting_write_errors(dest):  # a full disk: names destdir
        train = check_inputs(splits, progress)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f"{temporary_prefix(dest)}{secrets.token_hex(4)}.tmp")  # renamed to dest when complete
        tmp.mkdir()
        try:
            bpe = make_spm(o, train, tmp, progress)
            sp = load_sentencepiece(tmp / "spm.model")
            tag_parts(splits, sp, o)
            write_vocab(sp, tmp / "spm.vocab")
            vocab_size = sp.get_piece_size()
            dtype = smallest_dtype(vocab_size)
            encode_splits(o, splits, tmp, dtype, progress)
            for part, kept in zip(train.parts if train is not None else (), part_stats(train)):
                if kept["pairs"] == 0:
                    raise XfError(f"empty training set after cleaning: all {part.lines} pairs of {part.src} / "
                                  f"{part.tgt} were dropped ({describe_drops(kept['dropped'])})")
            meta = dict(
                format_version=FORMAT_VERSION,
                xf_version=__version__,
                source_lang=o.source_lang,
                target_lang=o.target_lang,
                **({"pairs": pair_names(o.pair_list()),
                    "sampling_temperature": o.sampling_temperature} if o.pairs else {}),
                **({"formality": LANGUAGE} if o.formality_tags else {}),  # the language whose address its tags choose
                vocab_size=vocab_size,
                dtype=dtype.name,
                special_ids=dict(pad=PAD_ID, unk=UNK_ID, bos=BOS_ID, eos=EOS_ID),
                spm_sha256=hashlib.sha256((tmp / "spm.model").read_bytes()).hexdigest(),
                bpe=bpe,
                splits=[s.name for s in splits],
                stats={s.name: s.stats for s in splits},
                options=recorded_options(o),
                files={p.name: file_sha256(p) for p in sorted(tmp.iterdir())},  # for --verify
            )
            with open(tmp / "meta.json", "w", encoding="utf-8") as f:  # last: marks the directory complete
                f.write(json.dumps(meta, indent=1) + "\n")
                f.flush()
                os.fsync(f.fileno())
            replace_dir(tmp, dest, o.overwrite)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    remove_stale_temporaries_of(dest)  # of a killed xf preprocess of the same destdir
    print_table(console, summary_table(meta, dest, round(time.perf_counter() - began, 1)))
    return meta


def recorded_options(o: PreprocessOptions) -> dict:
    """The options for meta.json: those that decide the content. Where it goes (destdir) and
    whether to replace it are left out, so that one command gives the same bytes in any directory;
    so are --pairs and --sampling-temperature of a bilingual run, and --formality-tags when off
    (meta.json as before they were)."""
    left_out = ("destdir", "overwrite", "verify") + (() if o.pairs else ("pairs", "sampling_temperature")) + (
        () if o.formality_tags else ("formality_tags",))
    return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(o).items() if k not in left_out}


def part_stats(split: Optional[Split]) -> list[dict]:
    """The counts of each part of a binarized split: its directions' (--pairs), or the split's own."""
    if split is None:
        return []
    return list(split.stats["directions"].values()) if "directions" in split.stats else [split.stats]


def verify(dest: Path) -> dict:
    """``xf preprocess --verify``: every file against meta.json's checksums, every split's index
    against its .bin and the vocabulary. Returns meta.json's dict; raises XfError on a mismatch."""
    data = DataDir.open(dest)
    bad = data.verify_checksums()
    if bad:
        raise XfError(f"{dest}: {len(bad)} file(s) differ from meta.json's checksums: {', '.join(bad)}; "
                      "re-run xf preprocess")
    for name in data.splits:
        data.split(name)  # checks offsets, sizes and token ids
    Console(stderr=True).print(f"{dest}: {len(data.meta['files'])} files match meta.json's checksums; "
                               f"splits {', '.join(data.splits)} are consistent", soft_wrap=True)
    return data.meta


def describe_drops(dropped: dict) -> str:
    return ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in dropped.items() if v) or "none"


def summary_table(meta: dict, dest: Path, seconds: float) -> Table:
    """One column per split, one row per count (fits a terminal for any number of splits)."""
    src, tgt, o = meta["source_lang"], meta["target_lang"], meta["options"]
    table = Table(title=f"xf preprocess: {dest} (vocab {meta['vocab_size']}, {meta['dtype']}, {seconds}s)")
    table.add_column("")
    stats = [meta["stats"][name] for name in meta["splits"]]
    for name in meta["splits"]:
        table.add_column(name, justify="right")
    rows = [
        ("pairs read", lambda s: f"{s['pairs_in']:,}"),
        ("pairs kept", lambda s: f"{s['pairs']:,}"),
        ("dropped: empty", lambda s: f"{s['dropped']['empty']:,}"),
        (f"dropped: over {o['max_len']} subwords", lambda s: f"{s['dropped']['too_long']:,}"),
        (f"dropped: ratio over {o['max_len_ratio']}", lambda s: f"{s['dropped']['ratio']:,}"),
        ("dropped: invalid UTF-8", lambda s: f"{s['dropped']['invalid_utf8']:,}"),
        ("invalid UTF-8 replaced", lambda s: f"{s['replaced_invalid_utf8']:,}"),
        (f"{src} subwords", lambda s: f"{s['src_tokens']:,}"),
        (f"{tgt} subwords", lambda s: f"{s['tgt_tokens']:,}"),
        (f"{src} unknown", lambda s: f"{s['unk_rate'][src]:.3%}"),
        (f"{tgt} unknown", lambda s: f"{s['unk_rate'][tgt]:.3%}"),
    ]
    if meta.get("formality"):  # --formality-tags: the kept pairs whose source starts with a tag
        rows.insert(2, ("  tagged formal / informal", lambda s: f"{s['formality']['formal']:,} / "
                                                               f"{s['formality']['informal']:,}"))
    for i, direction in enumerate(meta.get("pairs") or ()):  # --pairs: the pairs each direction kept
        rows.insert(2 + i, (f"  {direction} kept", lambda s, d=direction: f"{s['directions'][d]['pairs']:,}"))
    for label, cell in rows:
        if label.startswith("invalid") and not any(s["replaced_invalid_utf8"] for s in stats):
            continue
        table.add_row(label, *(cell(s) for s in stats))
    return table
