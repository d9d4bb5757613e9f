#!/usr/bin/env bash
# Table 3 of the paper (Sec. 6.2), scaled down, on Multi30k EN-DE: every row trained to its
# validation plateau by one rule (--patience, a generous --max-epoch cap), its last checkpoints
# averaged as the paper's, translated on val (beam 4, one length penalty chosen on val for all
# rows), and the table written in the paper's columns with the paper's numbers and a verdict
# against the seed spread (docs/ablations.md).
#
#   bash recipes/ablations/run.sh                      # the whole study; finished steps are skipped
#   JOBS=2 bash recipes/ablations/run.sh               # two rows side by side, one thread each
#   bash recipes/ablations/run.sh base A1-h1 D1-drop0@2   # some rows; NAME@SEED: that row with --seed SEED
#   ROWS_DIR=my-rows bash recipes/ablations/run.sh     # other rows (NAME.yaml: train options)
#
# The whole study is: base and base@2 (the seed spread), the length penalty chosen on base's
# averaged model (in base's job, while the next row trains), every row of ROWS_DIR (FIRST's
# first), then NAME@2 for every row whose difference to the base
# is within twice the seed spread (table.py --second-seeds), then the table. Rows given by name
# run just those (base first: the length penalty comes from it).
#
# Every step of every row is skipped when its output exists, so the study spreads over sittings:
# stop it any time (xf train resumes a row from checkpoint_last.pt) and run it again. With
# JOBS > 1 each row's log goes to WORK_DIR/rows/NAME/run.log and a line a row to the terminal.
#
# Data: MULTI30K_DIR (train/val .en/.de), else ../shared/data/multi30k beside the repository;
# TRAIN_LINES (default 10000): the first that many training pairs (0: all 29,000).
# WORK_DIR (default work-dirs/ablations): data-bin/ (shared by all rows), rows/NAME/, lenpen.txt,
# table.md, table.csv, claims.md, table.png, curves.png, curves.csv, cpu.tsv.
# CONFIG (default base.yaml here), TRAIN_ARGS, TRANSLATE_ARGS: as in recipes/lib.sh;
# LENPENS (default "0.6 1.0 1.4 1.8"): the length penalties tried on base; AVERAGE (default 5): the
# last N numbered (epoch) checkpoints averaged (the paper: 5 for base models); FIRST: the rows
# the whole study runs first, one per claim of the paper, so that a short sitting covers them all.
#
# RECORD (default: none) keeps the study's results beyond a work dir, so that it spreads over
# sittings on different machines (docs/ablations.md's table is results/ablations/record):
#   RECORD=results/ablations/record JOBS=2 bash recipes/ablations/run.sh
# A run recorded there is skipped (its options must be the same: else an error says to remove
# it), a finished one is copied there (rows/SPEC/: train_log.jsonl, val.score.json, cpu.tsv,
# flags.txt, machine.txt), so are the chosen length penalty (lenpen.txt, lenpen/) and the
# study's settings (study.txt: a record made with others is refused), and the second seeds and
# the table come from the record (the table's files are written to WORK_DIR).
set -euo pipefail
source "$(dirname "$0")/../lib.sh"

HERE=$RECIPES/ablations
CONFIG=${CONFIG:-$HERE/base.yaml}
ROWS_DIR=${ROWS_DIR:-$HERE/rows}
WORK_DIR=${WORK_DIR:-$REPO/work-dirs/ablations}
DATA=${MULTI30K_DIR:-$REPO/../shared/data/multi30k}
TRAIN_LINES=${TRAIN_LINES:-10000}
JOBS=${JOBS:-1}
LENPENS=${LENPENS:-0.6 1.0 1.4 1.8}
AVERAGE=${AVERAGE:-5}
FIRST=${FIRST:-D1-drop0 C1-N1 D3-ls0 A1-h1 B1-dk4 E1-learned big}
RECORD=${RECORD:-}
SRC=en TGT=de
[[ $JOBS =~ ^[1-9][0-9]*$ ]] || die "JOBS=$JOBS: a number of rows side by side (1, 2, ...)"
[[ $TRAIN_LINES =~ ^[0-9]+$ ]] || die "TRAIN_LINES=$TRAIN_LINES: a number of training pairs (0: all)"
for split in train val; do
  [[ -f $DATA/$split.$SRC && -f $DATA/$split.$TGT ]] || die "$DATA lacks $split.$SRC or $split.$TGT (set MULTI30K_DIR)"
  check_lines "$DATA/$split.$SRC" "$DATA/$split.$TGT" >/dev/null
