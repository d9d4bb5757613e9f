#!/usr/bin/env bash
# xf on one GPU, prepared to the minute: CUDA tests, base/big training throughput (MFU against a
# bf16 matmul peak measured in the same run, peak memory, eager and compiled, against a plain
# torch.nn.Transformer of the same shape), and base beam-4 decoding speed.
#
#   bash bench/gpu.sh [OUT_DIR]          # default ./gpu-results/; about 8 minutes on one H200
#   bash bench/gpu.sh --dry-run [OUT]    # the same stages at tiny sizes on the CPU (a check)
#
# Needs python3 with torch (CUDA), typer, sentencepiece, sacrebleu, rich, pyyaml, numpy; no
# network, no pip. Every stage runs under `timeout` within an overall budget (XF_GPU_BUDGET_S,
# default 470 s), most valuable first, so a hang costs one stage, never the run. After every
# stage OUT_DIR/results.json and OUT_DIR/results.md hold everything measured so far.
set -u
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DRY=0
if [ "${1:-}" = "--dry-run" ]; then DRY=1; shift; fi
OUT="$(mkdir -p "${1:-./gpu-results}" && cd "${1:-./gpu-results}" && pwd)"
PY="${PYTHON:-python3}"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
BUDGET="${XF_GPU_BUDGET_S:-$([ $DRY = 1 ] && echo 1500 || echo 470)}"
SCALE="${XF_GPU_STAGE_SCALE:-$([ $DRY = 1 ] && echo 3 || echo 1)}"
START=$(date +%s)
rm -f "$OUT"/stages.jsonl "$OUT"/*.json "$OUT"/cuda-tests.xml "$OUT"/results.md
cd "$REPO"

if [ $DRY = 1 ]; then
  export XF_BENCH_DRY_RUN=1 CUDA_VISIBLE_DEVICES=""
  BASE=(XF_BENCH_TRAIN_ARCH=tiny XF_BENCH_TRAIN_MAX_TOKENS=600 XF_BENCH_TRAIN_PAIRS=3000 XF_BENCH_TRAIN_DEVICES=cpu
        XF_BENCH_TRAIN_PRECISIONS=bf16 XF_BENCH_TRAIN_UPDATES=4 XF_BENCH_TRAIN_ROUNDS=1 XF_BENCH_TRAIN_SECONDS=120)
  BIG=("${BASE[@]}" XF_BENCH_TRAIN_REFERENCE=0)
else
  BASE=(XF_BENCH_TRAIN_ARCH=base XF_BENCH_TRAIN_MAX_TOKENS=25000 XF_BENCH_TRAIN_DATA=wmt-like
        XF_BENCH_TRAIN_PAIRS=100000 XF_BENCH_TRAIN_DEVICES=cuda XF_BENCH_TRAIN_PRECISIONS=bf16
        XF_BENCH_TRAIN_UPDATES=30 XF_BENCH_TRAIN_ROUNDS=1 XF_BENCH_TRAIN_SECONDS=60)
  BIG=(XF_BENCH_TRAIN_ARCH=big XF_BENCH_TRAIN_MAX_TOKENS=25000 XF_BENCH_TRAIN_DATA=wmt-like
       XF_BENCH_TRAIN_PAIRS=100000 XF_BENCH_TRAIN_DEVICES=cuda XF_BENCH_TRAIN_PRECISIONS=bf16
       XF_BENCH_TRAIN_UPDATES=20 XF_BENCH_TRAIN_ROUNDS=1 XF_BENCH_TRAIN_SECONDS=60 XF_BENCH_TRAIN_REFERENCE=0)
fi
export XF_BENCH_TRAIN_DATA=wmt-like

# A stage's `timeout` leads its own process group: if this script is stopped, stop the stage too
# (timeout passes the signal on to its command).
CHILD=
trap '[ -n "$CHILD" ] && kill -TERM "$CHILD" 2>/dev/null; exit 143' TERM INT HUP

# stage NAME SECONDS COMMAND...: run under timeout (TERM, then KILL 10 s later), within the budget.
stage() {
  local name=$1 want=$(($2 * SCALE)); shift 2
  case ",${XF_GPU_STAGES:-$name}," in *",$name,"*) ;; *) return ;; esac
  local left=$((BUDGET - ($(date +%s) - START) - 5)) t rc status began
  t=$(( want < left ? want : left ))
  began=$(date +%s)
  if [ "$t" -lt 15 ]; then
    rc=-1; status="skipped: out of budget"
  else
    echo "== $name (at most ${t}s)" >&2
    timeout --kill-after=10 "$t" "$@" > "$OUT/$name.log" 2>&1 &
    CHILD=$!
    wait "$CHILD"
    rc=$?
    CHILD=
    case $rc in 0) status=ok ;; 124|137) status="timed out after ${t}s" ;; *) status=failed ;; esac
  fi
  printf '{"name": "%s", "rc": %s, "seconds": %s, "status": "%s"}\n' \
    "$name" "$rc" "$(( $(date +%s) - began ))" "$status" >> "$OUT/stages.jsonl"
  echo "   $status ($(( $(date +%s) - began ))s; log $OUT/$name.log)" >&2
  "$PY" bench/gpu_report.py "$OUT" || true
}

stage info 30 "$PY" -c '
import json, os, platform, subprocess, sys, torch
info = {"torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
        "cpus": os.cpu_count(), "dry run": os.environ.get("XF_BENCH_DRY_RUN") == "1"}
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    info.update(gpu=p.name, gpu_memory_gib=round(p.total_memory / 2**30, 1), gpus=torch.cuda.device_count(),
                bf16=torch.cuda.is_bf16_supported(), capability=".".join(map(str, torch.cuda.get_device_capability())))
flags = set(open("/proc/cpuinfo").read().split()) if os.path.exists("/proc/cpuinfo") else set()
info["cpu_flags"] = " ".join(sorted(flags & {"avx2", "avx512f", "avx512_bf16", "amx_bf16"}))
json.dump(info, open(sys.argv[1], "w"), indent=1)
print(info)' "$OUT/info.json"
stage cuda-tests 120 "$PY" -m pytest -q -m cuda -p no:cacheprovider tests/test_cuda.py --junitxml="$OUT/cuda-tests.xml"
stage train-base 110 env "${BASE[@]}" XF_BENCH_TRAIN_COMPILE=0 "$PY" bench/bench_train.py "$OUT/train-base.json"
stage decode-base 60 "$PY" bench/decode_speed.py "$OUT/decode-base.json"
stage train-big 70 env "${BIG[@]}" XF_BENCH_TRAIN_COMPILE=0 "$PY" bench/bench_train.py "$OUT/train-big.json"
stage train-base-compiled 150 env "${BASE[@]}" XF_BENCH_TRAIN_COMPILE=1 XF_BENCH_TRAIN_SECONDS=$((70 * SCALE)) \
  "$PY" bench/bench_train.py "$OUT/train-base-compiled.json"
stage train-big-compiled 150 env "${BIG[@]}" XF_BENCH_TRAIN_COMPILE=1 XF_BENCH_TRAIN_SECONDS=$((70 * SCALE)) \
  "$PY" bench/bench_train.py "$OUT/train-big-compiled.json"
echo "results: $OUT/results.md ($(( $(date +%s) - START ))s)" >&2
