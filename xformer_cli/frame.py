"""The command table: every ``xf`` command declared once, and the rules the frame applies to all.

As Marian's ``subcmds`` map, one list names every command: its words after ``xf``, its options
class, the function that runs it, and which of its options name what it reads (``inputs``) and
what it writes (``outputs``). Everything that holds for every command derives from this table:
``cli.py`` registers the commands from it in a loop, a YAML file's sections are its commands'
(``section``), ``docs/options.md`` is generated from it, the CLI tests iterate it, and the output
guard (``safety.refuse_unsafe_outputs``) runs on the declared paths before any command starts.
A command added here gets its flags, its YAML section, its reference and the guard with no other
edit (tests/test_frame.py shows it).

The command modules are named, not imported: ``xf --help`` and ``xf score`` stay fast, and this
module (part of the front end, with ``cli.py``) imports no command until one runs.
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Literal, Optional, Union

from .settings.config import load_options
from .settings.options import (
    AverageOptions,
    CalibrateOptions,
    ExportOptions,
    ImportOptions,
    PlotAttentionOptions,
    PlotCurvesOptions,
    PreprocessOptions,
    ScoreOptions,
    ScorePairsOptions,
    ServeOptions,
    ShortlistOptions,
    TrainOptions,
    TranslateOptions,
)


@dataclass(frozen=True)
class Input:
    """An option naming what a command reads: a file, a directory or either (``path``). A prefix
    option names files PREFIX + suffix, each suffix formatted with the options' fields
    (``".{source_lang}"``); a list option names one path per value."""

    option: str
    kind: Literal["file", "directory", "path"] = "file"
    suffixes: tuple[str, ...] = ("",)
    # options -> the suffixes, in place of ``suffixes`` where it gives any (xf preprocess --pairs)
    suffixes_of: Optional[Callable[[Any], tuple[str, ...]]] = None
    stdin: bool = False  # unset, the command reads stdin (``xf translate`` without --input)
    when: Optional[str] = None  # a bool option that makes it an input (``xf preprocess --verify`` reads --destdir)


@dataclass(frozen=True)
class Output:
    """An option naming what a command writes. ``file`` and ``directory`` are replaced whole (an
    existing one only with ``--overwrite`` where the command has that option, and atomically; a
    FIFO or device written in place); ``stdout``: a file, or ``-`` for stdout; ``into`` is a
    directory the command writes files into (a log dir), ``locked`` one it holds the lock of (xf
    train's save dir, ``safety.SaveDirLock``)."""

    option: str
    kind: Literal["file", "stdout", "directory", "into", "locked"] = "file"
    unless: Optional[str] = None  # a bool option that makes it no output (``xf preprocess --verify`` writes nothing)
    # (option, value, kind): another kind where an option has that value (``xf export argos`` writes a file)
    kind_when: tuple[tuple[str, Any, str], ...] = ()

    def kind_for(self, options: Any) -> str:
        return next((kind for name, value, kind in self.kind_when if getattr(options, name) == value), self.kind)


@dataclass(frozen=True)
class Command:
    words: str  # after `xf`: "train", "plot curves"
    options: type  # its options dataclass: the flags, the YAML keys, the reference
    run: Union[str, Callable[[Any], None]]  # "module:function" of xformer_cli.commands, or the function itself
    summary: str  # the first line of its --help
    inputs: tuple[Input, ...] = ()
    outputs: tuple[Output, ...] = ()

    @property
    def section(self) -> str:
        """Its section of a YAML file: ``average-checkpoints`` -> ``average_checkpoints``, ``plot curves`` -> ``plot_curves``."""
        return self.words.replace(" ", "_").replace("-", "_")

    @property
    def flag_words(self) -> str:
        return "xf " + self.words

    def function(self) -> Callable[[Any], None]:
        if callable(self.run):
            return self.run
        module, name = self.run.split(":")
        return getattr(importlib.import_module(f"xformer_cli.commands.{module}"), name)

    def input_paths(self, options: Any) -> Iterator[tuple[str, str, str]]:
        """(flag, path, kind) of every input the options name: list options one per value, prefixes per suffix."""
        values = dataclasses.asdict(options)
        for spec in self.inputs:
            if spec.when and not getattr(options, spec.when):
                continue
            value = getattr(options, spec.option)
            for item in value if isinstance(value, tuple) else (value,):
                if item is None:
                    continue
                for suffix in (spec.suffixes_of and spec.suffixes_of(options)) or spec.suffixes:
                    yield _flag(spec.option), str(item) + suffix.format(**values), spec.kind

    def output_paths(self, options: Any) -> Iterator[tuple[str, str, str]]:
        """(flag, path, kind) of every output the options name (an unset optional output: none)."""
        for spec in self.outputs:
            if spec.unless and getattr(options, spec.unless):
                continue
            value = getattr(options, spec.option)
            if value is not None:
                yield _flag(spec.option), str(value), spec.kind_for(options)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


# Groups of commands (`xf plot curves`): their help.
GROUPS = {
    "plot": "Pictures: training curves from train_log.jsonl, attention maps of a checkpoint (needs matplotlib).",
}

_PREFIX = (".{source_lang}", ".{target_lang}")


def _pair_suffixes(options: PreprocessOptions) -> tuple[str, ...]:
    """With --pairs, the files a prefix names: PREFIX.en, PREFIX.de, ... (each language once) and
    each pair's own, PREFIX.en-de.en and PREFIX.en-de.de (preprocess.pair_files reads one or the other)."""
    own = tuple(f".{s}-{t}.{lang}" for s, t in options.pair_list() for lang in (s, t))
    return tuple(f".{lang}" for lang in options.languages()) + own if own else ()


COMMANDS: list[Command] = [
    Command("preprocess", PreprocessOptions, "preprocess:preprocess",
            "Learn a joint sentencepiece BPE and binarize parallel text into memory-mapped arrays.",
            inputs=(*(Input(prefix, suffixes=_PREFIX, suffixes_of=_pair_suffixes)
                      for prefix in ("trainpref", "validpref", "testpref")),
                    Input("spm_model"), Input("vocab_from", "path"),
                    Input("destdir", "directory", when="verify")),
            outputs=(Output("destdir", "directory", unless="verify"),)),
    Command("train", TrainOptions, "train:train",
            "Train a Transformer (one CPU, one GPU, or many under torchrun).",
            inputs=(Input("data", "directory"), Input("init_from")),
            outputs=(Output("save_dir", "locked"), Output("tensorboard_logdir", "into"))),
    Command("average-checkpoints", AverageOptions, "average:average_checkpoints",
            "Average the parameters of the last N checkpoints, as the paper does.",
            inputs=(Input("inputs", "path"), Input("valid_source"), Input("valid_reference")),
            outputs=(Output("output"), Output("choose_report"))),
    Command("translate", TranslateOptions, "translate:translate",
            "Translate stdin to stdout with batched beam search: one output line per input line.",
            inputs=(Input("path", "path"), Input("input", stdin=True), Input("shortlist"), Input("glossary"),
                    Input("confidence"), Input("reverse_path", "path")),
            outputs=(Output("output", "stdout"),)),
    Command("shortlist", ShortlistOptions, "shortlist:shortlist",
            "Build a vocabulary shortlist for xf translate --shortlist from a data directory's training pairs.",
            inputs=(Input("data", "directory"),),
            outputs=(Output("output"),)),
    Command("export", ExportOptions, "export:export",
            "Export a checkpoint for another runtime: xf export ctranslate2|huggingface|argos|marian|bergamot --path "
            "CKPT --output PATH.",
            inputs=(Input("path"), Input("bleu"), Input("shortlist"), Input("bergamot_package", "directory")),
            outputs=(Output("output", "directory", kind_when=(("format", "argos", "file"),)),)),
    Command("import", ImportOptions, "import_:import_model",
            "Import a model from another toolkit: xf import huggingface DIR --output CKPT (a MarianMT directory).",
            inputs=(Input("directory", "directory"),),
            outputs=(Output("output"),)),
    Command("score", ScoreOptions, "score:score",
            "Score hypotheses with sacreBLEU, chrF and TER (and the paper's tokenized BLEU).",
            inputs=(Input("ref"), Input("hyp"), Input("paired_bs"))),
    Command("score-pairs", ScorePairsOptions, "score_pairs:score_pairs",
            "Score given source-target pairs by forced decoding: log-probabilities, and dual cross-entropy with a reverse model.",
            inputs=(Input("path"), Input("reverse_path"), Input("source"), Input("target")),
            outputs=(Output("output", "stdout"),)),
    Command("calibrate", CalibrateOptions, "calibrate:calibrate",
            "Fit how xf translate's confidence combines its parts, on a validation set: xf translate --confidence FILE.",
            inputs=(Input("path"), Input("reverse_path"), Input("source"), Input("reference")),
            outputs=(Output("output"),)),
    Command("serve", ServeOptions, "serve:serve",
            "Serve translations over HTTP (LibreTranslate's API) with dynamic batching: xf serve --model en-de=avg.pt.",
            inputs=(Input("api_keys"),)),
    Command("plot curves", PlotCurvesOptions, "plot:plot_curves",
            "Training and validation loss, validation BLEU, learning rate and speed of one or more runs.",
            inputs=(Input("save_dirs", "path"),),
            outputs=(Output("output"),)),
    Command("plot attention", PlotAttentionOptions, "plot:plot_attention",
            "Attention weights of a checkpoint on one sentence, as heat maps or as lines between tokens.",
            inputs=(Input("path"),),
            outputs=(Output("output"),)),
]


def sections() -> tuple[str, ...]:
    """The sections a YAML file may hold: one per command."""
    return tuple(c.section for c in COMMANDS)


def load_command_options(cls: type, config=None, overrides: Optional[dict] = None, section: Optional[str] = None):
    """``config.load_options`` with every command's section known (a file may hold them all)."""
    return load_options(cls, config, overrides, section, sections())


def check_outputs(command: Command, options: Any) -> None:
    """The output guard of every command, from its declared inputs and outputs (before any work)."""
    from .base.safety import refuse_unsafe_outputs

    reads_stdin = any(spec.stdin and getattr(options, spec.option) in (None, "-") for spec in command.inputs)
    refuse_unsafe_outputs(list(command.output_paths(options)), list(command.input_paths(options)),
                          overwrite=getattr(options, "overwrite", None), stdin=reads_stdin)
