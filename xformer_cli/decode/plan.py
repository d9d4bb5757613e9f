"""The decoding plan: every decision of how a translation runs, made once, from the options and the machine.

``plan_decoding(options, machine)`` is a pure function (no torch calls, no files): the
decoding options (``TranslateOptions``, or ``xf serve``'s per direction) and the facts of the
machine (``Machine``: a CUDA device and its bf16, the CPU's bf16 instructions, whether int8
products are exact here) become a ``DecodingPlan``, or a ConfigError of one line naming the
option. ``xf translate``, ``xf serve``, ``xf score-pairs`` and the benches open their engines
from a plan; nothing else decides. The rules, each once (the table test is
tests/test_decoding_plan.py):

- engine: ``ctranslate2`` takes one --path (ensembles are xf's), no --sampling, no --compile (its
  own search), and no --int8-engine (it brings its own int8 kernels);
- device: ``auto`` is CUDA where there is one, else the CPU; ``cuda`` without one is refused;
- precision: ``precision.resolve_precision`` over what the engine computes in here;
- int8: ``--int8-engine`` names torch's engine of --quantize int8 and nothing else; ``auto`` (the
  default) is ``int8_rule``'s choice by the CPU's flags, never by timing;
  eager int8 is torch.ao's dynamic layers of that engine; with --compile, on a CPU with int8
  dot-product instructions (VNNI, AMX) where ``torch._int_mm`` is exact, the decoder's int8
  products are compiled ahead of time (``matmul``); elsewhere the compiled step calls the
  engine's packed int8 kernels (``packed``: torch._int_mm is far slower there, or saturates);
  the encoder keeps the engine's;
- step: --compile is the decoder step compiled ahead of time on the CPU; on CUDA it is refused
  until bench/gpu.sh has measured it there;
- workers: on the CPU each its own process (no shared interpreter lock), elsewhere a thread;
  sampling runs in one (its random stream runs through the batches in order); each worker gets
  its share of --threads; ``--workers 0`` (auto) is ``workers_rule``'s number, by the CPU's cores;
  on the CPU a number above the cores this process may use is capped at them (a rule named);
- steering (lexical constraints, glossaries): xf's beam search only, not CTranslate2's and not sampling.

Every choice an option leaves to the machine (``auto``) is made by a rule of its facts, never by
timing at run time, and the plan names each rule that fired (``DecodingPlan.rules``): xf
translate's summary and bench/decode.py print them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Optional

from ..base.errors import ConfigError, XfError
from ..base.precision import precision_warning, resolve_precision, xf_precisions
from ..settings.options import TranslateOptions

DEFAULT_INT8_ENGINE = TranslateOptions.__dataclass_fields__["int8_engine"].default  # "auto": int8_rule, by the CPU's flags


def int8_rule(vendor: str, flags: frozenset) -> tuple[str, str]:
    """(torch's int8 engine, the rule that chose it) for a CPU of ``vendor`` (/proc/cpuinfo's
    vendor_id) and instruction-set ``flags``, each rule from same-run measurements of
    bench/decode.py (docs/benchmarks.md, "Every engine of one CPU")."""
    if "amx_int8" in flags:
        return "fbgemm", ("a CPU with AMX (fbgemm at least level with x86, which sends some shapes to oneDNN; "
                          "docs/benchmarks.md)")
    if vendor == "AuthenticAMD" and "avx512_vnni" in flags:
        return "fbgemm", "an AMD CPU with AVX-512 VNNI (fbgemm ahead of x86; docs/benchmarks.md)"
    return "x86", "any other CPU: torch's pick of fbgemm or oneDNN by shape (docs/benchmarks.md)"


def workers_rule(cores: int, device: str, sampling: bool) -> tuple[int, str]:
    """(decoding processes, the rule that chose them) for ``--workers 0`` (auto) on a machine of
    ``cores`` usable CPU cores: one process per core, each on one thread, from the same-run
    measurements on every CPU kind in docs/benchmarks.md (two one-thread processes ahead of one
    search on two threads on each); one where there is one core, on a GPU, or to sample."""
    if device != "cpu":
        return 1, "--workers auto: 1 on a GPU (its batches are its parallelism)"
    if sampling:
        return 1, "--workers auto: 1 to sample (the random stream runs through the batches in order)"
    if cores < 2:
        return 1, "--workers auto: 1, one CPU core"
    return cores, (f"--workers auto: {cores}, one process per CPU core on one thread each (ahead of one search on "
                   "every core on each CPU kind measured; docs/benchmarks.md)")


def precision_rule(device: str, precision: str) -> str:
    """The rule --precision auto followed to ``precision`` on ``device``."""
    where = "the GPU" if device == "cuda" else "the CPU"
    if precision == "bf16":
        return f"--precision auto: bf16, {where} multiplies bf16 natively" + (
            " (avx512_bf16 or AMX)" if device == "cpu" else "")
    return f"--precision auto: fp32, {where} has no native bf16"


INT8_DOT_PRODUCTS = frozenset({"avx512_vnni", "avx_vnni", "amx_int8"})  # int8 pairs into int32 in one instruction


@dataclass(frozen=True)
class Machine:
    """What the plan needs to know of the machine. ``here()`` reads it."""

    cuda: bool = False  # a CUDA device is visible
    cuda_bf16: bool = False  # it multiplies bf16 natively (sm_80+)
    cpu_bf16: bool = False  # avx512_bf16 or AMX: bf16 is native on the CPU
    int8_exact: bool = False  # torch._int_mm is exact here (VNNI or AMX)
    threads: int = 1  # torch's default thread count
    cpu_vendor: str = ""  # /proc/cpuinfo's vendor_id (GenuineIntel, AuthenticAMD, ...)
    cpu_flags: frozenset = frozenset()  # /proc/cpuinfo's flags
    cores: int = 1  # CPU cores this process may run on (its affinity)

    @classmethod
    def here(cls) -> "Machine":
        import torch

        from ..base.precision import cpu_bf16_instructions, cpu_flags, cpu_vendor, cuda_has_bf16
        from ..model.quantization import int8_matmul_exact

        cuda = torch.cuda.is_available()
        return cls(cuda=cuda, cuda_bf16=cuda and cuda_has_bf16(torch.device("cuda")),
                   cpu_bf16=bool(cpu_bf16_instructions()), int8_exact=int8_matmul_exact(),
                   threads=torch.get_num_threads(), cpu_vendor=cpu_vendor(), cpu_flags=frozenset(cpu_flags()),
                   cores=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)

@dataclass(frozen=True)
class DecodingPlan:
    engine: str  # xf | ctranslate2
    device: str  # cpu | cuda
    precision: str  # fp32 | bf16 | fp16 (ctranslate2: the asked one; its engine resolves it)
    int8: str  # none | dynamic (torch.ao's layers) | matmul (the decoder's products compiled ahead of time)
    #          | packed (torch.ao's packed kernels called from the compiled decoder step)
    int8_engine: Optional[str]  # torch's quantized engine of the dynamic layers (matmul: the encoder's)
    step: str  # eager | aot
    workers: int
    processes: bool  # the workers are processes (the CPU), else threads
    threads: int  # torch threads of each worker (0: torch's default)
    shortlist: Optional[str]
    steering: bool  # lexical constraints and glossaries can be met (xf's beam search)
    warning: Optional[str] = None  # runs, but badly here (emulated bf16)
    rules: tuple[str, ...] = ()  # the rules that chose what the options left to the machine (auto), one line each

    def rule(self, option: str) -> Optional[str]:
        """The rule that chose ``option``'s value (``"--int8-engine"``), None where none fired."""
        return next((rule for rule in self.rules if rule.startswith(option + " ")), None)

    def worker_plan(self) -> "DecodingPlan":
        """The plan each --workers process opens its engine with: this one, as one in-process worker."""
        return replace(self, workers=1, processes=False)

    def to_workers(self, sampled: bool, constrained: bool, alternatives: int) -> bool:
        """Whether a batch goes to the --workers processes: plain and prefixed beam search only; a
        sampled batch (its random stream runs through the batches in order), a constrained one and
        one asking for alternatives run in this process."""
        return self.processes and not sampled and not constrained and not alternatives

    def refuse_steering(self, what: str) -> None:
        """Raise the one line saying why ``what`` (constraints, a glossary) cannot be met here."""
        if not self.steering:
            raise ConfigError(f"{what} gives lexical constraints, which need xf's beam search: this runs "
                              + ("CTranslate2 (--engine xf)" if self.engine == "ctranslate2" else "--sampling"))


