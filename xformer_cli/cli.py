"""The ``xf`` command: a thin Typer front end over one library function per subcommand.

Flags are generated from the options dataclasses in ``settings/options.py``, so every flag has a YAML key
of the same name (``--config FILE``) and flags win over YAML. A list option takes its values
space-separated as fairseq's (``--adam-betas 0.9 0.98``), repeated (``--ref a --ref b``) or as a
YAML list. Errors, usage errors included, are one line on stderr (``xf: error: ...``) and a
non-zero exit (2 for usage and configuration errors); ``--verbose`` shows the traceback.
SIGTERM, like Ctrl-C, unwinds the command, so that it removes its temporary files on the way out.
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
import traceback
import typing
from pathlib import Path
from typing import Annotated, Any, Optional

import click
import typer

from . import __version__
from .base.errors import ConfigError, memory_detail, out_of_memory
from .base.errors import XfError
from .base.signals import Terminated, sigterm_unwinds
from .frame import COMMANDS, GROUPS, Command, check_outputs, load_command_options
from .settings.config import _is_optional, field_types, removed

try:  # typer >= 0.22 raises the exceptions of its own copy of click
    from typer._click.exceptions import ClickException as _TyperClickException
except ImportError:  # pragma: no cover - older typer uses click itself
    _TyperClickException = click.ClickException
USAGE_ERRORS = (click.ClickException, _TyperClickException)


def _one_line(text: str) -> str:
    return " ".join(text.split())


class XfGroup(typer.core.TyperGroup):
    """The ``xf`` command group: click's usage errors (unknown option, extra argument, missing
    value, unknown command) become the one-line ``xf: error: ...`` of every other error."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        words = sys.argv[1:] if args is None else list(args)
        for i, word in enumerate(words):  # a removed flag or value: what replaces it, not "no such option"
            name, _, value = word.partition("=")
            if word.startswith("--"):
                gone = removed(name[2:], value or (words[i + 1] if i + 1 < len(words) else None))
                if gone:
                    typer.echo(f"xf: error: {gone}", err=True)
                    if not standalone_mode:
                        raise click.UsageError(gone)
                    sys.exit(2)
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except USAGE_ERRORS as e:
            if type(e).__name__ == "NoArgsIsHelpError":  # `xf` alone: the help, as asked for
                e.show()
            else:
                ctx = getattr(e, "ctx", None)
                if ctx is not None:
                    where = ctx.command_path
                else:  # some errors do not say which command: the first word that names one
                    words = sys.argv[1:] if args is None else list(args)
                    where = " ".join(["xf", *[w for w in words if w in self.commands][:1]])
                typer.echo(f"xf: error: {_one_line(e.format_message())} (see '{where} --help')", err=True)
            if not standalone_mode:
                raise
            sys.exit(e.exit_code)
        except typer.Abort:
            if not standalone_mode:
                raise
            typer.echo("xf: error: aborted", err=True)
            sys.exit(1)
        if not standalone_mode:
            return code
        sys.exit(code if isinstance(code, int) else 0)


def spread_list_values(args: list[str], lists: dict[str, type]) -> list[str]:
    """``--inputs a b c`` -> ``--inputs a --inputs b --inputs c``: click takes one value per flag.

    ``lists`` maps each list option's flag to its item type. Its values run until the next flag;
    a number list also stops at the first word that is not a number, so ``--adam-betas 0.9 0.98
    data-bin`` leaves ``data-bin`` as the positional argument (and ``-0.5`` is a value).
    """
    out, i = [], 0
    while i < len(args):
        arg = args[i]
        out.append(arg)
        i += 1
        if arg == "--":
            out += args[i:]
            break
        name = arg.split("=", 1)[0]
        item = lists.get(name)
        if item is None:
            continue
        if "=" not in arg and i < len(args):  # the first value goes with the flag, as click reads it
            out.append(args[i])
            i += 1
        while i < len(args) and _is_value(args[i], item):
            out += [name, args[i]]
            i += 1
    return out


def _is_value(word: str, item: type) -> bool:
    if item in (int, float):
        try:
            item(word)
        except ValueError:
            return False
        return True
    return not word.startswith("-")


