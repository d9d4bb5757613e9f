#!/usr/bin/env bash
# xf on one GPU in at most 7 minutes, most valuable first: the environment; the CUDA tests (a
# timeout per test); base and big training throughput in bf16 at --max-tokens 25000 (MFU against
# the datasheet's dense bf16 peak, a matmul peak measured in the same run beside it, peak memory,
# base against torch.nn.Transformer); base beam-4 decoding; base compiled (on what the stages
# before it leave, up to 120 s); a first BLEU (base on Multi30k EN-DE for 120 s at the
# paper's batch size, test2016 with beam 4); the compiled reference if time is left.
#
# Before, on a machine with Multi30k (fills the git-ignored bench/gpu-data/; copy it along with
# the checkout):
#   python bench/gpu_data.py --multi30k DIR
# On the GPU machine, the one command; OUT_DIR (default ./gpu-results) gets results.md,
# results.json and a log per stage:
#   bash bench/gpu.sh [OUT_DIR]
# XF_GPU_TARBALL=FILE also packs OUT_DIR into FILE after every stage and at any exit (a trap), so
# that what finished comes back whatever happens:
#   XF_GPU_TARBALL=/somewhere/gpu-results.tgz bash bench/gpu.sh /tmp/g
# A check of every stage at tiny sizes on the CPU (make test runs it: tests/test_gpu_script.py):
#   bash bench/gpu.sh --dry-run [OUT_DIR]
#
# Needs python3 with torch (CUDA), typer, sentencepiece, sacrebleu, rich, pyyaml, numpy, pytest
# (pytest-timeout for the per-test timeout); no network, no pip. Every stage runs under `timeout`
# (its whole process group: torchrun's workers too) within the budget (XF_GPU_BUDGET_S, default
# 420 s), and 185 s are kept for the BLEU stage. Each bench process gets the stage's end as
# XF_BENCH_DEADLINE, ends its runs before it and writes each row the moment it is measured. After
# every stage OUT_DIR/results.json and results.md hold everything measured so far; results.md is
# printed at the end, and the exit status is 1 if a stage failed. XF_GPU_STAGES=a,b runs only
# those stages. Nothing writes checkpoints but the BLEU stage (one model-only file, in /dev/shm
# where it has room, checked before training, as are the imports it needs after training).
# docs/gpu.md says more.
set -u
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DRY=0
if [ "${1:-}" = "--dry-run" ]; then DRY=1; shift; fi
OUT="$(mkdir -p "${1:-./gpu-results}" && cd "${1:-./gpu-results}" && pwd)"
PY="${PYTHON:-python3}"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export XF_GPU_DATA="${XF_GPU_DATA:-$REPO/bench/gpu-data}"
BUDGET="${XF_GPU_BUDGET_S:-$([ $DRY = 1 ] && echo 1800 || echo 420)}"
SCALE="${XF_GPU_STAGE_SCALE:-$([ $DRY = 1 ] && echo 4 || echo 1)}"  # the dry run's CPU is slow
QUALITY_S=$((185 * SCALE))
START=$(date +%s)
rm -rf "$OUT"/stages.jsonl "$OUT"/*.json "$OUT"/*.log "$OUT"/cuda-tests.xml "$OUT"/results.md "$OUT"/bench-data
cd "$REPO"

# bench_train's settings per row; the wmt-like data is made once (by train-base) into OUT/bench-data
export XF_BENCH_TRAIN_DATA=wmt-like XF_BENCH_TRAIN_DATA_DIR="$OUT/bench-data" XF_BENCH_TRAIN_ROUNDS=1
if [ $DRY = 1 ]; then
  # fp32: this CPU class has no bf16 matrix instructions; "eager" backend: dynamo's graphs and
  # recompilations without code generation (tests/test_compile.py covers aot_eager)
  export XF_BENCH_DRY_RUN=1 CUDA_VISIBLE_DEVICES="" XF_BENCH_COMPILE_BACKEND=eager
  BASE=(XF_BENCH_TRAIN_ARCH=tiny XF_BENCH_TRAIN_MAX_TOKENS=600 XF_BENCH_TRAIN_PAIRS=3000 XF_BENCH_TRAIN_DEVICES=cpu
        XF_BENCH_TRAIN_PRECISIONS=fp32 XF_BENCH_TRAIN_UPDATES=4)
  BIG=("${BASE[@]}")
else
  BASE=(XF_BENCH_TRAIN_ARCH=base XF_BENCH_TRAIN_MAX_TOKENS=25000 XF_BENCH_TRAIN_PAIRS=100000
        XF_BENCH_TRAIN_DEVICES=cuda XF_BENCH_TRAIN_PRECISIONS=bf16 XF_BENCH_TRAIN_UPDATES=40 XF_BENCH_TRAIN_SECONDS=20)
  BIG=("${BASE[@]/XF_BENCH_TRAIN_ARCH=base/XF_BENCH_TRAIN_ARCH=big}")
fi

# XF_GPU_TARBALL=PATH (the documented device command gives $OUT/gpu-results.tgz): the results so
# far packed into PATH, with results.md and results.json beside it, after every stage and once
# more on any exit (a failed stage, the budget spent, TERM): what finished always comes back,
# even when the device's own time limit kills this script between two stages.
pack() {
  [ -n "${XF_GPU_TARBALL:-}" ] || return 0
  local dest; dest="$(dirname "$XF_GPU_TARBALL")"
  mkdir -p "$dest" && tar -C "$OUT" --exclude=bench-data --exclude="$(basename "$XF_GPU_TARBALL")" \
    -czf "$XF_GPU_TARBALL.part" . 2>/dev/null && mv -f "$XF_GPU_TARBALL.part" "$XF_GPU_TARBALL"
  for f in results.md results.json; do
    [ -f "$OUT/$f" ] && [ "$OUT" != "$(cd "$dest" && pwd)" ] && cp "$OUT/$f" "$dest/"
  done
  return 0
}

# A stage's `timeout` leads its own process group: if this script is stopped, stop the stage too.
CHILD=
trap '[ -n "$CHILD" ] && kill -TERM "$CHILD" 2>/dev/null; exit 143' TERM INT HUP
trap '"$PY" bench/gpu_report.py "$OUT" >/dev/null 2>&1; pack' EXIT

# stage NAME SECONDS COMMAND...: run under timeout (TERM, then KILL 10 s later) within the budget,
# less the BLEU stage's reserve for every stage before it.
stage() {
  local name=$1 want=$(($2 * SCALE)) keep=$QUALITY_S; shift 2
  case ",${XF_GPU_STAGES:-$name}," in *",$name,"*) ;; *) return ;; esac
  case $name in quality|train-base-compiled-reference) keep=0 ;; esac
  case ",${XF_GPU_STAGES:-quality}," in *,quality,*) ;; *) keep=0 ;; esac
  local left=$((BUDGET - ($(date +%s) - START) - keep - 5)) t rc status began
  t=$(( want < left ? want : left ))
  began=$(date +%s)
  if [ "$t" -lt 15 ]; then
    rc=-1; status="skipped: out of budget"
  elif [ "$name" = quality ] && [ ! -f "$XF_GPU_DATA/m30k-ende/meta.json" ]; then
    rc=-1; status="skipped: no $XF_GPU_DATA (run python bench/gpu_data.py before, and carry bench/gpu-data)"
  else
    echo "== $name (at most ${t}s)" >&2
    XF_BENCH_DEADLINE=$((began + t - 12)) timeout --kill-after=10 "$t" "$@" > "$OUT/$name.log" 2>&1 &
    CHILD=$!
    wait "$CHILD"
    rc=$?
    CHILD=
    case $rc in 0) status=ok ;; 124|137) status="timed out after ${t}s" ;; *) status=failed ;; esac
  fi
  printf '{"name": "%s", "rc": %s, "seconds": %s, "allowed": %s, "status": "%s"}\n' \
    "$name" "$rc" "$(( $(date +%s) - began ))" "$t" "$status" >> "$OUT/stages.jsonl"
  echo "   $status ($(( $(date +%s) - began ))s of ${t}s; log $OUT/$name.log)" >&2
  "$PY" bench/gpu_report.py "$OUT" || true
  pack
}

PER_TEST=()
# signal: the timeout is raised inside the test, so test_cuda.run_group stops torchrun's group
if "$PY" -c "import pytest_timeout" 2>/dev/null; then PER_TEST=(--timeout 60 --timeout-method signal); fi

stage info 20 "$PY" bench/gpu_report.py --info "$OUT/info.json"
# -v: each outcome is in the log as its test ends (the JUnit XML only at the end): a stage cut
# short still reports the tests that finished
stage cuda-tests 80 "$PY" -m pytest -v -rA -m cuda -p no:cacheprovider "${PER_TEST[@]}" tests/test_cuda.py \
  --junitxml="$OUT/cuda-tests.xml"
stage train-base 60 env "${BASE[@]}" XF_BENCH_TRAIN_COMPILE=0 "$PY" bench/bench_train.py "$OUT/train-base.json"
stage train-big 45 env "${BIG[@]}" XF_BENCH_TRAIN_COMPILE=0 XF_BENCH_TRAIN_REFERENCE=0 \
  "$PY" bench/bench_train.py "$OUT/train-big.json"
# a random base model (the dry run's: tiny), made-up words, WMT-like lengths: CUDA fp32 and bf16
# against the CPU's fp32 on the first lines
if [ $DRY = 1 ]; then DECODE=(--arch tiny --vocab-size 1000 --lines 40 --cpu-lines 10 --cases "xf fp32")
else DECODE=(--arch base --vocab-size 37000 --lines 1000 --cpu-lines 30 --cases "xf fp32,xf cuda fp32,xf cuda bf16"); fi
stage decode-base 45 "$PY" bench/decode.py --source wmt-like "${DECODE[@]}" --rounds 1 \
  --batch "${XF_BENCH_DECODE_BATCH:-128}" --json "$OUT/decode-base.json"
stage train-base-compiled 120 env "${BASE[@]}" XF_BENCH_TRAIN_COMPILE=1 XF_BENCH_TRAIN_REFERENCE=0 \
  "$PY" bench/bench_train.py "$OUT/train-base-compiled.json"
stage quality 185 "$PY" bench/gpu_quality.py "$OUT/quality.json"
stage train-base-compiled-reference 120 env "${BASE[@]}" XF_BENCH_TRAIN_COMPILE=1 XF_BENCH_TRAIN_ENGINES=reference \
  "$PY" bench/bench_train.py "$OUT/train-base-compiled-reference.json"
rm -rf "$OUT/bench-data"
echo "results: $OUT/results.md ($(( $(date +%s) - START ))s)" >&2
cat "$OUT/results.md"
# The exit status: 1 when a stage failed or timed out (the dry run: or was skipped), so that the
# dry run in make test fails with it.
BAD='"status": "(failed|timed out'"$([ $DRY = 1 ] && echo '|skipped')"')'
if grep -Eq "$BAD" "$OUT/stages.jsonl" 2>/dev/null; then exit 1; fi
