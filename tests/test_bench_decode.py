"""bench/decode.py --cpu, the table of docs/benchmarks.md: every case it names runs, with a
shortlist and a reference, so the script a CPU kind is measured with does not rot between uses.
Speeds are not asserted (make bench's rule): the rows, their BLEU and the case checks are."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ctranslate2", reason="the export extra (CTranslate2) is installed by make test")

from helpers import bench_module  # noqa: E402

BENCH = Path(__file__).resolve().parents[1] / "bench" / "decode.py"
from xformer_cli.precision import cpu_flags  # noqa: E402

# CT2_FORCE_CPU_ISA=AVX512 only where the CPU has it (an AVX2-only CPU cannot run that case)
CASES = ["xf fp32", "xf int8 shortlist workers 2", "CTranslate2 int8 vmap inter 2",
         "CTranslate2 float32 AVX512" if "avx512f" in cpu_flags() else "CTranslate2 float32"]


@pytest.mark.slow
def test_cpu_table_runs_every_kind_of_case_with_bleu(trained_tiny, multi30k_dir, tmp_path):
    data = trained_tiny.parents[1] / "data"
    shortlist = tmp_path / "shortlist.npz"
    subprocess.run([sys.executable, "-m", "xformer_cli", "shortlist", str(data), "--output", str(shortlist)], check=True,
                   capture_output=True)
    out = tmp_path / "rows.json"
    proc = subprocess.run([sys.executable, str(BENCH), "--cpu", str(trained_tiny), str(multi30k_dir / "val.en"),
                           "--reference", str(multi30k_dir / "val.de"), "--shortlist", str(shortlist),
                           "--lines", "12", "--rounds", "1", "--threads", "2", "--cases", ",".join(CASES),
                           str(out)],  # OUT last, as docs/performance.md writes the command
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    found = json.loads(out.read_text())
    assert found["cpu_flags"]
    rows = {r["case"]: r for r in found["rows"]}
    assert sorted(rows) == sorted(CASES), proc.stderr  # none failed
    for row in rows.values():
        assert row["sentences/s"] > 0 and 0 <= row["bleu"] <= 100
    # the table: one line a case, each with its ratio to CTranslate2's best and its BLEU
    table = [line for line in proc.stdout.splitlines() if "sent/s," in line]
    assert len(table) == len(CASES) and all("BLEU" in line for line in table)
    assert "CTranslate2 with its defaults:" in proc.stdout  # the backends of every setting


@pytest.mark.slow
def test_unknown_case_and_shortlist_case_without_a_shortlist_are_refused(tmp_path):
    proc = subprocess.run([sys.executable, str(BENCH), "--cpu", "x.pt", "y.en", "--cases", "xf fp64"],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "unknown case(s) xf fp64" in proc.stderr
    bench = bench_module("decode")
    with pytest.raises(SystemExit, match="needs --shortlist"):
        bench.cpu_case("xf fp32 shortlist", "x.pt", str(tmp_path / "none"), 1, 0, 1, "", None, None)
