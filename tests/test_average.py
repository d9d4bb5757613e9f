"""xf average-checkpoints: the element-wise mean, chosen by checkpoint numbers, tied weights kept
tied, dtypes kept, and clear refusals."""

import os

import pytest
import torch
from typer.testing import CliRunner

from xformer_cli.commands.average import average_checkpoints
from xformer_cli.model.checkpoint import load_checkpoint, make_checkpoint, model_from_checkpoint, save_checkpoint
from xformer_cli.cli import app
from xformer_cli.base.errors import ConfigError, XfError
from xformer_cli.model.transformer import build_model
from xformer_cli.settings.options import AverageOptions

SPM = b"stand-in sentencepiece model"
TIED = ("encoder_embed.weight", "decoder_embed.weight", "output_proj.weight")


def write(path, seed, epoch=1, update=1, end_of_epoch=False, spm=SPM, dtype=torch.float32, meta=None, **overrides):
    torch.manual_seed(seed)
    shape = {"d_model": 16, "d_ff": 32, "heads": 2, **overrides}
    model = build_model("tiny", vocab_size=50, **shape).to(dtype)
    meta = meta if meta is not None else {"epoch": epoch, "num_updates": update, "end_of_epoch": end_of_epoch}
    save_checkpoint(path, make_checkpoint(model, spm, train_state={"optimizer": {"step": update}}, meta=meta))
    return path


def average(tmp_path, inputs, **kw):
    out = tmp_path / "averaged.pt"
    average_checkpoints(AverageOptions(inputs=tuple(map(str, inputs)), output=str(out), **kw))
    return load_checkpoint(out)


def test_two_checkpoints_average_to_their_mean(tmp_path):
    a, b = write(tmp_path / "a.pt", 1), write(tmp_path / "b.pt", 2)
    avg = average(tmp_path, [a, b])
    sa, sb = load_checkpoint(a)["model"], load_checkpoint(b)["model"]
    assert set(avg["model"]) == set(sa)
    for key, value in avg["model"].items():
        expected = ((sa[key].double() + sb[key].double()) / 2).float()
        assert value.dtype == torch.float32
        assert torch.equal(value, expected), key
    assert not torch.equal(avg["model"]["decoder_layers.0.ffn.fc1.weight"], sa["decoder_layers.0.ffn.fc1.weight"])
    # configuration and vocabulary kept, optimizer state dropped
    assert avg["model_config"] == load_checkpoint(a)["model_config"]
    assert avg["spm_model"] == SPM and avg["train_state"] is None
    assert avg["meta"]["averaged_from"] == ["a.pt", "b.pt"]
    model_from_checkpoint(avg)


def test_tied_weights_are_averaged_once_and_stay_tied(tmp_path):
    avg = average(tmp_path, [write(tmp_path / "a.pt", 1), write(tmp_path / "b.pt", 2)])
    state = avg["model"]
    assert len({state[k].untyped_storage().data_ptr() for k in TIED}) == 1
    model = model_from_checkpoint(avg)
    assert model.encoder_embed.weight is model.output_proj.weight


def test_dtype_is_kept(tmp_path):
    a = write(tmp_path / "a.pt", 1, dtype=torch.bfloat16)
    b = write(tmp_path / "b.pt", 2, dtype=torch.bfloat16)
    avg = average(tmp_path, [a, b])
    key = "encoder_layers.0.ffn.fc2.weight"
    sa, sb = load_checkpoint(a)["model"][key], load_checkpoint(b)["model"][key]
    assert avg["model"][key].dtype == torch.bfloat16
    assert torch.equal(avg["model"][key], ((sa.double() + sb.double()) / 2).to(torch.bfloat16))


