"""decode/confidence.py: the fit on synthetic data with known weights, the
calibration file's round trip and refusals, the flags, and the "confidence" of xf translate's
jsonl through the CLI on tiny random models (whose translations are noise: only the contract
is checked here; bench/confidence.py measures what the confidence is worth)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from typer.testing import CliRunner

from xformer_cli.cli import app
from xformer_cli.decode.confidence import SCORES, WRONG_LANGUAGE_LETTERS, Calibration, Scorer, fit, is_copy, roc_auc, uncalibrated
from xformer_cli.base.errors import XfError

from helpers import Served, tiny_checkpoint

runner = CliRunner()


def test_the_fit_finds_the_weights_that_made_the_labels():
    rng = np.random.default_rng(0)
    true_w, true_b = np.array([2.0, -1.0]), 0.7
    x = rng.normal(size=(20000, 2))
    y = rng.random(20000) < 1 / (1 + np.exp(-(x @ true_w + true_b)))
    w, b = fit(x, y.astype(int), l2=0.0)
    assert w == pytest.approx(true_w, abs=0.15) and b == pytest.approx(true_b, abs=0.15)


def test_the_fit_uses_only_the_rows_it_is_given():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(500, 2))
    y = (x[:, 0] + 0.3 * rng.normal(size=500) > 0).astype(int)
    assert np.allclose(fit(x, y)[0], fit(x.copy(), y.copy())[0])  # a pure function of its input
    w, _ = fit(x[:, [1, 0]], y)  # the informative column moved: so does its weight
    assert abs(w[1]) > 5 * abs(w[0])


def test_roc_area_of_hand_computed_rankings():
    assert roc_auc([0.1, 0.4, 0.35, 0.8], [False, False, True, True]) == 0.75
    assert roc_auc([1, 1, 1], [True, False, True]) == 0.5  # ties count half


def test_every_confidence_is_in_the_unit_interval():
    calibration = Calibration((50.0, 3.0), 20.0, reverse=True)
    for row in ([-30.0, -30.0, 0, 0], [0.0, 0.0, 1, 1], [5.0, 9.0, 0, 0], [-0.1, -2.0, 1, 0]):
        assert 0.0 <= calibration.confidence(row) <= 1.0
        assert 0.0 <= uncalibrated(row) <= 1.0
    for flagged in ([-0.1, 0.0, 0, 1], [-0.1, 0.0, 1, 0]):  # a flag forces it to 0, fitted or not
        assert uncalibrated(flagged) == 0.0 and calibration.confidence(flagged) == 0.0


def test_the_calibration_file_round_trips(tmp_path):
    calibration = Calibration((1.5, 0.25), -0.5, reverse=True, note="val")
    path = tmp_path / "c.json"
    path.write_text(calibration.to_json(), encoding="utf-8")
    assert Calibration.load(str(path)) == calibration


@pytest.mark.parametrize("text, says", [
    ('{"format": "xf-confidence",\n "version": 1,\n oops}', "c.json: line 3: not JSON"),
    (json.dumps({"format": "xf-confidence", "version": 1, "scores": list(SCORES),
                 "weights": [1, 2], "bias": 0, "reverse": False}).replace("0, \"reverse", "NaN, \"reverse"),
     "c.json: not JSON xf reads: 'bias' is NaN, not a finite number; not a calibration file of xf calibrate"),
    (json.dumps({"format": "xf-confidence", "version": 2}), '"version" is 2; this xf reads calibration version 1'),
    (json.dumps({"format": "xf-confidence", "version": "1"}), '"version" is "1"; this xf reads calibration version 1'),
    ('{"format": "xf-confidence", "version": 1, "scores": ["forward", "reverse"], "weights": [1, %s], "bias": 0, '
     '"reverse": false}' % ("9" * 400), "'weights' is an integer of 400 digits, beyond a finite number"),
    (json.dumps({"format": "xf-confidence", "version": 1, "scores": list(SCORES), "weights": [1],
                 "bias": 0, "reverse": False}), "2 finite numbers"),
    ("[]", "not a calibration file"),
])
def test_a_bad_calibration_file_is_refused_in_one_line(tmp_path, text, says):
    path = tmp_path / "c.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(XfError) as e:
        Calibration.load(str(path))
    assert says in str(e.value) and str(path) in str(e.value) and "\n" not in str(e.value)


def test_a_blank_source_has_confidence_1_calibrated_or_not():
    """Nothing to translate: 1, as without a file (a calibration's sigmoid of zero scores gave 0.992)."""
    calibrated = Scorer(Calibration((1.0, 0.0), 5.0, reverse=False))
    assert calibrated.confidences([" ", "A dog."], ["", "Ein Hund."], [0.0, -1.0]) == [1.0, pytest.approx(1 / (1 + math.exp(-4)))]
    assert Scorer().confidences([""], [""], [0.0]) == [1.0]


def test_the_copy_flag_fires_on_a_copied_source_and_not_on_a_translation():
    source = "A man in a blue shirt is standing on a ladder cleaning windows."
    assert is_copy(source, source) and is_copy(source, source.lower() + " ")
    assert not is_copy(source, "Ein Mann in einem blauen Hemd steht auf einer Leiter und putzt Fenster.")
    assert not is_copy("", "")


def test_the_wrong_language_flag_fires_on_output_in_another_language():
    pytest.importorskip("py3langid")
    scorer = Scorer(target_lang="de")
    sources = ["Two young guys with shaggy hair look at their hands while hanging out in the yard."] * 2
    outputs = ["Two young guys with shaggy hair are looking at their hands in the yard.",
               "Deux jeunes hommes aux cheveux hirsutes regardent leurs mains dans le jardin.",
               "Zwei junge Männer mit zotteligen Haaren betrachten ihre Hände im Garten.", "2 + 2"]
    rows = scorer.rows(sources * 2, outputs, [-0.5] * 4)
    assert [r[2] for r in rows] == [1.0, 1.0, 0.0, 0.0]


def test_a_calibration_fitted_with_a_reverse_model_needs_one():
    with pytest.raises(XfError, match="--reverse-path"):
        Scorer(Calibration((1.0, 1.0), 0.0, reverse=True), where="c.json")


@pytest.fixture(scope="module")
def models(spm_model, tmp_path_factory, multi30k_dir):
    root = tmp_path_factory.mktemp("confidence")
    forward = tiny_checkpoint(root / "fwd.pt", spm_model, seed=0)
    reverse = tiny_checkpoint(root / "rev.pt", spm_model, seed=1)
    en = (multi30k_dir / "val.en").read_text(encoding="utf-8").splitlines()[:40]
    de = (multi30k_dir / "val.de").read_text(encoding="utf-8").splitlines()[:40]
    (root / "src.en").write_text("\n".join(en) + "\n", encoding="utf-8")
    (root / "ref.de").write_text("\n".join(de) + "\n", encoding="utf-8")
    return root, forward, reverse


def _translate(root, forward, *args):
    result = runner.invoke(app, ["translate", "--path", forward, "--input", str(root / "src.en"), "--device", "cpu",
                                 "--quiet", "--output-format", "jsonl", "--max-len-b", "5", *map(str, args)])
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]


