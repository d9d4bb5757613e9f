"""xf average-checkpoints: the mean of the parameters of the last N checkpoints (paper, Sec. 6.1).

The paper averages the last 5 checkpoints of base models (written every 10 minutes) and the last
20 of big models. Checkpoints are chosen by the numbers in their names,
``checkpoint_<epoch>_<update>.pt``, never by file time (a copy or a restore changes mtimes).
Epoch-end checkpoints carry the same names; their ``meta["end_of_epoch"]`` is true.

With ``--choose-on-valid`` the set to average is not fixed but chosen on a validation set, with
the length penalty to translate with (the rules are in ``train/choose.py``): the recipes' step between
training and the test set.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Optional

import torch

from ..base.checkpoint_names import checkpoint_numbers
from ..base.console import print_summary, stderr_console
from ..base.distributed import resolve_device
from ..base.errors import ConfigError, XfError
from ..base.fileio import atomic_write_text
from ..model.checkpoint import load_checkpoint, model_from_checkpoint
from ..model.checkpoint import same_vocabulary, save_checkpoint
from ..settings.options import REGULARIZATION, AverageOptions, TranslateOptions
from ..text.languages import describe, languages_of, model_pairs
from ..text.vocab import load_sentencepiece
from ..train.choose import REPORT_VERSION, Candidate, candidate_sets, fixed_candidate, lenpen_grid, winner
from ..train.choose import read_valid, valid_bleu, valid_loss, valid_pairs

# Fields that change training, not the function the weights compute.


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
        if key not in REGULARIZATION and a.get(key) != b.get(key):
            return f"{key} {b.get(key)!r} vs {a.get(key)!r}"
    return None


class _Mean:
    """The running float64 sum of checkpoints' parameters and their mean; the first one added
    fixes the architecture, vocabulary and weight tying the others must share."""

    def __init__(self) -> None:
        self.first: dict = {}
        self.groups: list[list[str]] = []
        self.sums: dict[str, torch.Tensor] = {}
        self.used: list[tuple[Path, dict]] = []

    def add(self, path: Path, ckpt: dict) -> None:
        state = ckpt["model"]
        if not self.used:
            self.first = {**ckpt, "train_state": None}  # keep no optimizer state in memory
            self.groups = _tied_groups(state)
            self.sums = {g[0]: state[g[0]].detach().to(torch.float64) for g in self.groups
                         if state[g[0]].is_floating_point()}
        else:
            _check_compatible(self.first, ckpt, self.used[0][0], path, self.groups)
            for key in self.sums:
                self.sums[key] += state[key].detach().to(torch.float64)
        self.used.append((path, ckpt.get("meta") or {}))

    def checkpoint(self) -> dict:
        """The averaged checkpoint: the first one's configuration and vocabulary, the mean weights."""
        averaged: dict[str, torch.Tensor] = {}
        for group in self.groups:
            original = self.first["model"][group[0]]
            # Float parameters: mean in float64, stored back in their own dtype. Integer buffers
            # (none in xf's model today) cannot be averaged: the newest checkpoint's value is kept.
            value = (self.sums[group[0]] / len(self.used)).to(original.dtype) if group[0] in self.sums else original.clone()
            for key in group:  # tied keys share one averaged tensor, so they stay tied on load
                averaged[key] = value
        newest_meta = self.used[0][1]  # the newest by number, or the first file given
        return {
            **self.first,
            "model": averaged,
            "train_state": None,  # optimizer moments of one checkpoint mean nothing for the average
            "meta": {
                **languages_of(newest_meta),  # what the model translates (the same in every input)
                "epoch": newest_meta.get("epoch"),
                "num_updates": newest_meta.get("num_updates"),
                "end_of_epoch": newest_meta.get("end_of_epoch"),
                "averaged_from": [p.name for p, _ in self.used],
            },
        }

    def parameters(self) -> int:
        return sum(self.first["model"][g[0]].numel() for g in self.groups)