class XfCommand(typer.core.TyperCommand):
    """A subcommand whose list options also take space-separated values."""

    list_options: dict[str, type] = {}  # flag -> item type, set per command by ``command``

    def parse_args(self, ctx, args):
        return super().parse_args(ctx, spread_list_values(list(args), self.list_options))


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"xf {__version__}")
        raise typer.Exit()


def main(
    version: Annotated[
        bool, typer.Option("--version", callback=_version_callback, is_eager=True, help="Show the version.")
    ] = False,
) -> None:
    """xf: neural machine translation with the Transformer of Vaswani et al. (2017)."""


def fail(message: str, code: int = 1) -> typing.NoReturn:
    typer.echo(f"xf: error: {_one_line(message)}", err=True)  # one line, whatever the message held
    raise typer.Exit(code)


def _parameter(f: dataclasses.Field, tp: Any) -> inspect.Parameter:
    """The Typer parameter of one options field: every flag defaults to None (= not given)."""
    optional, inner = _is_optional(tp)
    meta = f.metadata
    default = None if f.default is dataclasses.MISSING else f.default
    help_text = meta.get("help", "")
    if f.default is dataclasses.MISSING:
        help_text += "  [required: here or in --config]"
    elif default not in (None, ()):
        shown = " ".join(map(str, default)) if isinstance(default, tuple) else str(default)
        if inner is bool:
            shown = "on" if default else "off"
        help_text += f"  [default: {shown}]"
    kwargs: dict[str, Any] = {"help": help_text, "show_default": False}
    origin = typing.get_origin(inner)
    if origin is tuple:
        item = typing.get_args(inner)[0]
        annotation = Optional[list[item]]
        kwargs["metavar"] = f"<{item.__name__}>..."
    else:
        annotation = Optional[inner]
    flag = "--" + f.name.replace("_", "-")
    if meta.get("positional"):
        kwargs["metavar"] = f.name.upper()  # click adds "..." to a list
        info = typer.Argument(**kwargs)
    elif inner is bool:
        info = typer.Option(f"{flag}/--no-{flag[2:]}", **kwargs)
    else:
        names = [flag] + ["--" + a.replace("_", "-") for a in meta.get("aliases", ())]
        names += [meta["short"]] if "short" in meta else []
        info = typer.Option(*names, **kwargs)
    return inspect.Parameter(
        f.name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Annotated[annotation, info]
    )


def _list_flags(options_cls: type, types_by_name: dict[str, Any]) -> dict[str, type]:
    """The flags of the list (tuple) options of ``options_cls``, with their item types."""
    lists = {}
    for f in dataclasses.fields(options_cls):
        inner = _is_optional(types_by_name[f.name])[1]
        if typing.get_origin(inner) is tuple and not f.metadata.get("positional"):
            lists["--" + f.name.replace("_", "-")] = typing.get_args(inner)[0]
    return lists


def _failure(e: BaseException) -> tuple[str, int]:
    """The one line and the exit status of a command that failed with ``e``."""
    if isinstance(e, KeyboardInterrupt):
        return "interrupted", 130
    if isinstance(e, Terminated):
        return f"stopped by {e}", 128 + e.signum
    if isinstance(e, XfError):  # ConfigError: a usage or configuration error, 2
        return str(e), 2 if isinstance(e, ConfigError) else 1
    if out_of_memory(e):
        return f"out of memory ({memory_detail(e)}); lower the batch size (--max-tokens) and try again", 1
    return f"{type(e).__name__}: {e} (run with --verbose for the traceback)", 1


def register(command: Command, parent: typer.Typer) -> None:
    """Register ``command`` of the table under ``parent`` with flags generated from its options
    class; the frame loads its options (YAML section, then flags), applies the output guard, runs
    it, and turns every error into one line."""
    options_cls = command.options
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
            options = load_command_options(options_cls, config, overrides, section=command.section)
            check_outputs(command, options)
            with sigterm_unwinds():
                command.function()(options)
        except (typer.Exit, typer.Abort, click.exceptions.Exit):
            raise
        except BrokenPipeError:  # e.g. `xf translate ... | head`
            sys.stderr.close()
            raise typer.Exit(0)
        except (Exception, KeyboardInterrupt, Terminated) as e:  # noqa: BLE001 - the last line of defence of a CLI
            if verbose:
                traceback.print_exc()
            fail(*_failure(e))

    wrapper.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in params}
    wrapper.__name__ = command.section
    wrapper.__doc__ = command.summary
    lists = _list_flags(options_cls, types_by_name)
    name = command.words.split()[-1]
    parent.command(name, cls=type("XfCommand", (XfCommand,), {"list_options": lists}), help=command.summary)(wrapper)


