"""YAML + flag options: flags win, unknown keys and wrong types fail with the nearest name."""

import pytest

from xformer_cli.config import load_options, to_dict
from xformer_cli.errors import ConfigError
from xformer_cli.options import TrainOptions, TranslateOptions


def write(tmp_path, text):
    path = tmp_path / "opts.yaml"
    path.write_text(text)
    return path


def test_yaml_then_flags(tmp_path):
    cfg = write(tmp_path, "data: d\nmax_tokens: 2000\narch: small\nadam-betas: [0.9, 0.997]\n")
    opts = load_options(TrainOptions, cfg, {"max_tokens": 3000}, section="train")
    assert opts.max_tokens == 3000  # the flag wins
    assert opts.arch == "small"
    assert opts.adam_betas == (0.9, 0.997)
    assert opts.warmup_updates == 4000  # the default stays


def test_sectioned_file(tmp_path):
    cfg = write(tmp_path, "train:\n  data: d\n  max_update: 7\ntranslate:\n  beam: 5\n  path: [a.pt]\n")
    assert load_options(TrainOptions, cfg, section="train").max_update == 7
    assert load_options(TranslateOptions, cfg, section="translate").beam == 5


def test_unknown_key_names_the_nearest(tmp_path):
    cfg = write(tmp_path, "data: d\nmax_token: 10\n")
    with pytest.raises(ConfigError, match=r"unknown option 'max_token' \(did you mean 'max_tokens'\?\)"):
        load_options(TrainOptions, cfg)


def test_unknown_section(tmp_path):
    cfg = write(tmp_path, "train: {data: d}\ntranslat: {beam: 2}\n")
    with pytest.raises(ConfigError, match="did you mean 'translate'"):
        load_options(TrainOptions, cfg, section="train")


@pytest.mark.parametrize("text,nearest", [
    ("trian: {data: d}\n", "train"),  # the only section, misspelled: not read as an unknown option
    ("transalte:\n  beam: 2\n", "translate"),
    ("average: {output: a.pt}\n", "average_checkpoints"),
    ("preprocess: {seed: 2}\ntrian: {data: d}\n", "train"),
])
def test_misspelled_section_names_the_nearest_section(tmp_path, text, nearest):
    with pytest.raises(ConfigError, match=rf"unknown section '\w+' \(did you mean '{nearest}'\?\)"):
        load_options(TrainOptions, write(tmp_path, text), section="train")


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
    opts = load_options(TrainOptions, None, {"data": "d", "lr": 5e-4})
    assert load_options(TrainOptions, None, to_dict(opts)) == opts