def average_checkpoints(options: AverageOptions) -> None:
    """Write the element-wise mean of the chosen checkpoints' parameters to options.output
    (with --choose-on-valid: of the set chosen on the validation set, ``choose_on_valid``)."""
    from rich.progress import Progress

    if options.choose_on_valid:
        return choose_on_valid(options)
    paths = select_inputs(options)
    wanted = options.num_epoch_checkpoints or len(paths)
    console = stderr_console()
    mean = _Mean()
    with Progress(console=console, transient=True, disable=not console.is_terminal) as progress:
        task = progress.add_task("averaging", total=wanted)
        for path in paths:
            if len(mean.used) == wanted:
                break
            ckpt = load_checkpoint(path)
            meta = ckpt.get("meta") or {}
            if options.num_epoch_checkpoints:
                if "end_of_epoch" not in meta:
                    raise XfError(f"{path}: its meta does not say whether it ends an epoch (no 'end_of_epoch'); "
                                  "use --num-update-checkpoints")
                if not meta["end_of_epoch"]:
                    continue  # the last checkpoint of an epoch that did not finish
            mean.add(path, ckpt)
            progress.advance(task)
            del ckpt

    if len(mean.used) < wanted:
        raise XfError(
            f"asked for the last {wanted} epoch-end checkpoints but {', '.join(options.inputs)} holds "
            f"{len(mean.used)} (checkpoint_<epoch>_<update>.pt whose meta says end_of_epoch)"
        )
    output = mean.checkpoint()
    model_from_checkpoint(output, options.output)  # the average must load as a model
    save_checkpoint(options.output, output)

    print_summary(console, "xf average-checkpoints", [
        ("averaged", f"{len(mean.used)} checkpoints"),
        ("from", ", ".join(p.name for p, _ in mean.used)),
        ("parameters", f"{mean.parameters():,}"),
        ("written", str(options.output)),
    ])


def _check_compatible(first: dict, ckpt: dict, first_path, path: Path, groups: list[list[str]]) -> None:
    """Refuse to average checkpoints of different architectures or vocabularies."""
    if not same_vocabulary(ckpt["spm_model"], first["spm_model"]):
        raise XfError(f"{path}: its vocabulary (sentencepiece model) differs from {first_path}'s; cannot average")
    ours, theirs = languages_of(ckpt.get("meta") or {}), languages_of(first.get("meta") or {})
    if ours != theirs:
        raise XfError(f"{path}: it translates {describe(ours)}, {first_path} {describe(theirs)}; cannot average")
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


# -- --choose-on-valid: the set and the length penalty chosen on a validation set (train/choose.py) ---------
def checkpoints_to_choose_from(options: AverageOptions) -> list[Path]:
    """The numbered checkpoints of --inputs, or the one line that says why there is no choice."""
    if options.num_epoch_checkpoints:
        raise ConfigError("--choose-on-valid chooses among update checkpoints; --num-update-checkpoints N "
                          "names the fixed rule (not --num-epoch-checkpoints)")
    if not options.inputs:
        raise ConfigError("give a checkpoint directory with --inputs")
    if options.valid_source is None or options.valid_reference is None:
        raise ConfigError("--choose-on-valid needs --valid-source and --valid-reference")
    numbered = numbered_checkpoints(options.inputs)
    if not numbered:
        raise XfError(f"{', '.join(options.inputs)} holds no checkpoint_<epoch>_<update>.pt to choose from")
    if model_pairs(load_checkpoint(numbered[-1]).get("meta") or {}):
        raise ConfigError(f"--choose-on-valid chooses on one direction's validation set; {numbered[-1]} is "
                          "multilingual: average with --no-choose-on-valid (the fixed rule)")
    return numbered