done

full_study=0
if (($# == 0)); then  # base (2 seeds) first, then one row per claim of the paper (FIRST), then the others
  full_study=1
  all=$(cd "$ROWS_DIR" && ls -- *.yaml 2>/dev/null | sed 's/\.yaml$//')
  set -- base base@2 $(for r in $FIRST; do grep -qxF -- "$r" <<<"$all" && echo "$r"; done) \
    $(grep -vxF -f <(printf '%s\n' $FIRST) <<<"$all")
fi
[[ $1 == base ]] || set -- base "$@"  # the length penalty of every row is chosen on base
for spec in "$@"; do
  row=${spec%@*}
  [[ -n $row ]] || die "row '$spec': no name"
  [[ $spec != *@* || ${spec#*@} =~ ^[0-9]+$ ]] || die "row '$spec': NAME@SEED needs a number after @"
  [[ $row == base || -f $ROWS_DIR/$row.yaml ]] || die "no row '$row': $ROWS_DIR/$row.yaml not found"
done

# row_flags FILE: a row's `key: value` lines as xf train flags (--key value)
row_flags() {
  awk '{ sub(/#.*/, "") } NF == 2 && $1 ~ /:$/ { k = substr($1, 1, length($1) - 1); gsub(/_/, "-", k); print "--" k; print $2 }' "$1"
}

# timed NAME CMD...: run CMD, adding its CPU seconds (user + system, of its processes) to the
# row's cpu.tsv; kept when it fails too. `times` runs in this shell: a $(...) would count nothing.
timed() {
  local name=$1 rc=0
  shift
  times >"$dir/.times0"
  "$@" || rc=$?
  times >"$dir/.times1"
  awk -v name="$name" 'FNR == 2 { for (i = 1; i <= 2; i++) { split($i, t, /[ms]/); n[FILENAME] += t[1] * 60 + t[2] } }
    END { printf "%s\t%.1f\n", name, n[ARGV[2]] - n[ARGV[1]] }' "$dir/.times0" "$dir/.times1" >>"$dir/cpu.tsv"
  rm -f "$dir/.times0" "$dir/.times1"
  return $rc
}

mkdir -p "$WORK_DIR"
python=$(dirname "$(command -v xf)")/python  # xf's own interpreter: matplotlib with the plot extra
[[ -x $python ]] || python=python3
read -r -a train_args <<<"${TRAIN_ARGS:-}"
read -r -a translate_args <<<"${TRANSLATE_ARGS:-}"
data_bin=$WORK_DIR/data-bin
log "Table 3 ablations: config $CONFIG, rows $*, work dir $WORK_DIR, $JOBS side by side"

trainpref=$DATA/train
if ((TRAIN_LINES > 0)); then  # a subset, so that every row reaches its plateau in minutes
  trainpref=$WORK_DIR/train-subset/train
  if [[ ! -f $trainpref.$TGT ]]; then
    mkdir -p "$WORK_DIR/train-subset"
    head -n "$TRAIN_LINES" "$DATA/train.$SRC" >"$trainpref.$SRC.tmp"
    head -n "$TRAIN_LINES" "$DATA/train.$TGT" >"$trainpref.$TGT.tmp"
    mv "$trainpref.$SRC.tmp" "$trainpref.$SRC" && mv "$trainpref.$TGT.tmp" "$trainpref.$TGT"
  fi
fi
pairs=$TRAIN_LINES
((TRAIN_LINES > 0)) || pairs=all
# the settings every run of a record must share: the configuration (its comments aside), the
# data (training subset and val), and the options of averaging, translating and choosing lenpen
study_settings() {
  printf 'config %s\n' "$(sed 's/#.*//; /^[[:space:]]*$/d' "$CONFIG" | sha256sum | cut -c1-16)"
  printf 'train %s\n' "$(cat "$trainpref.$SRC" "$trainpref.$TGT" | sha256sum | cut -c1-16)"
  printf 'val %s\n' "$(cat "$DATA/val.$SRC" "$DATA/val.$TGT" | sha256sum | cut -c1-16)"
  printf 'train_lines %s\naverage %s\nlenpens %s\ntrain_args %s\ntranslate_args %s\n' \
    "$TRAIN_LINES" "$AVERAGE" "$LENPENS" "${TRAIN_ARGS:-}" "${TRANSLATE_ARGS:-}"
}
if [[ -n $RECORD ]]; then
  mkdir -p "$RECORD/rows"
  RECORD=$(cd "$RECORD" && pwd)
  if [[ -f $RECORD/study.txt ]]; then
    differs=$(diff "$RECORD/study.txt" <(study_settings) | sed -n 's/^> //p' | paste -sd ';' -) || true
    [[ -z $differs ]] || die "$RECORD/study.txt: the record was made with other settings than these ($differs): use another RECORD"
  else
    study_settings >"$RECORD/study.txt.tmp" && mv "$RECORD/study.txt.tmp" "$RECORD/study.txt"
  fi
  if [[ -f $RECORD/lenpen.txt && ! -f $WORK_DIR/lenpen.txt ]]; then
    cp "$RECORD/lenpen.txt" "$WORK_DIR/lenpen.txt"
  elif [[ -f $RECORD/lenpen.txt ]] && ! cmp -s "$RECORD/lenpen.txt" "$WORK_DIR/lenpen.txt"; then
    die "$WORK_DIR/lenpen.txt differs from $RECORD/lenpen.txt: this work dir chose its own length penalty, use another WORK_DIR"
  fi
  note "record: $RECORD ($(find "$RECORD/rows" -mindepth 2 -maxdepth 2 -name val.score.json | wc -l) runs recorded)"
fi

# record_run SPEC FLAGS...: copy a finished run's results into RECORD/rows/SPEC (atomically: a
# directory renamed into place), with the machine it ran on
record_run() {
  local spec=$1 tmp=$RECORD/rows/.$1.tmp
  shift
  rm -rf "$tmp" && mkdir -p "$tmp"
  cp "$dir/checkpoints/train_log.jsonl" "$dir/val.score.json" "$dir/cpu.tsv" "$tmp/"
  printf '%s\n' "$@" >"$tmp/flags.txt"
  "$python" - >"$tmp/machine.txt" <<'PYEOF' || echo "cpu unknown" >"$tmp/machine.txt"
import platform
import torch
from xformer_cli.base.precision import cpu_flags
found = cpu_flags()
try:
    cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
except (OSError, StopIteration):
    cpu = platform.processor() or "unknown"
kinds = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8")
print(f"cpu {cpu}\nflags {' '.join(k for k in kinds if k in found) or '-'}\ntorch {torch.__version__}")
PYEOF
  if [[ $spec == base ]]; then  # and the length penalty chosen on it, which every row uses
    mkdir -p "$RECORD/lenpen"
    cp "$dir"/lenpen/val.hyp.*.score.json "$RECORD/lenpen/"
    cp "$WORK_DIR/lenpen.txt" "$RECORD/lenpen.txt.tmp" && mv "$RECORD/lenpen.txt.tmp" "$RECORD/lenpen.txt"
  fi
  rm -rf "$RECORD/rows/$spec" && mv "$tmp" "$RECORD/rows/$spec"
}

step "preprocess (train: $pairs pairs)" "$data_bin/meta.json" \
  xf preprocess --config "$CONFIG" --destdir "$data_bin" --source-lang "$SRC" --target-lang "$TGT" \
  --trainpref "$trainpref" --validpref "$DATA/val" --overwrite

# choose_lenpen: base's averaged model translates val with each of LENPENS; the best BLEU's
# (ties: the nearer to the paper's 0.6) goes to WORK_DIR/lenpen.txt, for every row
choose_lenpen() {
  [[ -f $WORK_DIR/lenpen.txt ]] && return 0
  mkdir -p "$dir/lenpen"
  local lp
  for lp in $LENPENS; do
    step "base: translate val.$SRC with lenpen $lp (choosing it)" "$dir/lenpen/val.hyp.$lp.score.json" timed lenpen bash -c '
      set -e; xf translate --config "$1" --path "$2/averaged.pt" --input "$3.'$SRC'" --lenpen "$4" "${@:6}" >"$2/lenpen/hyp.tmp"
      xf score --ref "$3.'$TGT'" --hyp "$2/lenpen/hyp.tmp" --json --metrics bleu >"$2/lenpen/score.tmp"
      mv "$2/lenpen/score.tmp" "$5"; rm -f "$2/lenpen/hyp.tmp"' _ "$CONFIG" "$dir" "$DATA/val" "$lp" \
      "$dir/lenpen/val.hyp.$lp.score.json" "${translate_args[@]}"
  done
  python3 - "$dir/lenpen" "$WORK_DIR/lenpen.txt" $LENPENS <<'EOF' || return 1
import json, os, sys
d, out, lps = sys.argv[1], sys.argv[2], sys.argv[3:]
bleu = {lp: json.load(open(f"{d}/val.hyp.{lp}.score.json"))["bleu"]["score"] for lp in lps}
best = max(lps, key=lambda lp: (bleu[lp], -abs(float(lp) - 0.6)))
print("    base's val BLEU by lenpen: " + ", ".join(f"{lp}: {b:.2f}" for lp, b in bleu.items()) + f"; chosen {best}", file=sys.stderr)
open(out + ".tmp", "w").write(best + "\n")
os.replace(out + ".tmp", out)
EOF
}

# row_job SPEC: train, average, translate val (with the length penalty chosen on base: base's
# job chooses it, the others wait for it) and score one row (NAME or NAME@SEED)
row_job() {
  local spec=$1 row=${1%@*} flags=()
  dir=$WORK_DIR/rows/$spec
  mkdir -p "$dir"
  [[ $row == base ]] || mapfile -t flags < <(row_flags "$ROWS_DIR/$row.yaml")
  [[ $spec != *@* ]] || flags+=(--seed "${spec#*@}")
  if [[ -n $RECORD && -f $RECORD/rows/$spec/val.score.json ]]; then  # done in an earlier sitting
    [[ "$(cat "$RECORD/rows/$spec/flags.txt" 2>/dev/null)" == "$(printf '%s\n' "${flags[@]}")" ]] \
      || die "$spec: recorded in $RECORD/rows/$spec with other options than '${flags[*]}': remove that directory to run it again"
    [[ $spec != base || -f $WORK_DIR/lenpen.txt ]] \
      || die "$spec: recorded, but $RECORD has no lenpen.txt: remove $RECORD/rows/base to run it again"
    log "$spec: skipped, recorded in $RECORD/rows/$spec"
    return 0
  fi
  step "$spec: train${flags[*]:+ ${flags[*]}}" "$dir/checkpoints/train.done" timed train train_then_mark "$dir/checkpoints/train.done" \
    xf train "$data_bin" --config "$CONFIG" --save-dir "$dir/checkpoints" "${flags[@]}" "${train_args[@]}"
  step "$spec: average the last $AVERAGE checkpoints" "$dir/averaged.pt" timed average \
    xf average-checkpoints --inputs "$dir/checkpoints" --num-update-checkpoints "$AVERAGE" --output "$dir/averaged.pt"
  [[ $spec != base ]] || choose_lenpen
  while [[ ! -f $WORK_DIR/lenpen.txt ]]; do  # base, side by side, is choosing it
    [[ ! -f $WORK_DIR/.lenpen-failed ]] || die "$spec: no length penalty: base failed to choose it"
    sleep 5
  done
  step "$spec: translate val.$SRC (lenpen $(cat "$WORK_DIR/lenpen.txt"))" "$dir/val.hyp.$TGT" timed translate \
    to_file "$dir/val.hyp.$TGT" xf translate --config "$CONFIG" --path "$dir/averaged.pt" \
    --input "$DATA/val.$SRC" --lenpen "$(cat "$WORK_DIR/lenpen.txt")" "${translate_args[@]}"
  step "$spec: score" "$dir/val.score.json" \
    to_file "$dir/val.score.json" xf score --ref "$DATA/val.$TGT" --hyp "$dir/val.hyp.$TGT" --json --metrics bleu
  [[ -z $RECORD ]] || record_run "$spec" "${flags[@]}"
}

# run_row SPEC: row_job in its own shell; when base fails, the rows waiting for its length
# penalty are told
run_row() {
  (row_job "$1") || { [[ $1 != base ]] || touch "$WORK_DIR/.lenpen-failed"; return 1; }
}

# threads_of SPEC: the CPU threads a row trains with (its row file's `threads:`, else 1), the
# share of the JOBS slots it takes (at most JOBS): a row too big to share the cores runs alone
threads_of() {
  local row=${1%@*} n=1
  [[ $row == base ]] || n=$(awk '{ sub(/#.*/, "") } $1 == "threads:" { print $2 }' "$ROWS_DIR/$row.yaml")
  [[ ${n:-1} =~ ^[1-9][0-9]*$ ]] || n=1
  echo $((${n:-1} < JOBS ? ${n:-1} : JOBS))
}

# rows SPEC...: row_job for each, JOBS threads' worth at a time (threads_of), each in its own
# shell (a failed row stops only itself); fails at the end, naming them, if any row failed
rows() {
  local spec pid failed=() ok=$WORK_DIR/.rows-ok.$$
  local -A taking=()  # pid of each running row -> the slots it takes
  : >"$ok"
  for spec; do
    if ((JOBS == 1)); then
      run_row "$spec" && echo "$spec" >>"$ok" || true
      continue
    fi
    local need used
    need=$(threads_of "$spec")
    while :; do
      used=0
      for pid in "${!taking[@]}"; do
        if kill -0 "$pid" 2>/dev/null; then used=$((used + taking[$pid])); else unset "taking[$pid]"; fi
      done
      ((used + need > JOBS)) || break
      wait -n || true
    done
    mkdir -p "$WORK_DIR/rows/$spec"
    note "$spec: started (log: $WORK_DIR/rows/$spec/run.log)"
    ( run_row "$spec" >>"$WORK_DIR/rows/$spec/run.log" 2>&1 && { echo "$spec" >>"$ok"; note "$spec: done"; } \
      || note "$spec: failed (see $WORK_DIR/rows/$spec/run.log)" ) &
    taking[$!]=$need
  done
  wait
  for spec; do grep -qxF -- "$spec" "$ok" || failed+=("$spec"); done
  rm -f "$ok"
  ((${#failed[@]} == 0)) || die "rows failed: ${failed[*]} (a re-run resumes them; finished steps are kept)"
}

# 1. every row, base first (its job chooses the length penalty), then 2. the second seeds the
# first pass calls for, from the record when there is one
rm -f "$WORK_DIR/.lenpen-failed"
results=${RECORD:-$WORK_DIR}
rows "$@"
if ((full_study)); then
  again=()  # table.py prints one NAME@2 a line, none when no row needs one
  while read -r spec; do [[ -z $spec ]] || again+=("$spec"); done < <("$python" "$HERE/table.py" "$results" "$HERE/paper.csv" --second-seeds)
  if ((${#again[@]})); then
    log "second seeds (difference to the base within twice the seed spread): ${again[*]}"
    rows "${again[@]}"
  fi
fi

# 3. the table (table.md, table.csv, the plots) into WORK_DIR
"$python" "$HERE/table.py" "$results" "$HERE/paper.csv" --out "$WORK_DIR"
