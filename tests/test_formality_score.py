"""formality_score.py: CoCoA-MT's reference-based formality accuracy, and the two bench scripts
over a CoCoA-MT-like directory."""

import json

import pytest

from helpers import bench_module
from xformer_cli.base.errors import XfError
from xformer_cli.text.formality_score import contains, label, phrases, plain, score

FORMAL = "Wie [F]schätzen Sie[/F] das ein, wenn [F]Sie[/F] an [F]Ihr[/F] Leben denken?"
INFORMAL = "Wie [F]schätzt du[/F] das ein, wenn [F]du[/F] an [F]dein[/F] Leben denkst?"


def test_phrases_are_the_shortest_marked_spans():
    assert phrases(FORMAL) == ["schätzen Sie", "Sie", "Ihr"]
    assert phrases("Keine Anrede.") == []
    assert plain(FORMAL) == "Wie schätzen Sie das ein, wenn Sie an Ihr Leben denken?"


@pytest.mark.parametrize("translation, phrase, found", [
    ("Wie schätzen Sie das ein", "schätzen Sie", True),
    ("Sie schätzen das", "schätzen Sie", True),  # tokens as a set: order does not count
    ("Wie schätzen sie das ein", "schätzen Sie", False),  # case-sensitive
    ("Sie wissen, was ich meine", "Sie wissen", False),  # "wissen," keeps its comma, as the official scorer
    ("Ihre Mutter", "Ihr", False),  # whole tokens
    ("  Ihr Leben  ", "Ihr", True),  # the line is stripped
])
def test_contains_follows_the_official_tokens(translation, phrase, found):
    assert contains(translation, phrase) is found


@pytest.mark.parametrize("translation, expected", [
    ("Wie schätzen Sie das ein, wenn Sie an Ihr Leben denken?", "formal"),
    ("Was meinen Sie dazu?", "formal"),  # one formal phrase is enough
    ("Wie schätzt du das ein, wenn du an dein Leben denkst?", "informal"),
    ("Was meinst du dazu?", "informal"),
    ("Was meinst du?", "neutral"),  # "du?" is no token "du": the official scorer's tokens
    ("Was meint man dazu?", "neutral"),
    ("Sie und du", "other"),
])
def test_label(translation, expected):
    assert label(translation, FORMAL, INFORMAL) == expected


def test_accuracy_counts_formal_and_informal_only():
    result = score(["Sie", "Sie", "du", "man", "Sie du"], [FORMAL] * 5, [INFORMAL] * 5)
    assert result.counts == {"formal": 2, "informal": 1, "neutral": 1, "other": 1}
    assert result.matched == 3
    assert result.accuracy("formal") == pytest.approx(2 / 3)
    assert result.accuracy("informal") == pytest.approx(1 / 3)
    assert score(["man"], [FORMAL], [INFORMAL]).accuracy("formal") == 0.0  # nothing matched


def test_mismatched_files_are_one_line_errors():
    with pytest.raises(XfError, match="2 translations, 1 formal and 1 informal"):
        score(["a", "b"], [FORMAL], [INFORMAL])
    with pytest.raises(XfError, match="formal or informal"):
        score(["Sie"], [FORMAL], [INFORMAL]).accuracy("neutral")


def cocoa_like(root, rows):
    """A CoCoA-MT-like directory: rows of (English, annotated formal, annotated informal) in both domains."""
    for domain in ("telephony", "topical_chat"):
        stem = root / f"formality-control.train.{domain}.en-de"
        for suffix, column in (("en", 0), ("formal.annotated.de", 1), ("informal.annotated.de", 2)):
            (stem.parent / f"{stem.name}.{suffix}").write_text("".join(r[column] + "\n" for r in rows), encoding="utf-8")
        for kind, column in (("formal", 1), ("informal", 2)):
            (stem.parent / f"{stem.name}.{kind}.de").write_text("".join(plain(r[column]) + "\n" for r in rows),
                                                                encoding="utf-8")
    return root


ROWS = [("How do you see it?", FORMAL, INFORMAL),
        ("They are tired.", "Sie sind müde.", "Sie sind müde."),
        ("You are tired.", "[F]Sie sind[/F] müde.", "[F]Du bist[/F] müde.")]


def test_bench_classifier_table(tmp_path, capsys):
    bench = bench_module("formality_classifier")
    bench.main(["--data", str(cocoa_like(tmp_path, ROWS))])
    out = capsys.readouterr().out
    german_only, with_source = out.split("\n\n")[:2]
    # 10 references: 2 x (formal, informal) x 2 domains + 2 identical pairs; "Sie sind müde." alone is none
    assert "(10 references): German only" in german_only
    assert "formal         4          2        2      1.000   0.500" in german_only
    assert "none           2          4        2      0.500   1.000" in german_only
    assert "formal         4          4        4      1.000   1.000" in with_source  # "You are": formal


def test_bench_score_reports_the_requested_accuracy(tmp_path, capsys):
    root = cocoa_like(tmp_path, ROWS)
    stem = root / "formality-control.train.telephony.en-de"
    hyp = tmp_path / "hyp.de"
    hyp.write_text("Was meinen Sie dazu?\nSie sind müde.\nDu bist müde.\n", encoding="utf-8")
    report = bench_module("formality_score").main(
        ["--hyp", str(hyp), "--formal-refs", f"{stem}.formal.annotated.de", "--informal-refs",
         f"{stem}.informal.annotated.de", "--requested", "formal", "--json"])
    assert json.loads(capsys.readouterr().out) == report
    assert (report["formal"], report["informal"], report["neutral"], report["other"]) == (1, 1, 1, 0)
    assert report["accuracy"] == 0.5 and report["requested"] == "formal"
