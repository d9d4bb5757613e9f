"""bench/precision_quality.py, the bf16-against-fp32 study, end to end at a tiny size: two seeds
of each precision (bf16 forced: the machine running the test may emulate it), the tables, the resume, the refusal."""

import csv
import json

import pytest
import yaml

from xformer_cli.base import precision

from helpers import bench_module

TINY = {
    "preprocess": {"bpe_vocab_size": 300},
    "train": {"arch": "tiny", "d_model": 32, "d_ff": 64, "heads": 2, "encoder_layers": 1, "decoder_layers": 1,
              "max_positions": 256, "max_tokens": 300, "warmup_updates": 4, "lr_scheduler": "inverse_sqrt",
              "lr": 5e-3, "eval_bleu": True, "stop_time_hours": 0.5, "max_epoch": 1, "log_interval": 1,
              "threads": 1, "seed": 9},
    "translate": {"beam_size": 4, "lenpen": 2.0, "batch_size": 64, "max_len_a": 0.0, "max_len_b": 8},
}


@pytest.fixture(scope="module")
def study(raw_slice, tmp_path_factory):
    quality = bench_module("precision_quality")
    tmp = tmp_path_factory.mktemp("precision-quality")
    config = tmp / "tiny.yaml"
    config.write_text(yaml.safe_dump(TINY))
    base = ["--multi30k", str(raw_slice), "--config", str(config), "--device", "cpu", "--force-bf16"]
    return quality, tmp / "out", base


@pytest.mark.slow
def test_study_trains_each_precision_and_seed_to_the_same_update_and_compares(study):
    quality, out, base = study
    assert quality.main([*base, "--out", str(out), "--updates", "3"]) == 0
    rows = list(csv.DictReader((out / "precision_quality.csv").open()))
    assert [(r["precision"], r["seed"]) for r in rows] == [("fp32", "1"), ("fp32", "2"), ("bf16", "1"), ("bf16", "2")]
    assert {r["updates"] for r in rows} == {"3"}  # the config's max_epoch and time budget are overridden
    for r in rows:
        run = out / "runs" / f"{r['precision']}-seed{r['seed']}"
        saved = yaml.safe_load((run / "config.yaml").read_text())
        assert (saved["precision"], saved["seed"], saved["max_update"]) == (r["precision"], int(r["seed"]), 3)
        assert 0 <= float(r["beam_bleu"]) <= 100 and float(r["val_ppl"]) > 1
        assert len(r["greedy_bleu_per_epoch"].split()) >= 1  # eval_bleu's greedy BLEU at the run's end
        if r["precision"] == "fp32":  # its own evaluation in fp32 and xf train's agree
            assert float(r["fp32_eval_nll"]) == pytest.approx(float(r["val_nll"]), abs=1e-3)
    fp32 = [float(r["val_loss"]) for r in rows if r["precision"] == "fp32"]
    assert fp32[0] != fp32[1]  # the seed reached the run
    table = (out / "precision_quality.md").read_text()
    for metric in ("val loss", "val ppl", "val nll, fp32 eval", "greedy BLEU", "beam BLEU"):
        line = next(l for l in table.splitlines() if l.startswith(f"| {metric} |"))
        assert "seed noise" in line.split("|")[-2]  # a verdict: within it, or beyond it


@pytest.mark.slow
def test_a_rerun_skips_finished_runs_and_more_updates_resume_them(study):
    quality, out, base = study
    log = out / "runs" / "fp32-seed1" / "train_log.jsonl"
    if not log.exists():  # run alone: make the first study
        assert quality.main([*base, "--out", str(out), "--updates", "3"]) == 0
    before = log.read_text()
    assert quality.main([*base, "--out", str(out), "--updates", "3", "--precisions", "fp32"]) == 0
    assert log.read_text() == before  # finished: not trained again
    assert quality.main([*base, "--out", str(out), "--updates", "5", "--precisions", "fp32", "--seeds", "1"]) == 0
    starts = [json.loads(l) for l in log.read_text().splitlines() if '"type": "start"' in l]
    assert [s["update"] for s in starts] == [0, 3]  # resumed from its checkpoint at update 3
    rows = list(csv.DictReader((out / "precision_quality.csv").open()))
    assert [(r["precision"], r["updates"]) for r in rows] == [("fp32", "5")]


def test_bf16_is_refused_in_one_line_where_it_is_emulated(study, monkeypatch, capsys, tmp_path):
    quality, _, base = study
    monkeypatch.setattr(precision, "cpu_bf16_instructions", lambda: [])
    args = [a for a in base if a != "--force-bf16"]
    assert quality.main([*args, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "bf16 is emulated" in err and "--force-bf16" in err
    assert not (tmp_path / "out").exists()  # refused before anything is written
    with pytest.raises(SystemExit):
        quality.parse_args(["--out", "x", "--precisions", "fp16"])
