"""YAML + flag options: flags win, unknown keys and wrong types fail with the nearest name."""

import pytest

from xformer_cli.settings.config import load_options, to_dict
from xformer_cli.frame import load_command_options
from xformer_cli.base.errors import ConfigError
import dataclasses

from xformer_cli.settings.options import ModelConfig, PreprocessOptions, TrainOptions, TranslateOptions


def write(tmp_path, text):
    path = tmp_path / "opts.yaml"
    path.write_text(text)
    return path


def test_yaml_then_flags(tmp_path):
    cfg = write(tmp_path, "data: d\nmax_tokens: 2000\narch: small\nadam-betas: [0.9, 0.997]\n")
    opts = load_command_options(TrainOptions, cfg, {"max_tokens": 3000}, section="train")
    assert opts.max_tokens == 3000  # the flag wins
    assert opts.arch == "small"
    assert opts.adam_betas == (0.9, 0.997)
    assert opts.warmup_updates == 4000  # the default stays


def test_sectioned_file(tmp_path):
    cfg = write(tmp_path, "train:\n  data: d\n  max_update: 7\ntranslate:\n  beam: 5\n  path: [a.pt]\n")
    assert load_command_options(TrainOptions, cfg, section="train").max_update == 7
    assert load_command_options(TranslateOptions, cfg, section="translate").beam_size == 5


def test_unknown_key_names_the_nearest(tmp_path):
    cfg = write(tmp_path, "data: d\nmax_token: 10\n")
    with pytest.raises(ConfigError, match=r"unknown option 'max_token' \(did you mean 'max_tokens'\?\)"):
        load_options(TrainOptions, cfg)


def test_unknown_section(tmp_path):
    cfg = write(tmp_path, "train: {data: d}\ntranslat: {beam: 2}\n")
    with pytest.raises(ConfigError, match="did you mean 'translate'"):
        load_command_options(TrainOptions, cfg, section="train")


@pytest.mark.parametrize("text,nearest", [
    ("trian: {data: d}\n", "train"),  # the only section, misspelled: not read as an unknown option
    ("transalte:\n  beam: 2\n", "translate"),
    ("average: {output: a.pt}\n", "average_checkpoints"),
    ("preprocess: {seed: 2}\ntrian: {data: d}\n", "train"),
])
def test_misspelled_section_names_the_nearest_section(tmp_path, text, nearest):
    with pytest.raises(ConfigError, match=rf"unknown section '\w+' \(did you mean '{nearest}'\?\)"):
        load_command_options(TrainOptions, write(tmp_path, text), section="train")


@pytest.mark.parametrize(
    "text,pattern",
    [
        ("data: d\nmax_tokens: many\n", "expected int"),
        ("data: d\ndropout: yes\n", "expected float"),
        ("data: d\nprecision: fp8\n", "not one of"),
        ("data: d\nmax_tokens: true\n", "expected int"),
    ],
)
def test_wrong_types(tmp_path, text, pattern):
    with pytest.raises(ConfigError, match=pattern):
        load_options(TrainOptions, write(tmp_path, text))


def test_invalid_yaml_names_file_and_line(tmp_path):
    cfg = write(tmp_path, "data: d\nmax_tokens: [1,\n")
    with pytest.raises(ConfigError, match=r"opts.yaml: line \d+ invalid YAML"):
        load_options(TrainOptions, cfg)


def test_missing_required():
    with pytest.raises(ConfigError, match="missing required option 'data'"):
        load_options(TrainOptions, None, {})


def test_to_dict_round_trips():
    opts = load_options(TrainOptions, None, {"data": "d", "lr_scheduler": "inverse_sqrt", "lr": 5e-4})
    assert load_options(TrainOptions, None, to_dict(opts)) == opts


