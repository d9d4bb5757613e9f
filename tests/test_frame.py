"""The command table and the rules the frame applies to every command (xformer_cli/frame.py).

Every test here iterates the table, so a command added to it is covered with no edit here: its
flags, its YAML section, its reference, and the output guard over each of its declared outputs
against each of its declared inputs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pytest
import yaml
from typer.testing import CliRunner

from xformer_cli import cli, frame
from xformer_cli.settings.config import _is_optional, field_types, option
from xformer_cli.frame import load_command_options
from xformer_cli.frame import COMMANDS, Command, Input, Output
from xformer_cli.base.errors import ConfigError
from xformer_cli.base.safety import SaveDirLock

runner = CliRunner()


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


# What an option needs beside it to be accepted (an input read only with a switch) or a value of
# its own format: the little each command asks of a hand-made invocation.
CONTEXT = {("average-checkpoints", "valid_source"): {"choose_on_valid": True},
           ("average-checkpoints", "valid_reference"): {"choose_on_valid": True},
           ("average-checkpoints", "choose_report"): {"choose_on_valid": True},
           ("translate", "confidence"): {"output_format": "jsonl"},
           ("translate", "reverse_path"): {"output_format": "jsonl"},
           ("export", "shortlist"): {"format": "bergamot"}}  # the one format that takes a shortlist
PLACEHOLDERS = {"model": ("en-de=model.pt",)}


def _placeholder(cls: type, name: str):
    if name in PLACEHOLDERS:
        return PLACEHOLDERS[name][0]
    inner = _is_optional(field_types(cls)[name])[1]
    if typing.get_origin(inner) is typing.Literal:
        return typing.get_args(inner)[0]
    return "x"


def _make_input(root: Path, spec: Input) -> tuple[str, list[Path]]:
    """An input for ``spec`` under root: the value to give its option, and the paths it names."""
    if spec.suffixes != ("",):  # a prefix: PREFIX.en, PREFIX.de
        prefix = root / f"in-{spec.option}"
        files = [Path(f"{prefix}{suffix.format(source_lang='en', target_lang='de')}") for suffix in spec.suffixes]
        for f in files:
            f.write_text(f"{spec.option} {f.name}\n")
        return str(prefix), files
    if spec.kind == "file":
        path = root / f"in-{spec.option}.txt"
        path.write_text(f"the input {spec.option}\n")
        return str(path), [path]
    path = root / f"in-{spec.option}"  # a directory, or either: a directory holds more to protect
    path.mkdir()
    (path / "part.bin").write_bytes(b"\x00\x01" + spec.option.encode())
    return str(path), [path]


def _arguments(command: Command, values: dict) -> list[str]:
    """Command-line words for the options ``values`` (positional ones first, in field order)."""
    fields = dataclasses.fields(command.options)
    words = command.words.split()
    for f in fields:
        if f.name in values and f.metadata.get("positional"):
            v = values[f.name]
            words += list(v) if isinstance(v, tuple) else [v]
    for f in fields:
        if f.name in values and not f.metadata.get("positional"):
            v = values[f.name]
            if isinstance(v, bool):
                words += [_flag(f.name)] if v else []
            else:
                for item in v if isinstance(v, tuple) else (v,):
                    words += [_flag(f.name), str(item)]
    return words


def _required(command: Command, root: Path) -> dict:
    """Values for the required options of ``command``: inputs made under root, placeholders else."""
    values = {}
    types = field_types(command.options)
    inputs = {spec.option: spec for spec in command.inputs}
    for f in dataclasses.fields(command.options):
        if f.default is not dataclasses.MISSING:
            continue
        if f.name in inputs:
            value, _ = _make_input(root, inputs[f.name])
        elif any(o.option == f.name for o in command.outputs):
            value = str(root / f"out-{f.name}")
        else:
            value = _placeholder(command.options, f.name)
        is_list = typing.get_origin(_is_optional(types[f.name])[1]) is tuple
        values[f.name] = (value,) if is_list else value
    return values


def _is_list(command: Command, name: str) -> bool:
    return typing.get_origin(_is_optional(field_types(command.options)[name])[1]) is tuple


def _tree_digest(paths: list[Path]) -> str:
    h = hashlib.sha256()
    for top in paths:
        for p in sorted([top, *top.rglob("*")] if top.is_dir() else [top]):
            h.update(str(p).encode())
            if p.is_file():
                h.update(p.read_bytes())
    return h.hexdigest()


def _hostile_cases():
    """Every command x every output x every input x {the input itself, a file inside it (a
    directory), a hard link to it (or to a file inside it), a symlink to it}."""
    for command in COMMANDS:
        for output in command.outputs:
            for spec in command.inputs:
                if spec.when:  # an input only in a mode where the outputs are not written (--verify)
                    continue
                relations = ["itself", "symlink", "hardlink"] + (["inside"] if spec.kind != "file" and spec.suffixes == ("",) else [])
                for relation in relations:
                    yield pytest.param(command, output, spec, relation,
                                       id=f"{command.words}:{output.option}={relation}-of-{spec.option}")


@pytest.mark.parametrize("command,output,spec,relation", list(_hostile_cases()))
def test_no_output_of_any_command_can_replace_its_input(tmp_path, command, output, spec, relation):
    values = _required(command, tmp_path)
    value, paths = _make_input(tmp_path, spec) if spec.option not in values else (values[spec.option], None)
    if paths is None:  # a required input, made by _required
        value = value[0] if isinstance(value, tuple) else value
        paths = [Path(value)] if spec.suffixes == ("",) else [Path(f"{value}.en"), Path(f"{value}.de")]
    values[spec.option] = (value,) if _is_list(command, spec.option) else value
    target = paths[0]
    if relation == "itself":
        hostile = target
    elif relation == "inside":
        hostile = target / "part.bin"
    elif relation == "symlink":
        hostile = tmp_path / "a-symlink"
        hostile.symlink_to(target)
    else:
        hostile = tmp_path / "a-hard-link"
        os.link(target if target.is_file() else target / "part.bin", hostile)
    values[output.option] = (str(hostile),) if _is_list(command, output.option) else str(hostile)
    for name in (spec.option, output.option):
        values.update(CONTEXT.get((command.words, name), {}))
    if "overwrite" in {f.name for f in dataclasses.fields(command.options)}:
        values["overwrite"] = True  # even with --overwrite
    before = _tree_digest(paths)
    result = runner.invoke(cli.app, _arguments(command, values))
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2, result.output
    assert len(lines) == 1 and lines[0].startswith("xf: error: ") and "the input" in lines[0], result.output
    assert _tree_digest(paths) == before


def _replaced_outputs():
    for command in COMMANDS:
        for output in command.outputs:
            if output.kind not in ("into", "locked"):
                yield pytest.param(command, output, id=f"{command.words}:{output.option}")


@pytest.mark.parametrize("command,output", list(_replaced_outputs()))
def test_a_training_checkpoint_is_never_replaced_by_any_command(tmp_path, command, output):
    save = tmp_path / "ckpt"
    save.mkdir()
    checkpoint = save / "checkpoint_3_1200.pt"
    checkpoint.write_bytes(b"weights")
    for hostile in (checkpoint, save):  # the checkpoint, and a directory that holds it
        values = _required(command, _fresh(tmp_path))
        values[output.option] = str(hostile)
        if "overwrite" in {f.name for f in dataclasses.fields(command.options)}:
            values["overwrite"] = True
        result = runner.invoke(cli.app, _arguments(command, values))
        assert result.exit_code == 2 and "training checkpoint" in result.output, result.output
        assert len(result.output.strip().splitlines()) == 1
    assert checkpoint.read_bytes() == b"weights"


def _every_output():
    for command in COMMANDS:
        for output in command.outputs:
            yield pytest.param(command, output, id=f"{command.words}:{output.option}")


@pytest.mark.parametrize("command,output", list(_every_output()))
def test_no_command_writes_into_a_running_training(tmp_path, command, output):
    save = tmp_path / "running"
    # inside it, and (but xf train's own --save-dir, which its lock guards) the save dir itself:
    # --tensorboard-logdir pointed at a running training's save dir was once accepted
    places = [save / "inside"] + ([save] if output.kind != "locked" else [])
    with SaveDirLock(save) as lock:
        lock.acquire()
        for place in places:
            values = _required(command, _fresh(tmp_path))
            values[output.option] = str(place)
            result = runner.invoke(cli.app, _arguments(command, values))
            assert result.exit_code == 2 and "of a running xf train" in result.output, result.output
    assert sorted(p.name for p in save.iterdir()) == ["train.lock"]


def _options(command: Command, values: dict):
    for name in list(values):
        values.update(CONTEXT.get((command.words, name), {}))
    return load_command_options(command.options, None, values, section=command.section)


@pytest.mark.parametrize("command,output", list(_every_output()))
def test_every_output_meets_fifos_devices_sockets_and_stdout_by_one_rule(tmp_path, command, output):
    """A file output that is a FIFO, a character device or a descriptor (/proc/self/fd/N, through
    a symlink too) passes the guard, to be written in place (fileio.output_route; test_fileio
    writes each); a directory output refuses them; a socket is refused everywhere, and ``-``
    (stdout) everywhere but where the command streams."""
    import socket

    fifo, link = tmp_path / "fifo", tmp_path / "mystdout"
    os.mkfifo(fifo)
    link.symlink_to("/proc/self/fd/1")
    is_file = output.kind in ("file", "stdout")
    for special, what in ((fifo, "a FIFO"), ("/dev/null", "a character device"), (link, None)):
        values = _required(command, _fresh(tmp_path))
        values[output.option] = str(special)
        if is_file:
            frame.check_outputs(command, _options(command, values))
        elif what:
            with pytest.raises(ConfigError, match=f"is {what}, not a directory"):
                frame.check_outputs(command, _options(command, values))
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(tmp_path / "s.sock"))
        values = _required(command, _fresh(tmp_path))
        values[output.option] = str(tmp_path / "s.sock")
        with pytest.raises(ConfigError, match="is a socket"):
            frame.check_outputs(command, _options(command, values))
    values = _required(command, _fresh(tmp_path))
    values[output.option] = "-"
    if output.kind == "stdout":
        frame.check_outputs(command, _options(command, values))
    else:
        with pytest.raises(ConfigError, match=r"-: this output is a .*; xf writes only translations and scores to "
                           "stdout"):
            frame.check_outputs(command, _options(command, values))


def _outputs_beside_inputs():
    for command in COMMANDS:
        for output in command.outputs:
            if output.kind not in ("file", "stdout"):
                continue
            for spec in command.inputs:
                if spec.kind != "file" and spec.suffixes == ("",) and not spec.when:
                    yield pytest.param(command, output, spec, id=f"{command.words}:{output.option}-in-{spec.option}")


@pytest.mark.parametrize("command,output,spec", list(_outputs_beside_inputs()))
def test_a_new_file_inside_an_input_directory_is_allowed_unless_its_name_is_read_there(tmp_path, command, output,
                                                                                       spec):
    """xf average-checkpoints --inputs ckpt --output ckpt/avg.pt (fairseq's habit): nothing to
    destroy; an existing file there, or a name that a data directory or a training reads, is refused."""
    for name, allowed in (("avg.pt", True), ("notes.txt", False), ("meta.json", False),
                          ("checkpoint_2_100.pt", False), ("train.en.bin", False)):
        values = _required(command, _fresh(tmp_path))
        value, paths = _make_input(_fresh(tmp_path), spec)
        values[spec.option] = (value,) if _is_list(command, spec.option) else value
        place = paths[0] / name
        if name == "notes.txt":
            place.write_text("mine")
        values[output.option] = str(place)
        if allowed:
            frame.check_outputs(command, _options(command, values))
        else:
            with pytest.raises(ConfigError, match="(the input|the training checkpoint)"):
                frame.check_outputs(command, _options(command, values))


@pytest.mark.parametrize("command,output", [p for p in _replaced_outputs()
                                            if "overwrite" in {f.name for f in dataclasses.fields(p.values[0].options)}])
def test_an_existing_output_needs_overwrite(tmp_path, command, output):
    values = _required(command, _fresh(tmp_path))
    existing = tmp_path / "existing"
    if output.kind == "directory":
        existing.mkdir()
        (existing / "old.txt").write_text("old")
    else:
        existing.write_text("old")
    values[output.option] = str(existing)
    result = runner.invoke(cli.app, _arguments(command, values))
    assert result.exit_code == 2 and "pass --overwrite to replace it" in result.output, result.output


_counter = iter(range(10**6))


def _fresh(root: Path) -> Path:
    d = root / f"inputs-{next(_counter)}"
    d.mkdir()
    return d


# -- the table: YAML sections, docs, a new command ------------------------------------------------
def test_one_yaml_file_holds_a_section_for_every_command(tmp_path):
    """Each command reads its own section of a file that holds every command's section."""
    chosen = {}
    for command in COMMANDS:  # one option with a default each, given a value of its own type
        f = next(f for f in dataclasses.fields(command.options)
                 if f.default not in (dataclasses.MISSING, None) and isinstance(f.default, (bool, str, int, float)))
        value = (not f.default) if isinstance(f.default, bool) else f.default
        chosen[command.section] = {f.name: value}
    config = tmp_path / "all.yaml"
    config.write_text(yaml.safe_dump(chosen))
    for command in COMMANDS:
        required = {k: v for k, v in _required(command, _fresh(tmp_path)).items()}
        options = load_command_options(command.options, config, required, section=command.section)
        (name, value), = chosen[command.section].items()
        assert getattr(options, name) == value, command.words


def test_every_command_has_a_distinct_section_and_its_declared_paths_are_options():
    assert len(set(frame.sections())) == len(COMMANDS)
    for command in COMMANDS:
        names = {f.name for f in dataclasses.fields(command.options)}
        declared = [spec.option for spec in (*command.inputs, *command.outputs)]
        assert set(declared) <= names, (command.words, set(declared) - names)
        # an option marked as a path is declared as an input or an output, so the guard sees it
        paths = {f.name for f in dataclasses.fields(command.options) if f.metadata.get("path")}
        assert paths <= set(declared), (command.words, paths - set(declared))


def test_the_manual_names_every_command():
    root = Path(__file__).resolve().parents[1]
    readme = (root / "README.md").read_text(encoding="utf-8")
    cli_md = (root / "docs" / "cli.md").read_text(encoding="utf-8")
    for command in COMMANDS:
        assert f"xf {command.words}" in readme, command.words
        assert f"`{command.section}:`" in cli_md, command.section


@dataclass(frozen=True)
class GreetOptions:
    source: str = option(help="a file to read", positional=True)
    output: str = option("greeting.txt", "the file to write")
    loud: bool = option(False, "shout")


def _greet(options: GreetOptions) -> None:
    text = Path(options.source).read_text()
    Path(options.output).write_text(text.upper() if options.loud else text)


def test_a_command_added_to_the_table_gets_flags_yaml_docs_and_the_guard(tmp_path, monkeypatch):
    greet = Command("greet", GreetOptions, _greet, "Copy a file.", inputs=(Input("source"),),
                    outputs=(Output("output"),))
    monkeypatch.setattr(frame, "COMMANDS", [*COMMANDS, greet])
    app = cli.build_app(frame.COMMANDS)
    source = tmp_path / "in.txt"
    source.write_text("hello\n")
    help_text = runner.invoke(app, ["greet", "--help"]).output
    assert "--loud" in help_text and "Copy a file." in help_text
    assert "## xf greet" in cli.options_reference(frame.COMMANDS)
    config = tmp_path / "c.yaml"
    config.write_text("greet:\n  loud: true\ntrain:\n  max_update: 3\n")
    result = runner.invoke(app, ["greet", str(source), "--output", str(tmp_path / "out.txt"), "--config", str(config)])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "out.txt").read_text() == "HELLO\n"
    result = runner.invoke(app, ["greet", str(source), "--output", str(source)])
    assert result.exit_code == 2 and "is the input" in result.output
    assert source.read_text() == "hello\n"