def choose_on_valid(options: AverageOptions) -> None:
    """Score every candidate average on the validation set, write the winner to options.output and
    the choice with every score to options.choose_report (JSON), the report last."""
    from rich.progress import Progress

    numbered = checkpoints_to_choose_from(options)
    report_path = Path(options.choose_report)  # AverageOptions resolved its default; the frame guarded it
    source, reference = read_valid(options.valid_source, options.valid_reference)
    start = time.perf_counter()
    console = stderr_console()
    device = resolve_device("auto")
    decoding = TranslateOptions(path=(str(numbered[-1]),), beam_size=options.choose_beam_size,
                                lenpen=options.choose_lenpen, batch_size=128, quiet=True)
    states: dict[Path, dict] = {}  # each checkpoint read once, its optimizer state dropped
    losses: dict[Path, float] = {}
    with Progress(console=console, transient=True, disable=not console.is_terminal) as progress:
        task = progress.add_task("validation loss of each checkpoint", total=len(numbered))
        for path in numbered:
            ckpt = load_checkpoint(path)
            states[path] = {**ckpt, "train_state": None}
            del ckpt
            model = model_from_checkpoint(states[path], path).to(device).eval()
            if path == numbered[0]:
                sp = load_sentencepiece(states[path]["spm_model"], str(path))
                pairs = valid_pairs(sp, source, reference, model.cfg.max_positions - 1)
            losses[path] = valid_loss(model, pairs)
            progress.advance(task)
        candidates = candidate_sets(numbered, options.choose_last, options.choose_best, losses,
                                    options.num_update_checkpoints)
        fixed = fixed_candidate(candidates, options.num_update_checkpoints)

        def average_of(candidate: Candidate) -> dict:
            mean = _Mean()
            for path in candidate.paths:
                mean.add(path, states[path])
            return mean.checkpoint()

        lenpens = lenpen_grid(options.choose_lenpen, options.choose_lenpens)
        task = progress.add_task("beam search of val per candidate", total=len(candidates))
        scores: list[list[dict]] = []  # per candidate, per lenpen
        for candidate in candidates:
            model = model_from_checkpoint(average_of(candidate), options.output).to(device).eval()
            scores.append(valid_bleu([model], device, sp, source, reference, decoding, lenpens))
            progress.advance(task)
    best, chosen = winner(candidates, scores)
    save_checkpoint(options.output, average_of(best))
    seconds = time.perf_counter() - start
    fixed_score = scores[candidates.index(fixed)][0] if fixed else None  # at lenpens[0], the fixed lenpen
    report = {
        "version": REPORT_VERSION,
        "chosen": {"checkpoints": best.name, **chosen, "files": [p.name for p in best.paths]},
        "fixed_rule": {"checkpoints": fixed.name, **fixed_score} if fixed else None,
        "valid": {"source": str(options.valid_source), "reference": str(options.valid_reference),
                  "lines": len(source), "beam_size": options.choose_beam_size},
        "checkpoint_loss": {p.name: round(losses[p], 4) for p in numbered},
        "candidates": [{"checkpoints": c.name, "files": [p.name for p in c.paths], "scores": per_lenpen}
                       for c, per_lenpen in zip(candidates, scores)],
        "seconds": round(seconds, 1),
        "output": str(options.output),
    }
    atomic_write_text(report_path, json.dumps(report, indent=1) + "\n")

    rows = [(c.name, "  ".join(f"{s['bleu']:6.2f}" for s in per_lenpen)) for c, per_lenpen in zip(candidates, scores)]
    rows.insert(0, ("val sacreBLEU at lenpen", "  ".join(f"{lp:6g}" for lp in lenpens)))
    rows += [
        ("chosen", f"{best.name}, lenpen {chosen['lenpen']:g}: {chosen['bleu']:.2f}"),
        ("fixed rule", f"{fixed.name}, lenpen {fixed_score['lenpen']:g}: {fixed_score['bleu']:.2f}" if fixed else "none"),
        ("time", f"{seconds:.0f} s ({len(candidates)} beam searches of val)"),
        ("written", f"{options.output}, {report_path}"),
    ]
    print_summary(console, f"xf average-checkpoints --choose-on-valid (val sacreBLEU, beam {options.choose_beam_size})", rows)
