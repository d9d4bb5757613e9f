"""xf average-checkpoints: the mean of the parameters of the last N checkpoints (paper, Sec. 6.1).

The paper averages the last 5 checkpoints of base models (written every 10 minutes) and the last
20 of big models. Checkpoints are chosen by the numbers in their names,
``checkpoint_<epoch>_<update>.pt``, never by file time (a copy or a restore changes mtimes).
Epoch-end checkpoints carry the same names; their ``meta["end_of_epoch"]`` is true.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch

from ..checkpoint import checkpoint_numbers, is_training_checkpoint, load_checkpoint, model_from_checkpoint
from ..checkpoint import same_vocabulary, save_checkpoint
from ..console import print_summary, stderr_console
from ..errors import ConfigError, XfError
from ..options import AverageOptions
from ..safety import refuse_overwriting_inputs

# Fields that change training, not the function the weights compute.
TRAINING_ONLY_FIELDS = ("dropout", "attention_dropout", "activation_dropout")


def numbered_checkpoints(inputs: tuple[str, ...]) -> list[Path]:
    """Every checkpoint_<epoch>_<update>.pt in the input directories and among the input files,
    oldest first by (update, epoch)."""
    found: set[Path] = set()
    for name in inputs:
        path = Path(name)
        if path.is_dir():
            found.update(p for p in path.iterdir() if checkpoint_numbers(p) and p.is_file())
        elif path.is_file():
            if checkpoint_numbers(path) is None:
                raise XfError(
                    f"{path}: cannot tell its update number; --num-*-checkpoints picks files named "
                    "checkpoint_<epoch>_<update>.pt (give files alone to average exactly those)"
                )
            found.add(path)
        else:
            raise XfError(f"{path}: no such file or directory")
    return sorted(found, key=lambda p: (checkpoint_numbers(p)[1], checkpoint_numbers(p)[0], p.name))


def select_inputs(options: AverageOptions) -> list[Path]:
    """The files to average, in the order they are read (newest first when chosen by number)."""
    n_update, n_epoch = options.num_update_checkpoints, options.num_epoch_checkpoints
    if n_update < 0 or n_epoch < 0 or (n_update and n_epoch):
        raise ConfigError("give one of --num-update-checkpoints N or --num-epoch-checkpoints N (N > 0)")
    if not options.inputs:
        raise ConfigError("give checkpoint files or a checkpoint directory with --inputs")
    if n_update:
        candidates = numbered_checkpoints(options.inputs)
        if len(candidates) < n_update:
            raise XfError(
                f"asked for the last {n_update} checkpoints but {', '.join(options.inputs)} holds "
                f"{len(candidates)} checkpoint_<epoch>_<update>.pt"
            )
        return candidates[::-1][:n_update]
    if n_epoch:
        # Only the last checkpoint of each epoch can be its epoch-end checkpoint; meta confirms it.
        last_of_epoch: dict[int, Path] = {}
        for path in numbered_checkpoints(options.inputs):
            last_of_epoch[checkpoint_numbers(path)[0]] = path
        return [last_of_epoch[e] for e in sorted(last_of_epoch, reverse=True)]
    paths = [Path(p) for p in options.inputs]
    for path in paths:
        if path.is_dir():
            raise ConfigError(f"{path} is a directory: say how many checkpoints to average with "
                              "--num-update-checkpoints N or --num-epoch-checkpoints N")
    if len(set(paths)) != len(paths):
        raise ConfigError("the same checkpoint is given twice")
    return paths


def check_output(options: AverageOptions, inputs: list[Path]) -> None:
    """Never write over an input; over a checkpoint xf train resumes from only with --overwrite."""
    refuse_overwriting_inputs(options.output, inputs)
    output = Path(options.output)
    if output.exists() and is_training_checkpoint(output) and not options.overwrite:
        raise XfError(f"--output {output} is a training checkpoint (xf train resumes from checkpoint_last.pt, and "
                      "an average has no optimizer state); pass --overwrite to replace it anyway")


def _tied_groups(state: dict[str, torch.Tensor]) -> list[list[str]]:
    """Keys of the state dict grouped by the tensor they share (tied embeddings: one group)."""
    groups: dict[tuple, list[str]] = {}
    for key, t in state.items():
        ident = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride()) if t.numel() else (key,)
        groups.setdefault(ident, []).append(key)
    return list(groups.values())


def _same_architecture(a: dict, b: dict) -> Optional[str]:
    """The first model configuration field (other than dropout rates) on which a and b differ."""
    for key in sorted(set(a) | set(b)):
        if key not in TRAINING_ONLY_FIELDS and a.get(key) != b.get(key):
            return f"{key} {b.get(key)!r} vs {a.get(key)!r}"
    return None


def average_checkpoints(options: AverageOptions) -> None:
    """Write the element-wise mean of the chosen checkpoints' parameters to options.output."""
    from rich.progress import Progress

    paths = select_inputs(options)
    check_output(options, paths)
    wanted = options.num_epoch_checkpoints or len(paths)
    console = stderr_console()
    sums: dict[str, torch.Tensor] = {}
    groups: list[list[str]] = []
    first: dict = {}
    used: list[tuple[Path, dict]] = []
    with Progress(console=console, transient=True, disable=not console.is_terminal) as progress:
        task = progress.add_task("averaging", total=wanted)
        for path in paths:
            if len(used) == wanted:
                break
            ckpt = load_checkpoint(path)
            meta = ckpt.get("meta") or {}
            if options.num_epoch_checkpoints:
                if "end_of_epoch" not in meta:
                    raise XfError(f"{path}: its meta does not say whether it ends an epoch (no 'end_of_epoch'); "
                                  "use --num-update-checkpoints")
                if not meta["end_of_epoch"]:
                    continue  # the last checkpoint of an epoch that did not finish
            state = ckpt["model"]
            if not used:
                first = {**ckpt, "train_state": None}  # keep no optimizer state in memory
                groups = _tied_groups(state)
                sums = {g[0]: state[g[0]].detach().to(torch.float64) for g in groups if state[g[0]].is_floating_point()}
            else:
                _check_compatible(first, ckpt, used[0][0], path, groups)
                for key in sums:
                    sums[key] += state[key].detach().to(torch.float64)
            used.append((path, meta))
            progress.advance(task)
            del ckpt, state

    if len(used) < wanted:
        raise XfError(
            f"asked for the last {wanted} epoch-end checkpoints but {', '.join(options.inputs)} holds "
            f"{len(used)} (checkpoint_<epoch>_<update>.pt whose meta says end_of_epoch)"
        )
    averaged: dict[str, torch.Tensor] = {}
    for group in groups:
        original = first["model"][group[0]]
        # Float parameters: mean in float64, stored back in their own dtype. Integer buffers
        # (none in xf's model today) cannot be averaged: the newest checkpoint's value is kept.
        value = (sums[group[0]] / len(used)).to(original.dtype) if group[0] in sums else original.clone()
        for key in group:  # tied keys share one averaged tensor, so they stay tied on load
            averaged[key] = value
    newest_meta = used[0][1]  # the newest by number, or the first file given
    output = {
        **first,
        "model": averaged,
        "train_state": None,  # optimizer moments of one checkpoint mean nothing for the average
        "meta": {
            "epoch": newest_meta.get("epoch"),
            "num_updates": newest_meta.get("num_updates"),
            "end_of_epoch": newest_meta.get("end_of_epoch"),
            "averaged_from": [p.name for p, _ in used],
        },
    }
    model_from_checkpoint(output, options.output)  # the average must load as a model
    save_checkpoint(options.output, output)

    print_summary(console, "xf average-checkpoints", [
        ("averaged", f"{len(used)} checkpoints"),
        ("from", ", ".join(p.name for p, _ in used)),
        ("parameters", f"{sum(averaged[g[0]].numel() for g in groups):,}"),
        ("written", str(options.output)),
    ])


def _check_compatible(first: dict, ckpt: dict, first_path, path: Path, groups: list[list[str]]) -> None:
    """Refuse to average checkpoints of different architectures or vocabularies."""
    if not same_vocabulary(ckpt["spm_model"], first["spm_model"]):
        raise XfError(f"{path}: its vocabulary (sentencepiece model) differs from {first_path}'s; cannot average")
    diff = _same_architecture(first["model_config"], ckpt["model_config"])
    if diff:
        raise XfError(f"{path}: its architecture differs from {first_path}'s ({diff}); cannot average")
    state, ref = ckpt["model"], first["model"]
    if set(state) != set(ref):
        missing = sorted(set(ref) ^ set(state))
        raise XfError(f"{path}: its parameters differ from {first_path}'s ({', '.join(missing[:3])}); cannot average")
    if _tied_groups(state) != groups:
        raise XfError(f"{path}: its weight tying differs from {first_path}'s; cannot average")
    for key in ref:
        if state[key].shape != ref[key].shape or state[key].dtype != ref[key].dtype:
            raise XfError(
                f"{path}: parameter {key} is {tuple(state[key].shape)} {state[key].dtype}, "
                f"{tuple(ref[key].shape)} {ref[key].dtype} in {first_path}; cannot average"
            )