def test_every_model_option_is_a_train_option_declared_once():
    """TrainOptions' model overrides are generated from ModelConfig: same names, None by default."""
    train_fields = {f.name: f for f in dataclasses.fields(TrainOptions)}
    model_names = [f.name for f in dataclasses.fields(ModelConfig) if f.name != "vocab_size"]
    assert all(train_fields[name].default is None for name in model_names)
    opts = load_options(TrainOptions, None, {"data": "d", "max_positions": 256, "normalize_before": True})
    assert opts.max_positions == 256 and opts.normalize_before is True and opts.d_model is None


@pytest.mark.parametrize("cls,values,pattern", [
    (TrainOptions, {"data": "d", "max_tokens": 0}, "--max-tokens must be at least 1, got 0"),
    (TrainOptions, {"data": "d", "label_smoothing": 1.0}, r"--label-smoothing must be in \[0, 1\)"),
    (TrainOptions, {"data": "d", "dropout": 1.5}, r"--dropout must be in \[0, 1\)"),
    (TrainOptions, {"data": "d", "heads": 7}, "d_model 512 is not divisible by heads 7"),
    (TrainOptions, {"data": "d", "arch": "huge"}, "unknown arch 'huge'"),
    (TrainOptions, {"data": "d", "lr": 2.0}, "--lr is the peak of --lr-scheduler inverse_sqrt"),
    (TrainOptions, {"data": "d", "lr_scheduler": "inverse_sqrt", "lr": 1e-3, "lr_factor": 2.0}, "--lr-factor scales noam"),
    (TrainOptions, {"data": "d", "weight_decay": 0.01}, "use --optimizer adamw"),
    (PreprocessOptions, {"destdir": "x", "trainpref": "t", "workers": 0}, "--workers must be at least 1"),
    (TrainOptions, {"data": "d", "patience_epsilon": -0.1}, "--patience-epsilon must not be negative"),
    (TrainOptions, {"data": "d", "patience_epsilon": float("nan")}, "--patience-epsilon must be a finite number"),
])
def test_impossible_values_are_one_line_config_errors_naming_the_file(tmp_path, cls, values, pattern):
    import yaml

    cfg = write(tmp_path, yaml.safe_dump(values))
    with pytest.raises(ConfigError, match=pattern) as e:
        load_options(cls, cfg)
    assert str(e.value).startswith(f"{cfg}: ") and "\n" not in str(e.value)
def test_old_decoding_names_are_aliases(tmp_path):
    cfg = write(tmp_path, "beam: 5\ntopk: 7\ntopp: 0.5\npath: [a.pt]\n")
    opts = load_options(TranslateOptions, cfg)
    assert (opts.beam_size, opts.top_k, opts.top_p) == (5, 7, 0.5)
    assert load_options(TranslateOptions, None, {"path": ("a",), "beam_size": 3}).beam_size == 3


def test_decoding_options_are_checked_once():
    from xformer_cli.settings.options import DecodingOptions

    with pytest.raises(ValueError, match=r"--nbest 5 is larger than --beam-size 4"):
        DecodingOptions(beam_size=4, nbest=5)
    assert DecodingOptions(sampling=True, nbest=5).nbest == 5  # sampling draws nbest, any beam
    with pytest.raises(ConfigError, match="--top-p"):
        load_options(TranslateOptions, None, {"path": ("a",), "top_p": 0.0})


def test_absolute_paths_makes_the_path_options_absolute(tmp_path, monkeypatch):
    """Regression: config.yaml said 'reuse with: xf train --config config.yaml' but held the
    relative paths of the directory it was run from."""
    from xformer_cli.settings.config import absolute_paths, to_dict
    from xformer_cli.settings.options import TrainOptions

    monkeypatch.chdir(tmp_path)
    values = absolute_paths(TrainOptions, to_dict(TrainOptions(data="data-bin/x", save_dir="ck", arch="tiny")))
    assert values["data"] == str(tmp_path / "data-bin" / "x") and values["save_dir"] == str(tmp_path / "ck")
    assert values["tensorboard_logdir"] is None and values["arch"] == "tiny"  # not a path: as it was