def test_translate_jsonl_gives_every_hypothesis_a_confidence(models):
    root, forward, _ = models
    records = _translate(root, forward, "--nbest", "2")
    assert len(records) == 40
    values = [h["confidence"] for r in records for h in r["hypotheses"]]
    assert len(values) == 80 and all(0.0 <= v <= 1.0 for v in values)


def test_calibrate_writes_a_file_that_translate_reads(models):
    root, forward, reverse = models
    out = root / "conf.json"
    result = runner.invoke(app, ["calibrate", "--path", forward, "--reverse-path", reverse, "--source",
                                 str(root / "src.en"), "--reference", str(root / "ref.de"), "--output", str(out),
                                 "--device", "cpu", "--max-len-b", "5", "--target-lang", "de"])
    assert result.exit_code == 0, result.output
    assert Calibration.load(str(out)).reverse
    records = _translate(root, forward, "--confidence", out, "--reverse-path", reverse)
    assert all(0.0 <= r["hypotheses"][0]["confidence"] <= 1.0 for r in records)
    refused = runner.invoke(app, ["translate", "--path", forward, "--input", str(root / "src.en"), "--device", "cpu",
                                  "--output-format", "jsonl", "--confidence", str(out)])
    assert refused.exit_code != 0 and "--reverse-path" in refused.output and "Traceback" not in refused.output


