"""--precision auto: bf16 where the hardware multiplies bf16 natively, fp32 elsewhere; and bf16
training on `tiny` tracking fp32 (bf16 autocast runs on any CPU, only slowly without bf16
instructions)."""

import json
import math

import pytest
import torch
import yaml

from xformer_cli import precision
from xformer_cli.options import TrainOptions
from xformer_cli.precision import cpu_bf16_instructions, resolve_precision
from xformer_cli.commands.train import train

from helpers import MICRO

CPUINFO = "processor\t: 0\nflags\t\t: fpu sse2 avx2 {extra}\nbogomips\t: 4000\n"


@pytest.mark.parametrize("extra, found", [
    ("", []),
    ("avx512f avx512bw", []),  # AVX-512 without bf16: oneDNN emulates bf16, slower than fp32
    ("avx512f avx512_bf16", ["avx512_bf16"]),
    ("amx_tile amx_bf16 avx512_bf16", ["avx512_bf16", "amx_bf16"]),
])
def test_cpu_bf16_instructions_from_cpuinfo_flags(extra, found):
    assert cpu_bf16_instructions(CPUINFO.format(extra=extra)) == found


def test_auto_is_bf16_only_with_native_bf16(monkeypatch):
    cpu = torch.device("cpu")
    for option in ("fp32", "bf16"):
        assert resolve_precision(cpu, option) == option  # named precisions are kept as asked
    monkeypatch.setattr(precision, "cpu_bf16_instructions", lambda: ["avx512_bf16"])
    assert resolve_precision(cpu, "auto") == "bf16"
    monkeypatch.setattr(precision, "cpu_bf16_instructions", lambda: [])
    assert resolve_precision(cpu, "auto") == "fp32"
    cuda = torch.device("cuda", 0)
    for capability, chosen in (((7, 0), "fp32"), ((8, 0), "bf16"), ((9, 0), "bf16")):  # V100, A100, H100
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device, c=capability: c)
        assert resolve_precision(cuda, "auto") == chosen


@pytest.mark.parametrize("flags, expected", [([], "fp32"), (["avx512_bf16"], "bf16")])
def test_auto_is_the_default_and_the_run_says_what_it_chose(data_dir, tmp_path, monkeypatch, flags, expected):
    """The CPU's flags are given (not read from this machine), so both outcomes are tested here."""
    assert TrainOptions(data="x").precision == "auto"
    monkeypatch.setattr(precision, "cpu_bf16_instructions", lambda: flags)
    kw = {**MICRO, "precision": "auto"}
    train(TrainOptions(data=str(data_dir), save_dir=str(tmp_path), max_update=1, **kw))
    assert yaml.safe_load((tmp_path / "config.yaml").read_text())["precision"] == expected
    start = [json.loads(line) for line in (tmp_path / "train_log.jsonl").read_text().splitlines()][0]
    assert start["type"] == "start" and start["options"]["precision"] == expected


@pytest.mark.slow
def test_bf16_validation_loss_tracks_fp32_on_tiny(data_dir, tmp_path):  # noqa: F811
    """Three epochs of `tiny` (no dropout): bf16 autocast's validation loss after each epoch is
    within 1% of fp32's, while training moves it by more than 10%."""
    kw = {**MICRO, "max_epoch": 3, "dropout": 0.0, "warmup_updates": 10, "lr_scheduler": "inverse_sqrt", "lr": 5e-3}
    losses = {}
    for p in ("fp32", "bf16"):
        train(TrainOptions(data=str(data_dir), save_dir=str(tmp_path / p), **{**kw, "precision": p}))
        lines = (tmp_path / p / "train_log.jsonl").read_text().splitlines()
        losses[p] = [r["loss"] for r in map(json.loads, lines) if r["type"] == "valid"]
    assert len(losses["fp32"]) == len(losses["bf16"]) == 3
    assert losses["fp32"][-1] < 0.9 * math.log(300)  # it did learn: a uniform guess over the 300 subwords scores ln 300
    for a, b in zip(losses["fp32"], losses["bf16"]):
        assert b == pytest.approx(a, rel=0.01)