def test_last_n_by_update_number_not_by_file_time(tmp_path):
    names = ["checkpoint_1_100.pt", "checkpoint_1_200.pt", "checkpoint_2_300.pt", "checkpoint_3_1000.pt"]
    for i, name in enumerate(names):
        write(tmp_path / name, seed=i, update=int(name[13:-3].split("_")[-1]))
    (tmp_path / "checkpoint_last.pt").write_bytes((tmp_path / names[0]).read_bytes())  # not numbered: ignored
    for i, name in enumerate(names):  # the oldest file gets the newest mtime
        os.utime(tmp_path / name, (1e9 - i * 1000, 1e9 - i * 1000))
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    avg = average(out_dir, [tmp_path], num_update_checkpoints=2)
    assert avg["meta"]["averaged_from"] == ["checkpoint_3_1000.pt", "checkpoint_2_300.pt"]  # 1000 > 300 as numbers
    assert avg["meta"]["num_updates"] == 1000
    key = "decoder_layers.1.self_attn.in_proj.weight"
    expected = (load_checkpoint(tmp_path / names[3])["model"][key].double() + load_checkpoint(tmp_path / names[2])["model"][key].double()) / 2
    assert torch.equal(avg["model"][key], expected.float())


def test_last_n_epoch_end_checkpoints(tmp_path):
    write(tmp_path / "checkpoint_1_50.pt", 1, epoch=1, update=50)
    write(tmp_path / "checkpoint_1_100.pt", 2, epoch=1, update=100, end_of_epoch=True)
    write(tmp_path / "checkpoint_2_150.pt", 3, epoch=2, update=150)
    write(tmp_path / "checkpoint_2_200.pt", 4, epoch=2, update=200, end_of_epoch=True)
    write(tmp_path / "checkpoint_3_230.pt", 5, epoch=3, update=230)  # stopped mid-epoch
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    avg = average(out_dir, [tmp_path], num_epoch_checkpoints=2)
    assert avg["meta"]["averaged_from"] == ["checkpoint_2_200.pt", "checkpoint_1_100.pt"]
    with pytest.raises(XfError, match="asked for the last 3 epoch-end checkpoints but .* holds 2"):
        average(out_dir, [tmp_path], num_epoch_checkpoints=3)
    write(tmp_path / "checkpoint_4_300.pt", 6, meta={"epoch": 4, "num_updates": 300})
    with pytest.raises(XfError, match="checkpoint_4_300.pt: its meta does not say whether it ends an epoch"):
        average(out_dir, [tmp_path], num_epoch_checkpoints=2)


def test_refusals(tmp_path):
    a = write(tmp_path / "checkpoint_1_1.pt", 1)
    with pytest.raises(XfError, match="architecture differs .*d_ff 64 vs 32"):
        average(tmp_path, [a, write(tmp_path / "wide.pt", 2, d_ff=64)])
    with pytest.raises(XfError, match="vocabulary .* differs"):
        average(tmp_path, [a, write(tmp_path / "other_vocab.pt", 2, spm=b"another model")])
    with pytest.raises(XfError, match="asked for the last 5 checkpoints but .* holds 1"):
        average(tmp_path, [a], num_update_checkpoints=5)
    (tmp_path / "junk.pt").write_bytes(b"junk")
    with pytest.raises(XfError, match="junk.pt: not an xf checkpoint .not a zip archive"):
        average(tmp_path, [a, tmp_path / "junk.pt"])
    torch.save({"model": {}}, tmp_path / "foreign.pt")
    with pytest.raises(XfError, match="foreign.pt: not an xf checkpoint"):
        average(tmp_path, [a, tmp_path / "foreign.pt"])
    assert not (tmp_path / "averaged.pt").exists()  # nothing written by a refusal


def test_cli_errors_are_one_line(tmp_path):
    save = tmp_path / "ck"
    save.mkdir()
    a, out = write(save / "checkpoint_1_1.pt", 1), tmp_path / "o.pt"
    result = runner_invoke(["--inputs", str(save), "--num-update-checkpoints", "3", "--output", str(out)])
    assert result.exit_code == 1 and "asked for the last 3 checkpoints" in result.output
    result = runner_invoke(["--inputs", str(save), "--output", str(out)])
    assert result.exit_code == 2 and "is a directory" in result.output
    result = runner_invoke(["--inputs", str(a), "--num-update-checkpoints", "1", "--num-epoch-checkpoints", "1",
                            "--output", str(out)])
    assert result.exit_code == 2 and "give one of" in result.output
    result = runner_invoke(["--inputs", str(save), "--num-update-checkpoints", "1", "--output", str(out)])
    assert result.exit_code == 0, result.output
    assert load_checkpoint(out)["meta"]["averaged_from"] == ["checkpoint_1_1.pt"]


