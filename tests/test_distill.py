"""recipes/multi30k/distill.sh: its filter on hand-made scores, and the whole recipe end to end
on a tiny slice of Multi30k with a tiny teacher (trained by run.sh) and a tiny student."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import RECIPES, TINY, multi30k_slice, read, run_recipe, write

FILTER = RECIPES / "multi30k" / "distill_filter.py"


def run_filter(tmp_path, means, targets, *cuts):
    scores = write(tmp_path / "scores.jsonl", [json.dumps({"line": i + 1, "mean": m}) for i, m in enumerate(means)])
    source = write(tmp_path / "src.en", [f"source {i}" for i in range(len(means))])
    target = write(tmp_path / "hyp.de", targets)
    return subprocess.run([sys.executable, str(FILTER), str(scores), str(source), str(target),
                           str(tmp_path / "kept"), "en", "de", *map(str, cuts)], capture_output=True, text=True)


def test_filter_drops_below_the_cut_and_empty_targets_keeping_the_order(tmp_path):
    means = [-0.5, -2.0, -1.0, -0.1, -1.5]
    targets = ["a", "b", "c", "", "e"]  # the 4th is empty: dropped whatever its score
    out = run_filter(tmp_path, means, targets, 0, -1.0)
    assert out.returncode == 0, out.stderr
    assert read(tmp_path / "kept.en") == ["source 0", "source 2"]
    assert read(tmp_path / "kept.de") == ["a", "c"]
    report = json.loads((tmp_path / "kept.json").read_text())
    assert report == {"pairs": 5, "kept": 2, "drop": 0.0, "min_mean": -1.0, "dropped_low_log_prob": 2,
                      "dropped_empty": 1, "lowest_mean_kept": -1.0}


def test_filter_drops_the_lowest_fraction(tmp_path):
    means = [-0.3, -4.0, -0.2, -3.0, -0.9, -0.1, -2.5, -0.4, -0.6, -0.7]
    out = run_filter(tmp_path, means, [f"t{i}" for i in range(10)], 0.2)  # the 2 lowest: lines 1 and 3
    assert out.returncode == 0, out.stderr
    assert read(tmp_path / "kept.de") == ["t0", "t2", "t4", "t5", "t6", "t7", "t8", "t9"]
    assert json.loads((tmp_path / "kept.json").read_text())["lowest_mean_kept"] == -2.5


def test_filter_zero_keeps_every_nonempty_pair(tmp_path):
    out = run_filter(tmp_path, [-9.0, -30.0, -0.2], ["x", "y z", "w"], 0)
    assert out.returncode == 0, out.stderr
    assert read(tmp_path / "kept.de") == ["x", "y z", "w"]
    assert json.loads((tmp_path / "kept.json").read_text())["kept"] == 3


def test_filter_refuses_scores_of_another_file_and_writes_nothing(tmp_path):
    out = run_filter(tmp_path, [-1.0, -2.0], ["only one line"], 0)
    assert out.returncode != 0 and "scores 2 pairs but" in out.stderr and "has 1 lines" in out.stderr
    assert not list(tmp_path.glob("kept*"))
    out = run_filter(tmp_path, [-1.0], ["a"], 1.5)
    assert out.returncode != 0 and "must be in [0, 1]" in out.stderr and not list(tmp_path.glob("kept*"))


def one_line_refusal(out, message):
    err = out.stderr.strip()
    assert out.returncode != 0 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert message in err, err


@pytest.mark.parametrize("cuts, message", [
    (("abc",), "DROP (distill.sh's FILTER_DROP), the fraction to drop, must be in [0, 1], not 'abc'"),
    (("",), "DROP (distill.sh's FILTER_DROP), the fraction to drop, must be in [0, 1], not ''"),
    (("nan",), "DROP (distill.sh's FILTER_DROP), the fraction to drop, must be in [0, 1], not 'nan'"),
    ((0, "x"), "MIN_MEAN (distill.sh's FILTER_MIN_MEAN) must be a number or -inf, not 'x'"),
    ((0, "nan"), "MIN_MEAN (distill.sh's FILTER_MIN_MEAN) must be a number or -inf, not 'nan'"),
])
def test_filter_refuses_bad_settings_in_one_line(tmp_path, cuts, message):
    """FILTER_DROP=abc or FILTER_MIN_MEAN=x were a ValueError traceback."""
    one_line_refusal(run_filter(tmp_path, [-1.0, -2.0], ["a", "b"], *cuts), message)
    assert not list(tmp_path.glob("kept*"))


def test_filter_refuses_missing_or_bad_input_in_one_line(tmp_path):
    """A scores file that is missing, not JSON or without a number 'mean', and a missing source:
    each was a traceback (FileNotFoundError, JSONDecodeError, KeyError, TypeError)."""
    assert run_filter(tmp_path, [-1.0], ["a"], 0).returncode == 0  # writes the files broken below
    scores, source, target = tmp_path / "scores.jsonl", tmp_path / "src.en", tmp_path / "hyp.de"

    def refused(message):
        for path in tmp_path.glob("kept*"):
            path.unlink()
        one_line_refusal(subprocess.run([sys.executable, str(FILTER), str(scores), str(source), str(target),
                                         str(tmp_path / "kept"), "en", "de", "0"], capture_output=True, text=True),
                         message)
        assert not list(tmp_path.glob("kept*"))

    for text, message in [(b'{"line": 1, "mean": -1.0}\n{"line": 2\n', f"{scores}:2: not JSON: Expecting ',' delimiter"),
                          (b'{"line": 1}\n', f"{scores}:1: no number 'mean'"),
                          (b'{"line": 1, "mean": "low"}\n', f"{scores}:1: no number 'mean'"),
                          (b"[" * 100_000 + b"]" * 100_000 + b"\n", f"{scores}:1: nests arrays or objects deeper than 64"),
                          (b"\xff\n", f"{scores}:1: not JSON: Expecting value")]:
        scores.write_bytes(text)
        refused(message)
    scores.write_bytes(b'{"line": 1, "mean": -1.0}\n')
    source.unlink()
    refused(f"{source}: cannot read (No such file or directory)")
    scores.unlink()
    refused(f"{scores}: cannot read (No such file or directory)")


PICK = RECIPES / "multi30k" / "distill_pick.py"


def run_pick(tmp_path, records, refs):
    nbest = tmp_path / "nbest.jsonl"
    nbest.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records), encoding="utf-8")
    return subprocess.run([sys.executable, str(PICK), str(nbest), str(write(tmp_path / "ref.de", refs)),
                           str(tmp_path / "picked.de")], capture_output=True, text=True)


def test_pick_keeps_the_hypothesis_closest_to_the_reference(tmp_path):
    import sacrebleu

    hyps = [["ein Hund rennt", "ein Hund läuft im Park", "Hund"], ["zwei Männer", "zwei Männer"], ["eine Frau"]]
    refs = ["ein Hund läuft im Park .", "zwei Männer reden", "ein Kind"]
    out = run_pick(tmp_path, [{"id": i, "hypotheses": [{"text": t} for t in h]} for i, h in enumerate(hyps)], refs)
    assert out.returncode == 0, out.stderr
    # by hand: each line's chrF, the highest kept, the teacher's best of equals (line 2)
    best = [max(h, key=lambda t: (sacrebleu.sentence_chrf(t, [r]).score, -h.index(t))) for h, r in zip(hyps, refs)]
    assert read(tmp_path / "picked.de") == best == ["ein Hund läuft im Park", "zwei Männer", "eine Frau"]
    assert "1 not the teacher's best" in out.stderr


def test_pick_refuses_bad_records_naming_the_line_and_writes_nothing(tmp_path):
    good = {"hypotheses": [{"text": "a"}]}
    for records, refs, message in [
        ([good, "{oops"], ["a", "b"], "nbest.jsonl:2: not JSON"),
        ([good, {"hypotheses": []}], ["a", "b"], "nbest.jsonl:2: no 'hypotheses' with texts"),
        ([good, {"hypotheses": [{"text": 3}]}], ["a", "b"], "nbest.jsonl:2: no 'hypotheses' with texts"),
        ([good], ["a", "b"], "has 1 records but"),
    ]:
        out = run_pick(tmp_path, records, refs)
        assert out.returncode != 0 and message in out.stderr and out.stderr.count("\n") == 1, out.stderr
        assert "Traceback" not in out.stderr and not (tmp_path / "picked.de").exists()


STUDENT = TINY.replace("  bpe_vocab_size: 300\n", "").replace(
    "  arch: tiny\n", "  arch: tiny\n  decoder_layers: 1\n").replace(
    "  num_update_checkpoints: 2\n", "  num_update_checkpoints: 2\n  choose_on_valid: true\n"
    "  choose_last: [1]\n  choose_best: [1]\n  choose_lenpens: [0.6, 1.0]\n")


@pytest.mark.slow
def test_distill_end_to_end_and_resume(tmp_path):
    data = multi30k_slice(tmp_path / "m30k")
    teacher_work = tmp_path / "teacher"
    run_recipe("multi30k/run.sh", {"MULTI30K_DIR": data, "WORK_DIR": teacher_work,
                                   "CONFIG": write(tmp_path / "tiny.yaml", TINY.splitlines())}, "en-de")
    teacher = teacher_work / "averaged.pt"
    work = tmp_path / "distill"
    # the tiny teacher rarely ends a sentence: its outputs are capped at the source length + 2
    env = {"MULTI30K_DIR": data, "WORK_DIR": work, "TEACHER": teacher, "TEACHER_ARGS": "--max-len-a 1 --max-len-b 2",
           "CONFIG": write(tmp_path / "student.yaml", STUDENT.splitlines()), "BENCH_REPEATS": 1, "CHUNK_LINES": 200}
    first = run_recipe("multi30k/distill.sh", env, "en-de", timeout=1500)  # ~20 xf commands: minutes on a loaded machine
    d = work / "distilled"
    assert len(read(d / "train.de")) == 400 and len(read(d / "val.de")) == 40
    assert "chunk 0001" in first.stderr and not (d / "train-parts").exists()  # 2 chunks of 200 lines, joined
    scores = [json.loads(line) for line in read(d / "train.scores.jsonl")]
    kept = json.loads((d / "kept.json").read_text())
    assert kept["pairs"] == 400 and kept["kept"] == len(read(d / "kept.de")) == len(read(d / "kept.en"))
    # the default: the 20 pairs (5%) of lowest per-token log-prob dropped, and any empty translation
    hyps = read(d / "train.de")
    lowest = set(sorted(range(400), key=lambda i: (scores[i]["mean"], -i))[:20])
    expected = [h for i, h in enumerate(hyps) if h.strip() and i not in lowest]
    assert kept["drop"] == 0.05 and read(d / "kept.de") == expected
    assert "drop" in (d / "filter-val.txt").read_text()
    # the student learned from the teacher's vocabulary and translated test2016
    from xformer_cli.model.checkpoint import load_checkpoint

    assert (work / "data-bin" / "spm.model").read_bytes() == (teacher_work / "data-bin" / "spm.model").read_bytes()
    student, tutor = (load_checkpoint(p)["model"]["decoder_embed.weight"] for p in (work / "averaged.pt", teacher))
    assert student.shape == tutor.shape
    assert len(read(work / "test.hyp.de")) == 30 and len(read(work / "teacher.test.hyp.de")) == 30
    assert (work / "student-ct2-int8" / "model.bin").exists() and (work / "teacher-ct2-int8" / "model.bin").exists()
    table = (work / "table.txt").read_text()
    assert "teacher vs student" in table and "sent/s, CTranslate2 int8" in table and table in first.stdout
    bench = [line.split("\t") for line in read(work / "bench.tsv")]
    assert sorted((w, e, m) for w, e, m, _, _ in bench) == [
        (w, e, m) for w in ("student", "teacher") for e in ("ctranslate2", "xf") for m in ("fast", "int8")]
    assert all(float(s) > 0 for *_, s in bench)
    assert "sent/s, xf int8 --compile --shortlist" in table and "student xf int8 --compile --shortlist / teacher" in table
    assert (work / "shortlist.npz").exists()
    # a re-run skips every step and prints the same table; `bench` measures again
    again = run_recipe("multi30k/distill.sh", env, "en-de")
    assert "teacher translates train.en: skipped" in again.stderr and "bench: skipped" in again.stderr
    assert table in again.stdout
    # `size`: the decoding speed of each shape asked for, on the student's data
    size = run_recipe("multi30k/distill.sh", {**env, "SIZES": "2x1:32:64"}, "en-de", "size")
    speeds = ", ".join(f"{engine} {mode} [0-9.]+" for engine in ("xf", "ctranslate2") for mode in ("int8", "fast"))
    assert re.search(rf"^2x1:32:64 +{speeds} sentences/s \(best of 1\); xf fast 1.00x the first$", size.stdout,
                     re.M), size.stdout
    bad = run_recipe("multi30k/distill.sh", {**env, "TEACHER": tmp_path / "none.pt"}, "en-de", check=False)
    assert bad.returncode != 0 and "none.pt not found" in bad.stderr


@pytest.mark.parametrize("name, value, message", [
    ("TEACHER_SEEDS", "0", "TEACHER_SEEDS=0: a number of teachers from 1 to 9"),
    ("TEACHER_SEEDS", "-1", "TEACHER_SEEDS=-1: a number of teachers from 1 to 9"),
    ("TEACHER_SEEDS", "nan", "TEACHER_SEEDS=nan: a number of teachers from 1 to 9"),
    ("DISTILL_NBEST", "inf", "DISTILL_NBEST=inf: a number of hypotheses from 1 to 99"),
    ("DISTILL_NBEST", "1000", "DISTILL_NBEST=1000: a number of hypotheses from 1 to 99"),
])
def test_bad_teacher_settings_stop_before_anything_runs(tmp_path, name, value, message):
    work = tmp_path / "distill"
    out = run_recipe("multi30k/distill.sh", {"MULTI30K_DIR": multi30k_slice(tmp_path / "m30k"), "WORK_DIR": work,
                                             "TEACHER_DIR": tmp_path / "teacher", name: value}, "en-de", check=False)
    assert out.returncode != 0 and message in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "teacher").exists() and not list((work / "distilled").iterdir())