def test_serve_answers_a_confidence_per_q_item_from_its_calibration(ckpt, tmp_path):
    path = tmp_path / "c.json"
    path.write_text(Calibration((1.0, 0.0), 0.5, reverse=False).to_json(), encoding="utf-8")
    served = Served("--model", f"en-de={ckpt}", "--confidence", f"en-de={path}", "--max-len-b", "5")
    try:
        status, _, one = served.translate("A man sleeps.")
        status_list, _, many = served.translate(["A man sleeps.", "Two dogs. They run.", " "])
        status_html, _, page = served.translate("<p>A man.</p><p>A dog.</p>", format="html")
    finally:
        served.stop()
    assert (status, status_list, status_html) == (200, 200, 200)
    assert 0 <= one["confidence"] <= 1 and 0 <= page["confidence"] <= 1
    assert len(many["confidence"]) == 3 and all(0 <= c <= 1 for c in many["confidence"])
    assert one["confidence"] == many["confidence"][0]


def test_serve_refuses_a_bad_calibration_file_in_one_line(ckpt, tmp_path):
    path = tmp_path / "c.json"
    path.write_text('{"format": "xf-confidence", "version": 7}', encoding="utf-8")
    result = runner.invoke(app, ["serve", "--model", f"en-de={ckpt}", "--confidence", f"en-de={path}", "--port", "0"])
    assert result.exit_code != 0 and '"version" is 7' in result.output and "Traceback" not in result.output


def test_the_wrong_language_flag_takes_a_three_letter_code_as_its_two():
    pytest.importorskip("py3langid")
    long_english = "A man in a blue shirt is sleeping on a bench."
    assert Scorer(target_lang="deu").rows(["x"], [long_english], [-0.5])[0][2] == 1.0  # was: py3langid knows no 'deu'
    assert Scorer(target_lang="de").rows(["x"], [long_english], [-0.5], targets=["fra"])[0][2] == 1.0


def test_the_wrong_language_flag_needs_a_text_long_enough_to_tell(multi30k_dir):
    """Short correct German was flagged: "Eine Person springt." (py3langid's German 0.12), "Ein
    Hund.", and a whole Multi30k val reference, "Ein Mann boxt"; no output of fewer letters than
    WRONG_LANGUAGE_LETTERS is flagged, a longer one in another language still is."""
    pytest.importorskip("py3langid")
    scorer = Scorer(target_lang="de")
    references = (multi30k_dir / "val.de").read_text(encoding="utf-8").splitlines()
    short = [line for line in references if sum(c.isalpha() for c in line) < WRONG_LANGUAGE_LETTERS]
    outputs = ["Eine Person springt.", "Ein Hund.", "Ein Mann boxt", *short, "A man sleeps.",
               "A man in a blue shirt is sleeping on a bench."]
    rows = scorer.rows(["x"] * len(outputs), outputs, [-0.5] * len(outputs))
    assert [r[2] for r in rows] == [0.0] * (len(outputs) - 1) + [1.0]


def test_a_forced_copy_and_a_forced_wrong_language_output_get_confidence_0(models):
    pytest.importorskip("py3langid")
    root, forward, _ = models
    source = "Two young guys with shaggy hair look at their hands while hanging out in the yard."
    french = "Deux jeunes hommes aux cheveux hirsutes regardent leurs mains dans le jardin."
    german = "Zwei junge Männer mit zotteligen Haaren betrachten ihre Hände im Garten."
    lines = [{"source": source, "prefix": prefix} for prefix in (source, french, german)]
    (root / "steered.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    result = runner.invoke(app, ["translate", "--path", forward, "--input", str(root / "steered.jsonl"),
                                 "--input-format", "jsonl", "--output-format", "jsonl", "--target-lang", "de",
                                 "--device", "cpu", "--quiet", "--max-len-b", "3"])
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    copied, wrong, right = (r["hypotheses"][0] for r in records)
    assert copied["text"].startswith(source[:-1]) and wrong["text"].startswith(french[:-1])
    assert copied["confidence"] == 0.0 and wrong["confidence"] == 0.0
    assert right["confidence"] > 0.0  # German, not the source: no flag (a random model: a low score)


