"""The decoding plan (xformer_cli/decode/plan.py): every rule of how a translation runs, as a
table of (options, machine) -> plan fields or the one-line refusal, on the CPU kinds and GPUs
users have (machines are described, not detected: the table holds on any machine that runs it)."""

import os

import pytest

from xformer_cli.decode.plan import PLAN_DEFAULTS, Machine, int8_rule, plan_decoding, plan_scoring, precision_rule, workers_rule
from xformer_cli.base.errors import ConfigError, XfError
from xformer_cli.settings.options import ScorePairsOptions, TranslateOptions

AVX2 = Machine(threads=2, cores=2)  # no bf16 instructions, int8 products not exact
VNNI = Machine(cores=2, int8_exact=True, threads=2, cpu_flags=frozenset({"avx2", "avx512f", "avx512_vnni"}))
AMX = Machine(cores=2, cpu_bf16=True, int8_exact=True, threads=2, cpu_flags=frozenset({"avx2", "avx512_bf16", "amx_int8"}))
EPYC_AVX512 = Machine(cores=2, cpu_bf16=True, int8_exact=True, threads=2, cpu_vendor="AuthenticAMD",
                      cpu_flags=frozenset({"avx2", "avx512f", "avx512_vnni", "avx512_bf16"}))
EPYC_AVX2 = Machine(cores=2, threads=2, cpu_vendor="AuthenticAMD", cpu_flags=frozenset({"avx2"}))
XEON_AMX = Machine(cores=2, cpu_bf16=True, int8_exact=True, threads=2, cpu_vendor="GenuineIntel",
                   cpu_flags=frozenset({"avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_int8", "amx_bf16"}))
VNNI_XEON = Machine(cores=2, int8_exact=True, threads=2, cpu_vendor="GenuineIntel",
                    cpu_flags=frozenset({"avx2", "avx512f", "avx512_vnni"}))
H100 = Machine(cuda=True, cuda_bf16=True, cpu_bf16=True, int8_exact=True, threads=16)
T4 = Machine(cuda=True, threads=8)  # no bf16 on the GPU

EMULATED = "bf16 runs emulated"

