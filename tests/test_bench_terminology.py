"""bench/terminology.py, the one terminology and glossary bench (xf translate and xf serve): its
term counting, and a real run of its serve part on the tiny checkpoint over a few sentences laid
out as the Wiktionary set is, so that the script does not rot between uses. Speeds are not
asserted; the served lines against xf translate --glossary's, and the hit counts, are."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import bench_module

BENCH = Path(__file__).resolve().parents[1] / "bench" / "terminology.py"


def test_term_hits_count_whole_words_and_the_glossary_joins_forms():
    terminology = bench_module("terminology")
    terms = [[("cat", "Katze"), ("dog", "Hund")], [("cat", "Katzen")]]
    assert terminology.term_hits(["Die Katze und Hunde", "Katzen"], terms) == (2, 3)  # "Hunde" is not "Hund"
    assert terminology.glossary_text(terms) == "cat\tKatze|Katzen\ndog\tHund\n"


@pytest.mark.slow
def test_the_serve_part_runs_and_serves_what_xf_translate_gives(ckpt, multi30k_dir, tmp_path):
    pytest.importorskip("starlette", reason="the serve extra is not installed")
    data = tmp_path / "data"
    (data / "terminology").mkdir(parents=True)
    (data / "multi30k").symlink_to(multi30k_dir)
    sources = ["A man sleeps.", "Two girls play.", "A boy runs in the park.", "A dog and a man."]
    (data / "terminology" / "newstest2017.en-de.en").write_text("\n".join(sources) + "\n", encoding="utf-8")
    (data / "terminology" / "newstest2017.en-de.de").write_text("x\n" * len(sources), encoding="utf-8")
    (data / "terminology" / "wikt.727.terminology.tsv").write_text(
        "0\t1\tman\tHund\t\t\n1\t2\tgirls\tKatzen\t\t\n2\t3\tboy\tBaum\tpark\tGarten\n3\t4\tdog\tFahrrad\t\t\n",
        encoding="utf-8")
    proc = subprocess.run([sys.executable, str(BENCH), "--path", str(ckpt), "--data", str(data), "--only", "serve",
                           "--sentences", "4", "--rounds", "1", "--concurrency", "2", "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = (tmp_path / "out" / "terminology.md").read_text(encoding="utf-8")
    assert report.startswith(f"# Terminology: {ckpt}") and "CPU flags:" in report.splitlines()[0]
    rows = {cells[0]: cells[1:] for cells in (
        [c.strip() for c in line.strip("|").split("|")] for line in report.splitlines() if line.startswith("| "))}
    hits = rows["xf translate --glossary, one file (model loading included)"][3]
    assert re.fullmatch(r"[1-5]/5", hits) and rows["no glossary"][3] == "0/5"
    for served in ("the server's (--glossary)", "the request's (884 pairs in each)"):
        assert float(rows[served][0]) > 0 and rows[served][2] == "0 of 4"  # the same lines as xf translate's
        assert rows[served][3] == hits
    assert float(rows["find_terms, the direction's glossary"][0]) > 0
