"""xf score and text/metrics.py: its numbers are the ``sacrebleu`` command's, its tokenized BLEU is the paper's procedure."""

import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from xformer_cli.cli import app
from xformer_cli.base.errors import XfError
from xformer_cli.base.fileio import read_lines
from xformer_cli.text.metrics import compound_split, moses_tokenize
from xformer_cli.settings.options import ScoreOptions
from xformer_cli.commands.score import score


runner = CliRunner()
SACREBLEU = shutil.which("sacrebleu", path=str(Path(sys.executable).parent)) or shutil.which("sacrebleu")
NEWSTEST = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "wmt14" / "newstest2013.en-de.de"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A reference, a second reference and two degraded 'systems' (with empty lines), 300 lines."""
    if NEWSTEST.exists():
        ref = NEWSTEST.read_text(encoding="utf-8").splitlines()[:300]
    else:  # still a meaningful test without the shared data
        ref = [f"Das ist der {i}. Satz, ein Test-Fall für die Bewertung." for i in range(300)]
    sys1 = [
        "" if i % 37 == 0 else " ".join(w for j, w in enumerate(line.split()) if j % 5 != 2)
        for i, line in enumerate(ref)
    ]
    sys2 = [line.replace("die", "der").replace("Die", "die") for line in ref]
    ref2 = [line.replace(",", "") for line in ref]
    d = tmp_path_factory.mktemp("score")
    paths = {}
    for name, lines in [("ref.de", ref), ("ref2.de", ref2), ("sys1.de", sys1), ("sys2.de", sys2)]:
        paths[name] = d / name
        paths[name].write_text("\n".join(lines) + "\n", encoding="utf-8")
    return paths


def sacrebleu_cli(refs, hyp, *extra):
    if SACREBLEU is None:
        pytest.skip("the sacrebleu command is not installed")
    out = subprocess.run(
        [SACREBLEU, *map(str, refs), "-i", str(hyp), "-m", "bleu", "chrf", "ter", "-w", "4", "-f", "json", *extra],
        capture_output=True, text=True, check=True,
    )
    return {r["name"]: r for r in json.loads(out.stdout)}


def run_score(**kwargs):
    out = io.StringIO()
    result = score(ScoreOptions(**kwargs), stdout=out)
    return result, out.getvalue()


@pytest.mark.slow
@pytest.mark.parametrize(
    "refs,lowercase",
    [(["ref.de"], False), (["ref.de"], True), (["ref.de", "ref2.de"], False)],
    ids=["one-ref", "lowercase", "two-refs"],
)
def test_scores_equal_the_sacrebleu_command(files, refs, lowercase):
    ref_paths = [str(files[r]) for r in refs]
    expected = sacrebleu_cli(ref_paths, files["sys1.de"], *(["-lc", "--chrf-lowercase"] if lowercase else []))
    result, _ = run_score(ref=tuple(ref_paths), hyp=str(files["sys1.de"]), lowercase=lowercase)
    for key, name in [("bleu", "BLEU"), ("chrf", "chrF2"), ("ter", "TER")]:
        assert round(result.metrics[key]["score"], 4) == expected[name]["score"], key
        assert result.metrics[key]["signature"] == expected[name]["signature"], key
    assert 5 < result.metrics["bleu"]["score"] < 95  # a score where errors would show


@pytest.mark.slow
def test_json_output_and_stdin(files):
    hyp_bytes = files["sys2.de"].read_bytes()
    result = runner.invoke(app, ["score", "--ref", str(files["ref.de"]), "--json", "--metrics", "bleu"], input=hyp_bytes)
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["hyp"] == "<stdin>" and data["lines"] == 300
    assert set(data) == {"hyp", "refs", "lines", "bleu"}
    expected = sacrebleu_cli([files["ref.de"]], files["sys2.de"])
    assert round(data["bleu"]["score"], 4) == expected["BLEU"]["score"]


def test_text_output_has_signatures(files):
    _, text = run_score(ref=(str(files["ref.de"]),), hyp=str(files["sys1.de"]))
    assert "BLEU = " in text and "chrF2 = " in text and "TER = " in text
    assert "tok:13a" in text and "nc:6" in text and "tok:tercom" in text


@pytest.mark.parametrize(
    "line,expected",
    [
        ("Baden-Württemberg", "Baden ##AT##-##AT## Württemberg"),
        ("ein 10-jähriges Kind", "ein 10 ##AT##-##AT## jähriges Kind"),
        ("a - b", "a - b"),  # a free-standing dash is not a compound
        ("-a b-", "-a b-"),  # nor is a hyphen at a word's edge
        # the original perl regex s{(\S)-(\S)}{...}g does not overlap its matches
        ("a-b-c", "a ##AT##-##AT## b-c"),
        ("x-y z-w", "x ##AT##-##AT## y z ##AT##-##AT## w"),
    ],
)
def test_compound_split(line, expected):
    assert compound_split(line) == expected


def test_moses_tokenization_then_split():
    pytest.importorskip("sacremoses")
    tokens = moses_tokenize(['Das ist ein Test-Fall, sagt "Herr" Müller.'], "de")[0]
    assert tokens == "Das ist ein Test-Fall , sagt &quot; Herr &quot; Müller ."
    assert compound_split(tokens) == "Das ist ein Test ##AT##-##AT## Fall , sagt &quot; Herr &quot; Müller ."


def test_tokenized_bleu_counts_split_compounds(tmp_path):
    """A hypothesis that gets one of two compound halves right earns n-gram credit for it."""
    pytest.importorskip("sacremoses")
    ref = tmp_path / "ref.de"
    hyp = tmp_path / "hyp.de"
    ref.write_text("Die Baden-Württemberg Regierung hat heute entschieden.\n", encoding="utf-8")
    hyp.write_text("Die Baden-Bayern Regierung hat heute entschieden.\n", encoding="utf-8")
    result, text = run_score(ref=(str(ref),), hyp=str(hyp), tokenized_bleu=True, metrics="bleu")
    tok = result.metrics["tokenized_bleu"]
    # tokens: Die Baden ##AT##-##AT## Württemberg|Bayern Regierung hat heute entschieden .  (9 each)
    assert tok["sys_len"] == tok["ref_len"] == 9
    assert tok["precisions"][0] == pytest.approx(800 / 9)
    # sacreBLEU's 13a keeps "Baden-Württemberg" as one token: 7 tokens, 6 matching
    assert result.metrics["bleu"]["sys_len"] == 7
    assert result.metrics["bleu"]["precisions"][0] == pytest.approx(600 / 7)
    assert "tok:moses-de|split:compound" in tok["signature"]
    assert "BLEU-tok-split = " in text


def test_paired_bootstrap(files):
    result, text = run_score(
        ref=(str(files["ref.de"]),), hyp=str(files["sys1.de"]), paired_bs=(str(files["sys2.de"]),), metrics="bleu"
    )
    baseline, other = result.paired_bs["systems"]
    assert baseline["baseline"] and baseline["bleu"]["p_value"] is None
    assert baseline["bleu"]["score"] == pytest.approx(result.metrics["bleu"]["score"])
    assert other["bleu"]["score"] > baseline["bleu"]["score"]
    assert other["bleu"]["p_value"] < 0.05  # dropping every 5th word vs. one article: clearly different
    assert "bs:1000|seed:12345" in result.paired_bs["signatures"]["bleu"]
    json.dumps(result.as_dict())  # numpy numbers made JSON-safe


def test_line_count_mismatch_names_both_counts(files, tmp_path):
    short = tmp_path / "short.de"
    short.write_text("eins\nzwei\n", encoding="utf-8")
    with pytest.raises(XfError, match=r"short\.de has 2 lines, .*ref\.de has 300"):
        run_score(ref=(str(files["ref.de"]),), hyp=str(short))
    result = runner.invoke(app, ["score", "--ref", str(files["ref.de"]), "--hyp", str(short)])
    assert result.exit_code == 1
    assert "has 2 lines" in result.output and "has 300" in result.output and "Traceback" not in result.output


def test_empty_lines_are_scored(tmp_path):
    ref = tmp_path / "r.en"
    hyp = tmp_path / "h.en"
    ref.write_text("the cat sat on the mat\n\n", encoding="utf-8")
    hyp.write_text("the cat sat on the mat\n\n", encoding="utf-8")
    result, _ = run_score(ref=(str(ref),), hyp=str(hyp))
    assert result.lines == 2
    assert result.metrics["bleu"]["score"] == pytest.approx(100.0)


def test_input_errors(tmp_path, monkeypatch):
    good = tmp_path / "good.en"
    good.write_text("hello\n", encoding="utf-8")
    bad = tmp_path / "bad.en"
    bad.write_bytes(b"ok\nbroken \xff line\n")
    with pytest.raises(XfError, match=r"bad\.en:2: invalid UTF-8"):
        read_lines(bad)
    with pytest.raises(XfError, match=r"missing\.en: file not found"):
        run_score(ref=(str(tmp_path / "missing.en"),), hyp=str(good))
    with pytest.raises(XfError, match=r"unknown metric 'blue'"):
        run_score(ref=(str(good),), hyp=str(good), metrics="blue,chrf")
    monkeypatch.setitem(sys.modules, "sacremoses", None)  # as if not installed
    with pytest.raises(XfError, match="pip install sacremoses"):
        run_score(ref=(str(good),), hyp=str(good), tokenized_bleu=True)