def build_app(commands: list[Command]) -> typer.Typer:
    """The ``xf`` application: every command of the table, groups (``xf plot ...``) made as needed."""
    root = typer.Typer(
        name="xf",
        cls=XfGroup,
        help="xf: neural machine translation with the Transformer of Vaswani et al. (2017).",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
        rich_markup_mode=None,
        context_settings={"help_option_names": ["-h", "--help"]},
    )
    root.callback()(main)
    groups: dict[str, typer.Typer] = {}
    for command in commands:
        *group, _ = command.words.split()
        parent = root
        if group:
            if group[0] not in groups:
                groups[group[0]] = typer.Typer(name=group[0], help=GROUPS.get(group[0], ""), no_args_is_help=True,
                                               context_settings={"help_option_names": ["-h", "--help"]})
                root.add_typer(groups[group[0]])
            parent = groups[group[0]]
        register(command, parent)
    return root


app = build_app(COMMANDS)


def options_reference(commands: Optional[list[Command]] = None) -> str:
    """docs/options.md: every option of every command, generated from the options classes (the
    source of the flags, YAML keys and --help), so that the reference cannot drift from the code.
    ``make docs`` writes it; tests/test_docs.py fails when the file is stale."""
    from .settings.config import describe_type

    out = ["# Options", "",
           "Every option of every `xf` command: its flag, its YAML key (in the command's section of a "
           "`--config` file, or flat), its type (with the range of a number: every number outside it is "
           "refused before anything is written), default and help. Generated from `xformer_cli/settings/options.py` "
           "by `make docs`; do not edit by hand. Every command also takes `--config FILE` (YAML; flags win) "
           "and `--verbose` (tracebacks on errors).", "",
           "Outputs, for every command alike: an output that is, holds or lies inside one of the command's inputs "
           "(symlinks and hard links seen through), the save dir of a running `xf train`, or a training checkpoint "
           "(`checkpoint_last.pt`, `checkpoint_best.pt`, `checkpoint_<epoch>_<update>.pt`, or a directory holding "
           "one) is refused before anything is read, `--overwrite` or not; `--overwrite` replaces an existing output "
           "atomically (the new one is complete before the old one goes).", ""]
    commands = COMMANDS if commands is None else commands
    out += [f"- [`xf {c.words}`](#xf-{c.words.replace(' ', '-')})" for c in commands] + [""]
    for c in commands:
        words, options_cls, section, summary = c.words, c.options, c.section, c.summary
        out += [f"## xf {words}", "", summary, "", f"YAML section: `{section}:`", "",
                "| flag | YAML key | type | default | help |", "|---|---|---|---|---|"]
        types_by_name = field_types(options_cls)
        for f in dataclasses.fields(options_cls):
            meta = f.metadata
            inner = _is_optional(types_by_name[f.name])[1]
            if meta.get("positional"):
                flag = f.name.upper() + " (argument)"
            elif inner is bool:
                flag = f"--{f.name.replace('_', '-')} / --no-{f.name.replace('_', '-')}"
            else:
                flag = ", ".join(["--" + n.replace("_", "-") for n in (f.name, *meta.get("aliases", ()))]
                                 + ([meta["short"]] if "short" in meta else []))
            if f.default is dataclasses.MISSING:
                default = "required"
            elif f.default is None or f.default == ():
                default = "-"
            elif isinstance(f.default, tuple):
                default = " ".join(map(str, f.default))
            elif inner is bool:
                default = "on" if f.default else "off"
            else:
                default = str(f.default)
            kind = describe_type(types_by_name[f.name]) + (f" in {meta['range']}" if meta.get("range") else "")
            cells = [f"`{flag}`", f"`{f.name}`", kind, default, meta.get("help", "")]
            out.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
        out.append("")
    return "\n".join(out)