# -- labels at the median: ties broken, all equal refused (confidence.median_labels) ----------------------
def test_labels_at_the_median_break_ties_so_a_weak_model_still_calibrates():
    from xformer_cli.decode.confidence import median_labels

    assert median_labels([1.0, 2.0, 3.0, 4.0]) == ([0, 0, 1, 1], 2.5)  # no ties: at or above the median
    assert median_labels([0.0, 5.0, 5.0, 9.0]) == ([0, 1, 1, 1], 5.0)  # ties that leave both sides: as before
    # a weak model's many empty outputs at chrF 0, the median: at-or-above would be every line
    assert median_labels([0.0, 0.0, 0.0, 0.0, 12.5, 30.0]) == ([0, 0, 0, 0, 1, 1], 0.0)
    with pytest.raises(ValueError, match="the 5 translations' sentence chrF are all 0.00: nothing tells"):
        median_labels([0.0] * 5)


def test_calibrate_refuses_equal_labels_in_one_line_before_writing(spm_model, tmp_path, multi30k_dir):
    """A model that ends every output at once (eos first): every chrF 0, nothing to fit."""
    import torch

    from xformer_cli.model.checkpoint import load_checkpoint, save_checkpoint
    from xformer_cli.text.vocab import EOS_ID

    from helpers import cli_fails, random_checkpoint

    path = random_checkpoint(tmp_path / "eos.pt", spm_model, output_bias=True)
    ckpt = load_checkpoint(path)
    ckpt["model"]["output_bias"] = torch.full_like(ckpt["model"]["output_bias"], -1e4)
    ckpt["model"]["output_bias"][EOS_ID] = 1e4
    save_checkpoint(path, ckpt)
    for side in ("en", "de"):
        (tmp_path / f"v.{side}").write_text("\n".join((multi30k_dir / f"val.{side}").read_text(
            encoding="utf-8").splitlines()[:30]) + "\n", encoding="utf-8")
    cli_fails(["calibrate", "--path", path, "--source", tmp_path / "v.en", "--reference", tmp_path / "v.de",
               "--output", tmp_path / "c.json", "--device", "cpu", "--threads", "1", "--max-len-b", "4"],
              "sentence chrF are all 0.00: nothing tells a good translation from a bad one")
    assert not (tmp_path / "c.json").exists()


def test_the_confidences_target_language_is_the_models_recorded_one(spm_model, tmp_path):
    """No --target-lang: an EN->DE model's record names German, so a French output is flagged."""
    pytest.importorskip("py3langid")
    from helpers import random_checkpoint

    ckpt = random_checkpoint(tmp_path / "ende.pt", spm_model, meta={"source_lang": "en", "target_lang": "de"})
    source = "Two young guys with shaggy hair look at their hands while hanging out in the yard."
    french = "Deux jeunes hommes aux cheveux hirsutes regardent leurs mains dans le jardin."
    german = "Zwei junge Männer mit zotteligen Haaren betrachten ihre Hände im Garten."
    lines = [{"source": source, "prefix": prefix} for prefix in (french, german)]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    result = runner.invoke(app, ["translate", "--path", ckpt, "--input", str(tmp_path / "in.jsonl"),
                                 "--input-format", "jsonl", "--output-format", "jsonl", "--device", "cpu",
                                 "--quiet", "--max-len-b", "3"])
    assert result.exit_code == 0, result.output
    wrong, right = (json.loads(line)["hypotheses"][0] for line in result.stdout.splitlines() if line.startswith("{"))
    assert wrong["confidence"] == 0.0 and right["confidence"] > 0.0
