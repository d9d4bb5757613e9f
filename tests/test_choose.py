"""Choosing the average and the length penalty on val (train/choose.py, xf average-checkpoints
--choose-on-valid): the candidates, the winner (the fixed rule beaten and winning), one search
reranked per lenpen equals a search with that lenpen, the report, and the refusals."""

import builtins
import json
import pathlib
from pathlib import Path

import pytest
import torch
from helpers import opts

from xformer_cli.model.checkpoint import load_checkpoint, model_from_checkpoint
from xformer_cli.train.choose import Candidate, candidate_sets, fixed_candidate, lenpen_grid, read_valid, valid_bleu
from xformer_cli.train.choose import valid_loss, valid_pairs, winner
from xformer_cli.commands.average import average_checkpoints
from xformer_cli.commands.train import train
from xformer_cli.decode.engines import XfEngine
from xformer_cli.base.errors import ConfigError, XfError
from xformer_cli.settings.options import AverageOptions, TranslateOptions
from xformer_cli.decode.translate import Stats, translate_buffer
from xformer_cli.text.vocab import load_sentencepiece


def ckpts(n):
    return [Path(f"checkpoint_1_{10 * (i + 1)}.pt") for i in range(n)]  # oldest first


# -- the pure rules ------------------------------------------------------------------------------
def test_candidates_last_n_that_exist_all_and_best_by_loss():
    paths = ckpts(6)
    losses = dict(zip(paths, [5.0, 4.0, 3.0, 3.5, 3.1, 3.2]))  # update 30 is the best alone
    found = candidate_sets(paths, last=(1, 3, 5, 8, 12), best=(2, 3), losses=losses, fixed=5)
    assert [c.name for c in found] == ["last 1", "last 3", "last 5", "all 6", "best 2", "best 3"]
    assert found[1].paths == tuple(paths[::-1][:3])  # newest first
    assert set(found[4].paths) == {paths[2], paths[4]}
    assert set(found[5].paths) == {paths[2], paths[4], paths[5]}
    assert fixed_candidate(found, 5).name == "last 5"
    # a best-N set equal to a last-N set is listed once, under its first name
    falling = dict(zip(paths, [6.0, 5.0, 4.0, 3.0, 2.0, 1.0]))
    names = [c.name for c in candidate_sets(paths, (3,), (3,), falling)]
    assert names == ["last 3", "all 6"]
    # the fixed rule is a candidate even when the grid lacks its N; one the run cannot follow is none
    assert "last 4" in [c.name for c in candidate_sets(paths, (1,), (), losses, fixed=4)]
    assert fixed_candidate(candidate_sets(paths, (1,), (), losses, fixed=9), 9) is None


def scored(*bleus):
    return [{"lenpen": lp, "bleu": b} for lp, b in zip(lenpen_grid(2.0, (0.6, 1.0, 2.0)), bleus)]


def test_winner_is_the_highest_pair_and_beats_the_fixed_rule():
    sets = [Candidate("last 3", ()), Candidate("last 5", ()), Candidate("all 8", ())]
    scores = [scored(38.0, 37.0, 37.5), scored(39.2, 38.5, 38.8), scored(39.0, 39.6, 39.1)]
    best, chosen = winner(sets, scores)
    assert (best.name, chosen["lenpen"], chosen["bleu"]) == ("all 8", 0.6, 39.6)
    assert chosen["bleu"] > scores[1][0]["bleu"]  # the fixed rule (last 5, lenpen 2.0) is beaten


def test_the_fixed_rule_wins_when_nothing_beats_it_and_ties_go_to_it():
    sets = [Candidate("last 5", ()), Candidate("all 8", ())]
    assert lenpen_grid(2.0, (0.6, 2.0, 2.5)) == [2.0, 0.6, 2.5]  # the fixed lenpen first, once
    best, chosen = winner(sets, [scored(39.2, 38.0, 39.0), scored(39.0, 39.1, 38.9)])
    assert (best.name, chosen["lenpen"]) == ("last 5", 2.0)
    best, chosen = winner(sets, [scored(39.2, 39.2, 39.2), scored(39.2, 39.2, 39.2)])  # all tied
    assert (best.name, chosen["lenpen"]) == ("last 5", 2.0)


