"""The ``xf`` command: a thin Typer front end over one library function per subcommand.

Flags are generated from the options dataclasses in ``options.py``, so every flag has a YAML key
of the same name (``--config FILE``) and flags win over YAML. Errors are one line on stderr and a
non-zero exit; ``--verbose`` shows the traceback.
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
import traceback
import typing
from pathlib import Path
from typing import Annotated, Any, Callable, Optional

import click
import typer

from . import __version__
from .config import ConfigError, _is_optional, field_types, load_options
from .errors import XfError
from .options import AverageOptions, ExportOptions, PreprocessOptions, ScoreOptions, TrainOptions, TranslateOptions

app = typer.Typer(
    name="xf",
    help="xf: neural machine translation with the Transformer of Vaswani et al. (2017).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"xf {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[
        bool, typer.Option("--version", callback=_version_callback, is_eager=True, help="Show the version.")
    ] = False,
) -> None:
    """xf: neural machine translation with the Transformer of Vaswani et al. (2017)."""


def fail(message: str, code: int = 1) -> typing.NoReturn:
    typer.echo(f"xf: error: {message}", err=True)
    raise typer.Exit(code)


def _parameter(f: dataclasses.Field, tp: Any) -> inspect.Parameter:
    """The Typer parameter of one options field: every flag defaults to None (= not given)."""
    optional, inner = _is_optional(tp)
    meta = f.metadata
    default = None if f.default is dataclasses.MISSING else f.default
    kwargs: dict[str, Any] = {"help": meta.get("help", "")}
    if default not in (None, ()) and inner is not bool:
        kwargs["show_default"] = " ".join(map(str, default)) if isinstance(default, tuple) else str(default)
    origin = typing.get_origin(inner)
    if origin is tuple:
        annotation = Optional[list[typing.get_args(inner)[0]]]
    else:
        annotation = Optional[inner]
    flag = "--" + f.name.replace("_", "-")
    if meta.get("positional"):
        info = typer.Argument(**kwargs, show_default=False)
    elif inner is bool:
        info = typer.Option(f"{flag}/--no-{flag[2:]}", **kwargs)
        if default is not None:
            info.help = f"{info.help} [default: {'on' if default else 'off'}]"
    else:
        names = [flag] + ["--" + a.replace("_", "-") for a in meta.get("aliases", ())]
        names += [meta["short"]] if "short" in meta else []
        info = typer.Option(*names, **kwargs)
    return inspect.Parameter(
        f.name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Annotated[annotation, info]
    )


def command(name: str, options_cls: type, section: str):
    """Register ``fn(options)`` as subcommand ``name`` with flags generated from ``options_cls``."""

    def decorate(fn: Callable[[Any], None]):
        types_by_name = field_types(options_cls)
        params = [_parameter(f, types_by_name[f.name]) for f in dataclasses.fields(options_cls)]
        params.append(
            inspect.Parameter(
                "config",
                inspect.Parameter.KEYWORD_ONLY,
                default=None,
                annotation=Annotated[Optional[Path], typer.Option("--config", help="YAML options file (flags win)")],
            )
        )
        params.append(
            inspect.Parameter(
                "verbose",
                inspect.Parameter.KEYWORD_ONLY,
                default=False,
                annotation=Annotated[bool, typer.Option("--verbose", help="Show tracebacks on errors.")],
            )
        )

        def wrapper(**kwargs: Any) -> None:
            config = kwargs.pop("config")
            verbose = kwargs.pop("verbose")
            overrides = {k: (tuple(v) if isinstance(v, list) else v) for k, v in kwargs.items()}
            overrides = {k: v for k, v in overrides.items() if v not in (None, ())}
            try:
                options = load_options(options_cls, config, overrides, section=section)
                fn(options)
            except (typer.Exit, typer.Abort, click.exceptions.Exit):
                raise
            except KeyboardInterrupt:
                if verbose:
                    traceback.print_exc()
                fail("interrupted", 130)
            except ConfigError as e:
                if verbose:
                    traceback.print_exc()
                fail(str(e), 2)
            except XfError as e:
                if verbose:
                    traceback.print_exc()
                fail(str(e))
            except BrokenPipeError:  # e.g. `xf translate ... | head`
                sys.stderr.close()
                raise typer.Exit(0)
            except Exception as e:  # noqa: BLE001 - the last line of defence of a CLI
                if verbose:
                    traceback.print_exc()
                fail(f"{type(e).__name__}: {e} (run with --verbose for the traceback)")

        wrapper.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in params}
        wrapper.__name__ = fn.__name__
        wrapper.__doc__ = fn.__doc__
        app.command(name)(wrapper)
        return fn

    return decorate


@command("preprocess", PreprocessOptions, "preprocess")
def preprocess_cmd(options: PreprocessOptions) -> None:
    """Learn a joint sentencepiece BPE and binarize parallel text into memory-mapped arrays."""
    from .preprocess import preprocess

    preprocess(options)


@command("train", TrainOptions, "train")
def train_cmd(options: TrainOptions) -> None:
    """Train a Transformer (one CPU, one GPU, or many under torchrun)."""
    from .train import train

    train(options)


@command("average-checkpoints", AverageOptions, "average_checkpoints")
def average_cmd(options: AverageOptions) -> None:
    """Average the parameters of the last N checkpoints, as the paper does."""
    from .average import average_checkpoints

    average_checkpoints(options)


@command("translate", TranslateOptions, "translate")
def translate_cmd(options: TranslateOptions) -> None:
    """Translate stdin to stdout with batched beam search: one output line per input line."""
    from .translate import translate

    translate(options)


@command("export", ExportOptions, "export")
def export_cmd(options: ExportOptions) -> None:
    """Export a checkpoint for another runtime: xf export ctranslate2 --path CKPT --output DIR."""
    from .export import export_ctranslate2

    export_ctranslate2(options)


@command("score", ScoreOptions, "score")
def score_cmd(options: ScoreOptions) -> None:
    """Score hypotheses with sacreBLEU, chrF and TER (and the paper's tokenized BLEU)."""
    from .score import score

    score(options)