PLANS = [
    # (options, machine, expected plan fields)
    (dict(), AVX2, dict(engine="xf", device="cpu", precision="fp32", int8="none", int8_engine=None, step="eager",
                        workers=1, processes=False, threads=0, steering=True, warning=None)),
    (dict(precision="auto"), AMX, dict(precision="bf16", warning=None)),
    (dict(precision="auto"), AVX2, dict(precision="fp32")),
    (dict(precision="bf16"), AVX2, dict(precision="bf16", warning=EMULATED)),
    (dict(device="auto"), H100, dict(device="cuda")),
    (dict(device="auto", precision="auto"), T4, dict(device="cuda", precision="fp32")),
    (dict(device="cuda", precision="fp16"), T4, dict(precision="fp16")),
    (dict(quantize="int8"), AVX2, dict(int8="dynamic", int8_engine="x86", step="eager", precision="fp32")),
    # --int8-engine auto (the default): int8_rule by the CPU's flags, the rule named in the plan
    (dict(quantize="int8"), EPYC_AVX512, dict(int8_engine="fbgemm", rules=(
        "--int8-engine auto: fbgemm, " + int8_rule("AuthenticAMD", EPYC_AVX512.cpu_flags)[1],))),
    (dict(quantize="int8"), EPYC_AVX2, dict(int8_engine="x86")),
    (dict(quantize="int8"), XEON_AMX, dict(int8_engine="fbgemm")),
    (dict(quantize="int8"), VNNI_XEON, dict(int8_engine="x86")),
    (dict(quantize="int8", int8_engine="x86"), EPYC_AVX512, dict(int8_engine="x86", rules=())),  # named: no rule
    (dict(quantize="int8", compile=True), EPYC_AVX512, dict(int8="matmul", int8_engine="fbgemm")),
    (dict(precision="fp32"), EPYC_AVX512, dict(int8_engine=None, rules=())),  # nothing left to the machine
    # --precision auto (the plan's default when a command has no --precision): its rule named
    (dict(precision="auto"), EPYC_AVX512, dict(precision="bf16", rules=(precision_rule("cpu", "bf16"),))),
    (dict(precision="auto"), EPYC_AVX2, dict(precision="fp32", rules=("--precision auto: fp32, the CPU has no native "
                                                                     "bf16",))),
    # --workers 0 (auto): one process per core, one thread each; one on a GPU, one core, or to sample
    (dict(workers=0, quantize="int8"), Machine(threads=2, cores=2), dict(workers=2, processes=True, threads=1)),
    (dict(workers=0), Machine(threads=8, cores=8), dict(workers=8, processes=True, threads=1)),
    (dict(workers=0, threads=4), Machine(threads=8, cores=8), dict(workers=8, threads=1)),
    (dict(workers=0), Machine(threads=1, cores=1), dict(workers=1, processes=False, threads=0)),
    (dict(workers=0, sampling=True), Machine(threads=2, cores=2), dict(workers=1, processes=False)),
    (dict(workers=0, device="cuda"), H100, dict(workers=1, processes=False)),
    (dict(workers=0, engine="ctranslate2", quantize="int8"), Machine(threads=2, cores=2), dict(workers=2)),
    (dict(quantize="int8", int8_engine="onednn"), AMX, dict(int8="dynamic", int8_engine="onednn")),
    (dict(quantize="int8", compile=True), VNNI, dict(int8="matmul", int8_engine="x86", step="aot")),
    (dict(quantize="int8", compile=True, int8_engine="fbgemm"), AMX, dict(int8="matmul", int8_engine="fbgemm")),
    (dict(compile=True), AVX2, dict(step="aot", int8="none")),
    (dict(compile=True, precision="bf16"), AMX, dict(step="aot", precision="bf16")),
    (dict(workers=2), AVX2, dict(workers=2, processes=True, threads=1)),
    (dict(workers=2, threads=8), AVX2, dict(processes=True, threads=4)),
    (dict(workers=3, threads=2), AVX2, dict(workers=2, threads=1)),  # at most one process a usable core
    (dict(workers=16), AVX2, dict(workers=2, processes=True, rules=("--workers 16: 2, the CPU cores this process may "
                                                                  "use",))),
    (dict(workers=16, engine="ctranslate2"), Machine(threads=8, cores=8), dict(workers=8)),  # its inter_threads too
    (dict(workers=16, device="cuda"), H100, dict(workers=16)),  # threads on a GPU: not the CPU's cores
    (dict(threads=3), AVX2, dict(threads=3, processes=False)),
    (dict(workers=2, device="cuda"), H100, dict(workers=2, processes=False, threads=8)),  # threads on a GPU
    (dict(workers=2, compile=True, quantize="int8", shortlist="s.npz"), VNNI,
     dict(processes=True, step="aot", int8="matmul", shortlist="s.npz")),
    (dict(sampling=True), AVX2, dict(steering=False)),
    (dict(glossary="terms.tsv"), AVX2, dict(steering=True)),
    (dict(engine="ctranslate2"), AVX2, dict(engine="ctranslate2", steering=False, int8_engine=None)),
    (dict(engine="ctranslate2", quantize="int8", workers=2, shortlist="s.npz"), AMX,
     dict(engine="ctranslate2", int8="dynamic", int8_engine=None, shortlist="s.npz")),
    (dict(engine="ctranslate2", precision="bf16"), AVX2, dict(precision="bf16", warning=None)),  # CTranslate2 decides
]

def test_compiled_int8_without_vnni_or_amx_runs_the_packed_kernels():
    """--compile --quantize int8 on a CPU without int8 dot-product instructions (torch._int_mm exact
    there or not): the compiled step calls the engine's packed kernels (``packed``), a rule named and
    no warning; with VNNI or AMX and exact products, torch._int_mm in the graph (``matmul``)."""
    exact_avx2 = Machine(int8_exact=True, threads=2, cpu_vendor="AuthenticAMD", cpu_flags=frozenset({"avx2", "fma"}))
    for machine in (exact_avx2, AVX2, EPYC_AVX2):
        plan = plan_decoding(TranslateOptions(path=("m.pt",), quantize="int8", compile=True), machine)
        assert plan.int8 == "packed" and plan.step == "aot" and plan.warning is None
        assert any(r.startswith("--compile --quantize int8: packed") for r in plan.rules), plan.rules
    assert plan_decoding(TranslateOptions(path=("m.pt",), quantize="int8"), exact_avx2).int8 == "dynamic"
    inexact_vnni = Machine(int8_exact=False, threads=2, cpu_flags=frozenset({"avx2", "avx512_vnni"}))
    assert plan_decoding(TranslateOptions(path=("m.pt",), quantize="int8", compile=True), inexact_vnni).int8 == "packed"
    for machine in (VNNI, AMX, EPYC_AVX512, XEON_AMX, VNNI_XEON):
        plan = plan_decoding(TranslateOptions(path=("m.pt",), quantize="int8", compile=True), machine)
        assert plan.int8 == "matmul" and plan.warning is None
        assert not any("packed" in r for r in plan.rules)