def test_options_refuse_half_a_validation_set():
    with pytest.raises(ConfigError, match="--choose-on-valid needs --valid-source and --valid-reference"):
        average_checkpoints(AverageOptions(inputs=("d",), output="o", choose_on_valid=True, valid_source="v.en"))
    with pytest.raises(ConfigError, match="read only with --choose-on-valid"):
        AverageOptions(inputs=("d",), output="o", valid_source="v.en", valid_reference="v.de")
    with pytest.raises(ConfigError, match="--choose-lenpens must be in"):
        AverageOptions(inputs=("d",), output="o", choose_lenpens=(0.6, 11.0))


# -- on a trained micro model ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def run(trained_tiny, tmp_path_factory, one_thread):
    """12 update checkpoints (every 2 updates) of a fine-tuning of the session's trained tiny model,
    and the raw val pairs of its data (the first 20)."""
    root = trained_tiny.parent.parent
    save_dir = tmp_path_factory.mktemp("choose") / "ckpt"
    train(opts(root / "data", save_dir, arch="tiny", d_model=64, d_ff=128, heads=4, encoder_layers=2, decoder_layers=2,
               init_from=str(trained_tiny), max_update=24, save_interval_updates=2, keep_last_checkpoints=0,
               save_interval_minutes=0, max_tokens=2000, lr_scheduler="inverse_sqrt", lr=1e-3))
    val = tmp_path_factory.mktemp("val")
    for lang in ("en", "de"):
        lines = (root / "raw" / f"val.{lang}").read_text(encoding="utf-8").splitlines(keepends=True)[:20]
        (val / f"val.{lang}").write_text("".join(lines), encoding="utf-8")
    return save_dir, val / "val.en", val / "val.de"


def choose(run, out: Path, **kw):
    save_dir, src, ref = run
    options = AverageOptions(inputs=(str(save_dir),), output=str(out / "averaged.pt"), choose_on_valid=True,
                             valid_source=str(src), valid_reference=str(ref), num_update_checkpoints=5,
                             choose_lenpen=2.0, choose_last=(1, 3, 5, 8), choose_best=(3,),
                             choose_lenpens=(0.6, 1.0, 2.5), choose_report=str(out / "choice.json"), **kw)
    average_checkpoints(options)
    return json.loads((out / "choice.json").read_text())


@pytest.mark.slow
def test_the_loss_of_a_checkpoint_is_the_trainers_validation_nll(trained_tiny):
    root = trained_tiny.parent.parent
    ckpt = load_checkpoint(trained_tiny)
    model, sp = model_from_checkpoint(ckpt).eval(), load_sentencepiece(ckpt["spm_model"])
    source, reference = read_valid(str(root / "raw" / "val.en"), str(root / "raw" / "val.de"))
    logged = [json.loads(line) for line in (trained_tiny.parent / "train_log.jsonl").read_text().splitlines()]
    last = [r for r in logged if r["type"] == "valid"][-1]
    assert last["update"] == ckpt["meta"]["num_updates"]
    assert valid_loss(model, valid_pairs(sp, source, reference, 1000)) == pytest.approx(last["nll"], abs=1e-4)


@pytest.mark.slow
def test_one_search_reranked_equals_a_search_with_each_lenpen(run):
    save_dir, src, ref = run
    ckpt = load_checkpoint(next(save_dir.glob("checkpoint_*_24.pt")))
    model, sp = model_from_checkpoint(ckpt).eval(), load_sentencepiece(ckpt["spm_model"])
    source, reference = src.read_text().splitlines(), ref.read_text().splitlines()
    options = TranslateOptions(path=("x",), beam_size=4, batch_size=16, quiet=True)
    lenpens = [0.0, 0.6, 2.0, 5.0]
    reranked = valid_bleu([model], torch.device("cpu"), sp, source, reference, options, lenpens)
    import sacrebleu

    engine = XfEngine([model], torch.device("cpu"))
    direct = []
    for alpha in lenpens:
        options = TranslateOptions(path=("x",), beam_size=4, batch_size=16, lenpen=alpha, quiet=True)
        lines = [o.rstrip() for o in translate_buffer(engine, sp, source, 0, options, Stats())]
        direct.append(lines)
        assert reranked[lenpens.index(alpha)]["bleu"] == round(sacrebleu.corpus_bleu(lines, [reference]).score, 2)
    assert direct[0] != direct[-1]  # the lenpens change the outputs, so the equality above means something
    assert [s["ratio"] for s in reranked] == sorted(s["ratio"] for s in reranked)  # longer with alpha