# The engine options a plan reads, with the value a command that lacks one runs with (xf
# score-pairs has no --engine, --quantize, --compile, ...): TranslateOptions declares them all, and
# its defaults are the only ones (one precision default: the flag's).
PLAN_DEFAULTS = {name: TranslateOptions.__dataclass_fields__[name].default for name in (
    "engine", "device", "precision", "quantize", "int8_engine", "compile", "workers", "threads", "shortlist",
    "sampling", "glossary", "beam_rule")}


def plan_scoring(options, forward: DecodingPlan, machine: Machine) -> DecodingPlan:
    """The plan of the reverse scorer (``--reverse-path``: forced decoding of whole batches in this
    process): ``plan_decoding``'s for xf's engine, eager, one worker and no shortlist (the forward
    model's would not fit the reverse vocabulary), on the forward plan's device with the options'
    precision and threads; its rules and refusals are the plan's (``--precision auto`` resolved,
    fp16 refused on a CPU), whatever engine the forward model runs on."""
    from types import SimpleNamespace

    return plan_decoding(SimpleNamespace(path=tuple(options.reverse_path), device=forward.device,
                                         precision=options.precision, threads=options.threads), machine)


def plan_decoding(options, machine: Machine) -> DecodingPlan:
    """The plan of ``options`` (TranslateOptions, or any options object: a field it lacks runs
    with ``PLAN_DEFAULTS``') on ``machine``; the number of --path checkpoints from ``path``."""
    o = {name: getattr(options, name, default) for name, default in PLAN_DEFAULTS.items()}
    engine, int8_engine, workers = o["engine"], o["int8_engine"], o["workers"]
    if int8_engine != DEFAULT_INT8_ENGINE and (o["quantize"] != "int8" or engine != "xf"):
        raise ConfigError(f"--int8-engine {int8_engine} is the library of xf's --quantize int8 layers"
                          + (": add --quantize int8" if engine == "xf" else
                             ", not of --engine ctranslate2 (which brings its own)"))
    if engine == "ctranslate2":
        if len(options.path) != 1:
            raise ConfigError("--engine ctranslate2 takes one --path (ensembles are xf-engine only)")
        if o["sampling"]:
            raise ConfigError("--engine ctranslate2 does not sample: use the xf engine for --sampling")
        if o["compile"]:
            raise ConfigError("--compile compiles xf's own search: --engine ctranslate2 runs CTranslate2's")
        if o["beam_rule"] != "fairseq":
            raise ConfigError(f"--beam-rule {o['beam_rule']} is a rule of xf's own search: --engine ctranslate2 "
                              "runs CTranslate2's")
    device, rules = _device(o["device"], machine), []
    if workers == 0:
        workers, rule = workers_rule(machine.cores, device, o["sampling"])
        rules.append(rule)
    if workers > 1 and o["sampling"]:
        raise ConfigError(f"--workers {workers} decodes batches in parallel, but --sampling's random "
                          "stream runs through the batches in order: use --workers 1 to sample")
    if workers > max(machine.cores, 1) and device == "cpu":  # more would wait for each other, each a model's memory
        rules.append(f"--workers {workers}: {max(machine.cores, 1)}, the CPU cores this process may use")
        workers = max(machine.cores, 1)
    precision, warning = _precision(engine, device, o["precision"], o["quantize"], machine)
    int8 = "none" if o["quantize"] != "int8" else "dynamic" if not o["compile"] else int8_compiled_rule(machine)
    if o["compile"] and device == "cuda":
        raise ConfigError("--compile compiles the decoder step ahead of time on the CPU; on CUDA it is not "
                          "measured yet (bench/gpu.sh): drop --compile")
    if int8 == "packed":
        rules.append("--compile --quantize int8: packed, the int8 engine's kernels inside the compiled step (no "
                     "VNNI or AMX here: torch._int_mm is far slower or inexact; docs/benchmarks.md)")
    threads = max(1, (o["threads"] or machine.threads) // workers) if o["threads"] > 0 or workers > 1 else 0
    if o["precision"] == "auto" and engine == "xf" and o["quantize"] != "int8":
        rules.append(precision_rule(device, precision))
    if int8 != "none" and engine == "xf" and int8_engine == "auto":
        int8_engine, rule = int8_rule(machine.cpu_vendor, machine.cpu_flags)
        rules.append(f"--int8-engine auto: {int8_engine}, {rule}")
    plan = DecodingPlan(engine=engine, device=device, precision=precision, int8=int8,
                        int8_engine=int8_engine if int8 != "none" and engine == "xf" else None,
                        step="aot" if o["compile"] else "eager", workers=workers,
                        processes=workers > 1 and device == "cpu", threads=threads, shortlist=o["shortlist"],
                        steering=engine == "xf" and not o["sampling"], warning=warning, rules=tuple(rules))
    if o["glossary"]:
        plan.refuse_steering("--glossary")
    return plan


def int8_compiled_rule(machine: Machine) -> str:
    """The int8 layers of a compiled decoder step: ``matmul`` (torch._int_mm in the graph) where the
    CPU has int8 dot-product instructions and torch._int_mm is exact, else ``packed`` (torch.ao's
    packed kernels called from the graph). Without VNNI or AMX, _int_mm runs far slower than eager
    int8, and the packed step at least as fast (docs/benchmarks.md, "The packed int8 compiled
    step")."""
    return "matmul" if machine.int8_exact and machine.cpu_flags & INT8_DOT_PRODUCTS else "packed"


def _device(option: str, machine: Machine) -> str:
    if option == "auto":
        return "cuda" if machine.cuda else "cpu"
    if option == "cuda" and not machine.cuda:
        raise XfError("--device cuda: no CUDA device is available (use --device cpu)")
    return option


def _precision(engine: str, device: str, precision: str, quantize: str, machine: Machine) -> tuple[str, Optional[str]]:
    """(precision, warning): xf's by ``resolve_precision`` over what it computes in here;
    CTranslate2's resolved by its engine, which asks CTranslate2 what its device computes in."""
    if engine != "xf":
        return precision, None
    import torch  # a torch.device names the device in resolve_precision's messages: no hardware call

    where = torch.device(device)
    available = xf_precisions(where, machine.cuda_bf16 if device == "cuda" else machine.cpu_bf16)
    resolved = resolve_precision(where, precision, quantize, available, "xf")
    return resolved, precision_warning(where, resolved, available)