REFUSALS = [
    # (options, machine, the one line's words)
    (dict(int8_engine="onednn"), AMX, "--int8-engine onednn is the library of xf's --quantize int8 layers: add"),
    (dict(engine="ctranslate2", quantize="int8", int8_engine="fbgemm"), AMX, "not of --engine ctranslate2"),
    (dict(engine="ctranslate2", path=("a", "b")), AVX2, "--engine ctranslate2 takes one --path"),
    (dict(engine="ctranslate2", sampling=True), AVX2, "--engine ctranslate2 does not sample"),
    (dict(engine="ctranslate2", beam_rule="marian"), AVX2, "--beam-rule marian is a rule of xf's own search"),
    (dict(engine="ctranslate2", compile=True), AVX2, "--engine ctranslate2 runs CTranslate2's"),
    (dict(workers=2, sampling=True), AVX2, "use --workers 1 to sample"),
    (dict(device="cuda"), AMX, "--device cuda: no CUDA device is available"),
    (dict(compile=True, device="auto"), H100, "on CUDA it is not measured yet (bench/gpu.sh)"),
    (dict(compile=True, device="cuda", workers=2), H100, "on CUDA it is not measured yet"),
    (dict(quantize="int8", device="cuda"), H100, "--quantize int8: the xf engine on CUDA has no int8 layers"),
    (dict(quantize="int8", precision="bf16"), AMX, "runs around its int8 layers in fp32, not --precision bf16"),
    (dict(precision="fp16"), AMX, "--precision fp16: the xf engine on a CPU computes in fp32, bf16"),
    (dict(glossary="terms.tsv", sampling=True), AVX2, "--glossary gives lexical constraints, which need xf's beam "
                                                      "search: this runs --sampling"),
    (dict(glossary="terms.tsv", engine="ctranslate2"), AVX2, "this runs CTranslate2 (--engine xf)"),
]


def options(**kw):
    return TranslateOptions(**{"path": ("model.pt",), "device": "cpu", **kw})


@pytest.mark.parametrize("kw, machine, expected", PLANS)
def test_the_plan_of_each_combination(kw, machine, expected):
    plan = plan_decoding(options(**kw), machine)
    assert {name: getattr(plan, name) for name in expected} == {
        name: value for name, value in expected.items() if name != "warning" or value is None
    } | ({"warning": plan.warning} if expected.get("warning") else {})
    if expected.get("warning"):
        assert expected["warning"] in plan.warning


@pytest.mark.parametrize("kw, machine, words", REFUSALS)
def test_each_refusal_is_one_line_naming_the_option(kw, machine, words):
    with pytest.raises((ConfigError, XfError)) as caught:
        plan_decoding(options(**kw), machine)
    message = str(caught.value)
    assert words in message and "\n" not in message


def test_a_command_without_the_engine_options_runs_with_their_defaults():
    """xf score-pairs has --device, --precision and --threads only: the rest as TranslateOptions' defaults."""
    plan = plan_decoding(ScorePairsOptions(path=("m.pt",), source="s", target="t", precision="auto", threads=2), AMX)
    assert (plan.engine, plan.device, plan.precision, plan.int8, plan.step, plan.threads) == \
        ("xf", "cpu", "bf16", "none", "eager", 2)


def test_steering_is_refused_where_the_plan_cannot_meet_it():
    plan = plan_decoding(options(sampling=True), AVX2)
    with pytest.raises(ConfigError, match="'constraints' gives lexical constraints, which need xf's beam search"):
        plan.refuse_steering("'constraints'")
    plan_decoding(options(), AVX2).refuse_steering("'constraints'")  # xf's beam search: no error


def test_the_machine_here_is_read_once_and_consistent():
    here = Machine.here()
    assert here.threads >= 1 and (here.cuda or not here.cuda_bf16)
    assert 1 <= here.cores <= (os.cpu_count() or 1)


def test_the_workers_rule_names_its_reason():
    assert workers_rule(4, "cpu", False) == (4, workers_rule(4, "cpu", False)[1])
    assert "one process per CPU core" in workers_rule(4, "cpu", False)[1]
    assert workers_rule(1, "cpu", False)[0] == 1 and "one CPU core" in workers_rule(1, "cpu", False)[1]
    assert workers_rule(16, "cuda", False)[0] == 1 and workers_rule(16, "cpu", True)[0] == 1


def test_the_translate_summary_prints_the_rules_that_fired(tmp_path, capsys):
    """xf translate's summary table: a row per rule (--workers 0's, --precision auto's), the int8
    engine's rule beside the engine it chose."""
    from rich.console import Console

    from xformer_cli.commands.translate import _summary
    from xformer_cli.decode.translate import Stats

    console = Console(file=open(tmp_path / "summary.txt", "w"), width=300)
    rules = (workers_rule(2, "cpu", False)[1], "--int8-engine auto: x86, any other CPU")
    _summary(console, Stats(lines=3), 1.0, options(workers=0), None, "x86 (--int8-engine auto: x86, any other CPU)",
             rules)
    console.file.close()
    text = (tmp_path / "summary.txt").read_text()
    assert "--workers auto: 2, one process per CPU core" in text
    assert text.count("--int8-engine auto") == 1  # in the int8 engine's row, not again as a rule row