@pytest.mark.slow
def test_the_choice_on_a_trained_run(run, tmp_path, monkeypatch):
    save_dir, src, _ = run
    test_set = src.parent / "test2016.en"
    test_set.write_text("a test sentence that must never be read\n")
    opened = []
    real_open, real_read = builtins.open, pathlib.Path.read_bytes
    monkeypatch.setattr(builtins, "open", lambda f, *a, **k: (opened.append(str(f)), real_open(f, *a, **k))[1])
    monkeypatch.setattr(pathlib.Path, "read_bytes", lambda p: (opened.append(str(p)), real_read(p))[1])
    first = choose(run, tmp_path)
    monkeypatch.undo()
    assert opened and str(src) in opened and not any("test2016" in f for f in opened)

    pairs = [(c["checkpoints"], s) for c in first["candidates"] for s in c["scores"]]
    names = [c["checkpoints"] for c in first["candidates"]]
    assert names[:5] == ["last 1", "last 3", "last 5", "last 8", "all 12"] and set(names[5:]) <= {"best 3"}
    assert all(len(c["scores"]) == 4 for c in first["candidates"])  # lenpen 2.0 (the fixed rule's), 0.6, 1.0, 2.5
    top = max(s["bleu"] for _, s in pairs)
    assert first["chosen"]["bleu"] == top >= first["fixed_rule"]["bleu"]
    assert first["fixed_rule"]["checkpoints"] == "last 5" and first["fixed_rule"]["lenpen"] == 2.0
    assert len(first["checkpoint_loss"]) == len(list(save_dir.glob("checkpoint_*_*.pt"))) >= 12
    assert first["valid"]["lines"] == 20
    # the per-checkpoint loss is the trainer's validation nll of the same checkpoint
    # averaged.pt is the mean of the chosen files
    avg = load_checkpoint(tmp_path / "averaged.pt")
    assert avg["meta"]["averaged_from"] == first["chosen"]["files"]
    key = "decoder_layers.0.ffn.fc1.weight"
    mean = sum(load_checkpoint(save_dir / f)["model"][key].double() for f in first["chosen"]["files"])
    assert torch.equal(avg["model"][key], (mean / len(first["chosen"]["files"])).float())
    # deterministic: a second run chooses the same with the same scores
    again = tmp_path / "again"
    again.mkdir()
    second = choose(run, again)
    assert second["candidates"] == first["candidates"] and second["chosen"] == first["chosen"]


@pytest.mark.slow
def test_refusals_are_one_line(run, tmp_path):
    save_dir, src, ref = run
    short = tmp_path / "short.de"
    short.write_text("".join(ref.read_text().splitlines(keepends=True)[:19]))
    with pytest.raises(XfError, match=rf"^--valid-reference {short} has 19 lines but --valid-source {src} has 20"):
        choose((save_dir, src, short), tmp_path)
    empty = tmp_path / "no-checkpoints"
    empty.mkdir()
    with pytest.raises(XfError, match="holds no checkpoint_<epoch>_<update>.pt to choose from"):
        choose((empty, src, ref), tmp_path)
    with pytest.raises(ConfigError, match="not --num-epoch-checkpoints"):
        average_checkpoints(AverageOptions(inputs=(str(save_dir),), output=str(tmp_path / "a.pt"), choose_on_valid=True,
                                           valid_source=str(src), valid_reference=str(ref), num_epoch_checkpoints=2))
    assert not (tmp_path / "averaged.pt").exists() and not (tmp_path / "choice.json").exists()