def runner_invoke(args):
    return CliRunner().invoke(app, ["average-checkpoints", *args])


def test_output_is_never_an_input_nor_a_training_checkpoint(tmp_path, monkeypatch):
    """The frame's guard (tests/test_frame.py covers every command) as an averaging user meets it."""
    save = tmp_path / "ck"
    save.mkdir()
    a, b = write(save / "checkpoint_1_1.pt", 1), write(save / "checkpoint_1_2.pt", 2)
    write(save / "checkpoint_last.pt", 3)
    (tmp_path / "link.pt").symlink_to(a)
    before = {p.name: p.read_bytes() for p in save.iterdir()}
    monkeypatch.chdir(tmp_path)
    for output, inputs, message in (("ck/checkpoint_1_1.pt", [a, b], "is the input"),
                                    ("link.pt", [a, b], "is the input"),
                                    ("ck/checkpoint_9_9.pt", [save], "lies inside the input"),  # a name train writes
                                    ("ck/checkpoint_last.pt", [a, b], "is the training checkpoint")):
        args = [x for p in inputs for x in ("--inputs", str(p))] + ["--output", output]
        result = runner_invoke(args + (["--num-update-checkpoints", "2"] if inputs == [save] else []))
        assert result.exit_code == 2 and message in result.output, result.output
    assert {p.name: p.read_bytes() for p in save.iterdir()} == before
    result = runner_invoke(["--inputs", str(a), "--inputs", str(b), "--output", "avg.pt"])
    assert result.exit_code == 0, result.output
    assert load_checkpoint(tmp_path / "avg.pt")["meta"]["averaged_from"] == ["checkpoint_1_1.pt", "checkpoint_1_2.pt"]
    assert {p.name: p.read_bytes() for p in save.iterdir()} == before
    # fairseq's habit, a new file beside the checkpoints it averages: nothing to destroy, written
    result = runner_invoke(["--inputs", str(save), "--num-update-checkpoints", "2", "--output", "ck/avg.pt"])
    assert result.exit_code == 0, result.output
    assert {p.name: p.read_bytes() for p in save.iterdir() if p.name != "avg.pt"} == before


def test_the_average_keeps_what_the_model_translates_and_refuses_mixing_languages(tmp_path):
    multi = {"epoch": 1, "num_updates": 1, "end_of_epoch": False, "source_lang": "src", "target_lang": "tgt",
             "pairs": ["en-de", "en-fr"]}
    a, b = write(tmp_path / "a.pt", 1, meta=multi), write(tmp_path / "b.pt", 2, meta={**multi, "num_updates": 2})
    meta = average(tmp_path, [a, b])["meta"]
    assert (meta["pairs"], meta["source_lang"], meta["target_lang"]) == (["en-de", "en-fr"], "src", "tgt")
    bilingual = write(tmp_path / "c.pt", 3, meta={"epoch": 1, "num_updates": 3, "source_lang": "en", "target_lang": "de"})
    assert average(tmp_path, [bilingual])["meta"]["target_lang"] == "de"
    with pytest.raises(XfError, match="c.pt: it translates en-de, .*a.pt en-de, en-fr; cannot average"):
        average(tmp_path, [a, bilingual])
    other = write(tmp_path / "d.pt", 4, meta={**multi, "pairs": ["en-de", "de-en"]})
    with pytest.raises(XfError, match="d.pt: it translates en-de, de-en"):
        average(tmp_path, [a, other])


def test_choosing_on_valid_is_one_directions_and_refuses_a_multilingual_model(tmp_path):
    multi = {"epoch": 1, "num_updates": 1, "end_of_epoch": False, "pairs": ["en-de", "en-fr"]}
    (tmp_path / "ck").mkdir()
    write(tmp_path / "ck" / "checkpoint_1_1.pt", 1, meta=multi)
    for name in ("val.en", "val.de"):
        (tmp_path / name).write_text("a\n")
    with pytest.raises(ConfigError, match="multilingual: average with --no-choose-on-valid"):
        average(tmp_path, [tmp_path / "ck"], choose_on_valid=True, valid_source=str(tmp_path / "val.en"),
                valid_reference=str(tmp_path / "val.de"))
    assert not (tmp_path / "averaged.pt").exists()