# -- the reverse scorer's plan (--reverse-path): the plan's rules, whatever the forward engine ---------
SCORER_PLANS = [  # (forward options, machine, what the scorer's plan is)
    (dict(engine="ctranslate2", precision="auto"), AMX, dict(engine="xf", precision="bf16", device="cpu")),
    (dict(engine="ctranslate2", precision="auto"), AVX2, dict(engine="xf", precision="fp32")),
    (dict(quantize="int8", workers=2, compile=True, shortlist="sl.npz"), AMX,
     dict(engine="xf", int8="none", step="eager", workers=1, processes=False, shortlist=None, precision="fp32")),
    (dict(device="cuda", precision="fp16"), H100, dict(device="cuda", precision="fp16")),
]


@pytest.mark.parametrize("kw, machine, expected", SCORER_PLANS)
def test_the_reverse_scorers_plan_is_the_plans(kw, machine, expected):
    opts = options(reverse_path=("rev.pt",), output_format="jsonl", **kw)
    plan = plan_scoring(opts, plan_decoding(opts, machine), machine)
    assert {name: getattr(plan, name) for name in expected} == expected


def test_the_reverse_scorer_in_fp16_on_a_cpu_is_refused_by_the_plan():
    opts = options(reverse_path=("rev.pt",), output_format="jsonl", engine="ctranslate2", precision="fp16")
    with pytest.raises(ConfigError, match="--precision fp16: the xf engine on a CPU computes in fp32, bf16"):
        plan_scoring(opts, plan_decoding(opts, AMX), AMX)


def test_one_precision_default():
    """The flag's default is the plan's: a command without --precision runs as one that leaves it out."""
    assert PLAN_DEFAULTS["precision"] == TranslateOptions.__dataclass_fields__["precision"].default
    assert plan_decoding(options(), AMX).precision == plan_decoding(
        ScorePairsOptions(path=("m.pt",), source="s", target="t", device="cpu"), AMX).precision


@pytest.mark.slow
def test_ctranslate2_with_a_reverse_model_scores_or_refuses_in_one_line(spm_model, tmp_path):
    """The two commands that failed: --precision auto ended in KeyError 'auto', --precision fp16 opened
    the reverse model in fp16 on a CPU."""
    pytest.importorskip("ctranslate2")
    from typer.testing import CliRunner

    from xformer_cli.cli import app

    from helpers import cli_fails, random_checkpoint

    ckpt = random_checkpoint(tmp_path / "m.pt", spm_model, max_positions=64)
    runner = CliRunner()
    assert runner.invoke(app, ["export", "ctranslate2", "--path", ckpt, "--output", str(tmp_path / "ct2")]).exit_code == 0
    (tmp_path / "in.txt").write_text("A dog runs.\nTwo men sit.\n", encoding="utf-8")
    run = ["translate", "--engine", "ctranslate2", "--path", tmp_path / "ct2", "--input", tmp_path / "in.txt",
           "--output-format", "jsonl", "--reverse-path", ckpt, "--device", "cpu", "--max-len-a", "0",
           "--max-len-b", "5", "--quiet"]
    result = runner.invoke(app, [str(a) for a in [*run, "--precision", "auto"]])
    assert result.exit_code == 0, result.output
    assert all("confidence" in line for line in result.output.splitlines() if line.startswith("{"))
    cli_fails([*run, "--precision", "fp16"], "--precision fp16")


# -- which batches the --workers processes take: the plan's rule (DecodingPlan.to_workers) ----------------
ROUTES = [  # (options, sampled, constrained, alternatives, to the workers)
    (dict(workers=2), False, False, 0, True),  # plain (and prefixed) beam search
    (dict(workers=2), False, True, 0, False),  # constraints: this process
    (dict(workers=2), False, False, 3, False),  # alternatives: this process
    (dict(workers=2), True, False, 0, False),  # a sampled batch: this process
    (dict(workers=1), False, False, 0, False),  # no worker processes
    (dict(workers=2, device="cuda"), False, False, 0, False),  # threads on a GPU, no processes
]


@pytest.mark.parametrize("kw, sampled, constrained, alternatives, expected", ROUTES)
def test_which_batches_the_workers_take(kw, sampled, constrained, alternatives, expected):
    plan = plan_decoding(options(**kw), H100 if kw.get("device") == "cuda" else AVX2)
    assert plan.to_workers(sampled, constrained, alternatives) is expected


def test_a_workers_plan_is_its_parents_on_one_in_process_worker():
    parent = plan_decoding(options(workers=2, quantize="int8"), AMX)
    child = parent.worker_plan()
    assert (child.workers, child.processes, child.to_workers(False, False, 0)) == (1, False, False)
    assert (child.int8, child.precision, child.threads, child.device) == (parent.int8, parent.precision,
                                                                           parent.threads, parent.device)
