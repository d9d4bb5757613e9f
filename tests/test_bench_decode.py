"""bench/decode.py, the one decoding-speed bench (docs/benchmarks.md's tables come from it): its
case words, its refusals (the decoding plan's), its rows, and one real run of every kind of case
with a shortlist and a reference, so that the script a CPU kind is measured with does not rot
between uses. Speeds are not asserted (make bench's rule): the rows, ratios, BLEU and counts are."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import bench_module

BENCH = Path(__file__).resolve().parents[1] / "bench" / "decode.py"


def test_a_case_is_words_and_a_wrong_word_is_named():
    decode = bench_module("decode")
    case = decode.parse_case("xf int8 onednn shortlist workers2 compile")
    assert (case.engine, case.precision, case.int8_engine, case.shortlist, case.workers, case.compile) == (
        "xf", "int8", "onednn", True, 2, True)
    assert decode.parse_case("ct2 int8 mkl avx512").env == {"CT2_USE_MKL": "1", "CT2_FORCE_CPU_ISA": "AVX512"}
    assert decode.parse_case("greedy").engine == "xf" and decode.parse_case("greedy").greedy
    assert decode.parse_case("xf int8 workersauto").workers == 0  # --workers 0: the plan's rule
    for name, message in (("xf fp64", "unknown word 'fp64'"), ("xf onednn", "add int8"),
                          ("xf mkl", "CTranslate2's backends"), ("ct2 compile", "xf's own step"),
                          ("xf workers0", "unknown word 'workers0'"), ("ct2 int8 workersauto", "xf's --workers 0")):
        with pytest.raises(ValueError, match=message):
            decode.parse_case(name)


def test_the_plan_refuses_a_case_before_it_runs(tmp_path):
    decode = bench_module("decode")
    job = dict(checkpoint=str(tmp_path / "m.pt"), ct2_dir=None, beam=4, batch=64, threads=0, shortlist=None,
               cpu_flags="avx2", max_len_a=1.0, max_len_b=50)
    why = decode.refusal(decode.parse_case("xf cuda compile"), job)  # the plan's one line, with CUDA or without
    assert "no CUDA device is available" in why or "on CUDA it is not measured yet" in why
    assert "no shortlist" in decode.refusal(decode.parse_case("xf shortlist"), job)
    assert decode.refusal(decode.parse_case("xf int8 fbgemm"), job) is None
    avx2 = {**job, "isa": "avx2"}  # --isa avx2: what an AVX2-only CPU lacks is skipped, saying so
    for name in ("xf bf16", "ct2 int8 avx512"):
        assert "AVX2-only CPU has no native bf16" in decode.refusal(decode.parse_case(name), avx2)


def test_rows_give_same_run_ratios_identical_outputs_and_bleu():
    decode = bench_module("decode")
    refs = ["a man rides a red bike", "two dogs play in the snow"]
    limits = dict(limit="per sentence, at most 57", longest_output=9)
    best = {"a": dict(seconds=2.0, tokens=40, outputs=refs, backend="b", threads=1, peak_mib=10.0, **limits),
            "b": dict(seconds=1.0, tokens=40, outputs=[refs[0], "a cat sleeps"], backend="b", threads=1,
                      peak_mib=10.0, compile_seconds=3.5, built=1, loaded=0, **limits)}
    rows = {r["case"]: r for r in decode.result_rows({"cpu_flags": "avx2"}, best, "a", refs)}
    assert rows["a"]["value"] == 1.0 and rows["b"]["value"] == 2.0 and rows["b"]["ratio"] == 2.0
    assert (rows["a"]["identical"], rows["b"]["identical"]) == (2, 1)
    assert rows["a"]["bleu"] == 100.0 and rows["b"]["bleu"] < 100.0
    assert rows["b"]["compile_seconds"] == 3.5 and "CPU flags avx2" in rows["b"]["note"]
    assert rows["a"]["longest_output"] == 9 and "length limit per sentence, at most 57, longest output 9" in rows["a"]["note"]


def test_the_cpu_kinds_row_sets_each_engines_best_and_defaults_side_by_side():
    decode = bench_module("decode")
    rows = [dict(case=name, value=value, bleu=28.0) for name, value in (
        ("xf int8", 200.0), ("xf int8 workers2", 300.0), ("xf int8 shortlist workers2", 450.0),
        ("ct2 int8", 100.0), ("ct2 int8 workers2", 250.0), ("ct2 int8 shortlist workers2", 300.0))]
    row = decode.kind_row({"cpu_flags": "avx2 fma"}, rows)
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == "avx2 fma"
    assert cells[2].startswith("**1.50x**: xf int8 shortlist workers2 450.0, BLEU 28.00 / ct2 int8 shortlist workers2")
    assert cells[3].startswith("**1.20x**: xf int8 workers2 300.0") and "/ ct2 int8 workers2 250.0" in cells[3]
    assert cells[4].startswith("**2.00x**: xf int8 200.0")
    assert decode.kind_row({"cpu_flags": "avx2"}, rows[:3]) is None  # CTranslate2 did not run: no row
    # at equal BLEU: a faster xf case 0.4 BLEU below CTranslate2's best is not xf's best
    rows.append(dict(case="xf bf16 compile shortlist workers2", value=500.0, bleu=27.6))
    assert "**1.50x**: xf int8 shortlist workers2" in decode.kind_row({"cpu_flags": "avx2"}, rows)
    rows[-1]["bleu"] = 29.0  # above CTranslate2's: it counts
    assert "**1.67x**: xf bf16 compile shortlist workers2" in decode.kind_row({"cpu_flags": "avx2"}, rows)
    args, cases = decode.parse_args(["--cases", "kind"])
    assert args.against == "ct2 int8" and {"xf int8", "ct2 int8"} <= {c.name for c in cases}


@pytest.mark.slow
def test_every_kind_of_case_runs_with_ratios_and_bleu(trained_tiny, multi30k_dir, tmp_path):
    pytest.importorskip("ctranslate2", reason="the export extra (CTranslate2) is installed by make test")
    data = trained_tiny.parents[1] / "data"
    shortlist = tmp_path / "shortlist.npz"
    subprocess.run([sys.executable, "-m", "xformer_cli", "shortlist", str(data), "--output", str(shortlist)], check=True,
                   capture_output=True)
    cases = ["xf fp32", "xf int8 fbgemm shortlist workers2", "xf compile", "ct2 int8 workers2", "ct2-engine fp32"]
    out = tmp_path / "rows.json"
    proc = subprocess.run([sys.executable, str(BENCH), "--path", str(trained_tiny), "--source",
                           str(multi30k_dir / "val.en"), "--reference", str(multi30k_dir / "val.de"), "--shortlist",
                           str(shortlist), "--lines", "12", "--rounds", "2", "--threads", "2", "--cases",
                           ",".join(cases + ["xf cuda compile"]), "--against", "ct2 int8 workers2", "--json", str(out)],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    found = json.loads(out.read_text())
    assert found["cpu_flags"] and "its defaults" in found["ct2_backends"]
    rows = {r["case"]: r for r in found["rows"]}
    assert sorted(rows) == sorted(cases), found["skipped"]  # none failed
    assert list(found["skipped"]) == ["xf cuda compile"]  # refused by the plan, with CUDA or without
    assert rows["ct2 int8 workers2"]["ratio"] == 1.0
    for row in rows.values():
        assert row["value"] > 0 and row["tokens_per_s"] > 0 and 0 <= row["bleu"] <= 100 and row["lines"] == 12
        assert 0 <= row["identical"] <= 12 and row["ratio"] > 0
    compiled = rows["xf compile"]  # its package built in one round or loaded (the best round's figures)
    # a build takes seconds; a load can round to 0.0 s in the row
    assert compiled["built"] + compiled["loaded"] >= 1 and (compiled["compile_seconds"] > 0 or not compiled["built"])
    assert "step aot" in compiled["backend"] and "compile_seconds" not in rows["xf fp32"]
    assert "int8 dynamic (fbgemm)" in rows["xf int8 fbgemm shortlist workers2"]["backend"]
    assert rows["ct2-engine fp32"]["backend"].startswith("engine ctranslate2")
    # the table: the CPU flags, one line a case with its ratio and BLEU, the skipped one with the plan's reason
    assert f"CPU flags: {found['cpu_flags']}" in proc.stdout
    table = [line for line in proc.stdout.splitlines() if " sent/s " in line]
    assert len(table) == len(cases) and all("x ct2 int8 workers2" in line and "BLEU" in line for line in table)
    # one length rule for both engines, in the header; each row its limit and its longest output
    assert "Both engines: length limit floor(1 x |X| + 50) subwords before eos" in proc.stdout
    assert all(" limit per " in line and ", longest " in line for line in table)
    assert rows["ct2 int8 workers2"]["limit"].startswith("per batch, at most ")
    assert rows["xf fp32"]["limit"] == rows["ct2 int8 workers2"]["limit"].replace("batch", "sentence")
    assert "xf cuda compile" in proc.stdout and "skipped: " in proc.stdout


@pytest.mark.slow
def test_wmt_like_sources_need_no_data_and_a_bad_case_is_refused(tmp_path):
    out = tmp_path / "rows.json"
    proc = subprocess.run([sys.executable, str(BENCH), "--source", "wmt-like", "--arch", "tiny", "--vocab-size", "300",
                           "--lines", "6", "--cpu-lines", "4", "--rounds", "1", "--cases", "xf fp32,xf greedy",
                           "--json", str(out), "--isa", "avx2"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(out.read_text())["cpu_flags"].startswith("AVX2 emulated (--isa avx2) on ")
    rows = json.loads(out.read_text())["rows"]
    assert [(r["case"], r["lines"]) for r in rows] == [("xf fp32", 4), ("xf greedy", 4)]
    assert rows[0]["ratio"] == 1.0 and rows[1]["value"] > 0
    proc = subprocess.run([sys.executable, str(BENCH), "--cases", "xf fp64"], capture_output=True, text=True)
    assert proc.returncode == 2 and "unknown word 'fp64'" in proc.stderr
    proc = subprocess.run([sys.executable, str(BENCH), "--cases", "xf fp32", "--against", "ct2 fp32"],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "--against 'ct2 fp32' is not one of --cases" in proc.stderr


def test_profile_engines_groups_operators_counts_steps_and_splits_a_step_cost():
    profile = bench_module("profile_engines")
    assert profile.kind_of("quantized::linear_dynamic") == "int8 products"
    assert profile.kind_of("aten::addmm") == "float products" and profile.kind_of("aten::index_select") == "cache gathers"
    assert profile.kind_of("aten::topk") == "top-k" and profile.kind_of("aten::_log_softmax") == "log-softmax"
    assert profile.kind_of("aten::empty") == "other operators"

    class Chars:  # one id a character
        def encode(self, texts, out_type=int):
            return [list(range(len(t))) for t in texts]

    # sources of lengths 3, 1, 2 in batches of 2, longest first: (0, 2) then (1); outputs' lengths + eos
    # and sentence steps: each output and its eos
    assert profile.steps_of(["abcd", "a", "ab"], [[1, 1, 1], [1], [1, 1]], 2, Chars()) == (5 + 2, 5 + 2 + 3)
    # made from overhead 2 ms a step and 0.125 ms a sentence step: 100 steps of 700 sentence
    # steps take 0.2875 s, 20 steps of 720 take 0.13 s
    rows = [dict(engine="xf", precision="int8", layout="1 thread", batch=b, steps=n, sentence_steps=t,
                 seconds=(2.0 * n + 0.125 * t) / 1000) for b, n, t in ((8, 100, 700), (64, 20, 720))]
    overhead, per = profile.split_step_cost(rows, 8, 64)[("xf", "int8", "1 thread")]
    assert per == pytest.approx(0.125) and overhead == pytest.approx(2.0)
    assert profile.kind_of("xf::compiled_step") == "the compiled step"


@pytest.mark.slow
def test_profile_engines_runs_every_layout_of_both_engines(trained_tiny, multi30k_dir, tmp_path):
    pytest.importorskip("ctranslate2", reason="the export extra (CTranslate2) is installed by make test")
    out = tmp_path / "profile.json"
    proc = subprocess.run([sys.executable, str(BENCH.parent / "profile_engines.py"), "--path", str(trained_tiny),
                           "--source", str(multi30k_dir / "val.en"), "--lines", "8", "--batches", "2,4", "--rounds", "1",
                           "--json", str(out)], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    found = json.loads(out.read_text())
    assert len(found["rows"]) == 2 * 2 * 3 * 2 and not any("error" in r for r in found["rows"])
    assert len(found["split"]) == 2 * 2 * 3
    profiles = found["profiles"]
    assert profiles["int8"]["kinds"]["int8 products"][1] > 0 and profiles["fp32"]["kinds"]["float products"][1] > 0
    assert "int8 products" not in profiles["fp32"]["kinds"] and profiles["fp32"]["wall"] > 0
    assert "| CTranslate2 int8 | 2 searches, 1 thread each | 4 |" in proc.stdout


def test_gemm_paths_times_each_layer_through_each_library(tmp_path):
    """bench/gemm_paths.py: every layer of a step through MKL, oneDNN (fp32, bf16), fbgemm and
    oneDNN int8 and torch._int_mm, with MKL's banner; the table has a row per layer."""
    out = tmp_path / "gemm.json"
    proc = subprocess.run([sys.executable, str(BENCH.parent / "gemm_paths.py"), "--rows", "8", "--d-model", "32",
                           "--ffn", "64", "--vocab", "100", "--rounds", "1", "--json", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    found = json.loads(out.read_text())
    paths = {r["path"] for r in found["rows"]}
    assert {"fp32, MKL (F.linear)", "bf16, oneDNN (F.linear)", "int8, torch.ao fbgemm"} <= paths
    assert len({r["layer"] for r in found["rows"]}) == 5 and all(r["gflops"] > 0 for r in found["rows"])
    assert found["mkl"] and "| output projection |" in proc.stdout


# -- fairness: both engines under one length rule (STYLE.md item 22) -------------------------------
def never_ending_checkpoint(path: Path, multi30k_dir: Path) -> str:
    """A random tiny model (max_positions 128) that never ends a sentence: eos's output bias -1e4."""
    import torch

    from helpers import learn_spm, random_checkpoint
    from xformer_cli.model.checkpoint import load_checkpoint, save_checkpoint
    from xformer_cli.text.vocab import EOS_ID

    lines = (multi30k_dir / "train.en").read_text(encoding="utf-8").splitlines()[:500]
    random_checkpoint(path, learn_spm(lines, 200), output_bias=True)
    ckpt = load_checkpoint(path)
    ckpt["model"]["output_bias"][EOS_ID] = -1e4
    save_checkpoint(path, ckpt)
    assert torch.equal(load_checkpoint(path)["model"]["output_bias"], ckpt["model"]["output_bias"])
    return str(path)


def test_the_header_names_the_length_rule_both_engines_share(tmp_path):
    decode = bench_module("decode")
    job = dict(max_len_a=1.0, max_len_b=50, max_positions=1024)
    rule = decode.length_rule(job)
    assert rule.startswith("length limit floor(1 x |X| + 50) subwords before eos, at most 1023: xf per sentence")
    assert "CTranslate2 per batch sorted by length (max_decoding_length = the bound of the batch's longest source)" in rule
    assert decode.length_rule(dict(job, max_len_a=0, max_len_b=256)).startswith("length limit 256 subwords")
    header = dict(checkpoint="m.pt", source="s", lines=2, beam=4, batch=64, threads=2, torch="2", cpu_flags="avx2",
                  length_rule=rule)
    assert f"Both engines: {rule}" in decode.table(header, [], {}, "xf fp32").splitlines()[1]
    # a bound is xf's own (search.max_output_lengths): the batch's longest source, clamped to the positions
    assert decode.batch_limit([3, 7, 5], job) == 57 and decode.batch_limit([2000], job) == 1023
    assert decode.batch_limit([7], dict(job, max_len_a=1.5, max_len_b=0)) == 10


def test_serve_against_libretranslate_runs_both_under_argos_rules():
    """bench/serve_vs_libretranslate.py: xf serve's search is argostranslate's (its beam setting, its
    length penalty) under CTranslate2's default length limit, and the header says so."""
    ctranslate2 = pytest.importorskip("ctranslate2", reason="installed by make test")
    settings = pytest.importorskip("argostranslate.settings", reason="installed by make test")
    import inspect
    import re

    import argostranslate.translate

    bench = bench_module("serve_vs_libretranslate")
    default = re.search(r"max_decoding_length: int = (\d+)", ctranslate2.Translator.translate_batch.__doc__)
    assert bench.ARGOS["max_decoding_length"] == int(default.group(1))
    assert bench.ARGOS["beam"] == settings.beam_size
    assert f"length_penalty={bench.ARGOS['lenpen']}" in inspect.getsource(argostranslate.translate)
    search = bench.ARGOS_SEARCH
    assert search[search.index("--max-len-a") + 1] == "0" and search[search.index("--max-len-b") + 1] == "256"
    line = bench.settings_line(2)
    assert "beam 4" in line and "at most 256 subwords" in line and "2 thread(s) each" in line


@pytest.mark.slow
def test_a_model_that_never_ends_stops_at_the_same_length_in_both_engines(multi30k_dir, tmp_path):
    """xf and CTranslate2's own search, each as bench/decode.py runs it, on a model that never ends:
    every sentence alone (batch 1), both stop at xf's bound |X| + 50 (clamped to the positions);
    in batches, CTranslate2's longest output is the bound of the batch's longest source, as xf's."""
    pytest.importorskip("ctranslate2", reason="the export extra (CTranslate2) is installed by make test")
    decode = bench_module("decode")
    from xformer_cli.model.checkpoint import load_checkpoint
    from xformer_cli.text.vocab import load_sentencepiece

    ckpt = never_ending_checkpoint(tmp_path / "never.pt", multi30k_dir)
    sp = load_sentencepiece(load_checkpoint(ckpt)["spm_model"], ckpt)
    val = (multi30k_dir / "val.en").read_text(encoding="utf-8").splitlines()
    words = " ".join(val[2:12]).split()
    long = next(" ".join(words[:n]) for n in range(len(words)) if len(sp.encode(" ".join(words[:n]))) > 90)
    lines = [val[0], val[1][:12], long]  # the last one's bound is clamped to the positions: 127
    source = tmp_path / "src.txt"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    args, cases = decode.parse_args(["--path", ckpt, "--source", str(source), "--batch", "1", "--threads", "1",
                                     "--cases", "xf fp32,ct2 fp32"])
    job = decode.prepare(args, tmp_path, cases)
    bounds = [min(len(ids) + 50, 127) for ids in sp.encode(lines)]
    assert bounds[-1] == 127 and len(set(bounds)) == 3
    for line, bound in zip(lines, bounds):
        found = {case: decode.measure_case({**job, "lines": [line], "case": case}) for case in ("xf fp32", "ct2 fp32")}
        assert [r["longest_output"] for r in found.values()] == [bound, bound], line
    batched = {case: decode.measure_case({**job, "batch": 2, "case": case}) for case in ("xf fp32", "ct2 fp32")}
    assert [r["longest_output"] for r in batched.values()] == [127, 127]
    assert batched["xf fp32"]["limit"] == "per sentence, at most 127"
    assert batched["ct2 fp32"]["limit"] == "per batch, at most 127"
