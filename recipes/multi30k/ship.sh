#!/usr/bin/env bash
# Multi30k, from a teacher to every runtime a student is deployed to, each checked where it runs:
#   distill.sh PAIR student: the teacher (cpu.yaml, run.sh's) -> distilled data -> the portable
#     student (student.yaml: tensor2tensor sinusoids, a decoder that starts from zero) -> averaged
#     (chosen on val) -> CTranslate2 int8 export, the shortlist of its training pairs
#   the model for Hugging Face: MarianMT takes the paper's sinusoids only, so the first of the
#     student and the teacher that xf export huggingface takes (the table says which, and why)
#   xf export argos (int8), marian, bergamot (int8 + shortlist), huggingface -> $WORK_DIR/ship/
#   each runtime translates test2016 (SHIP_LINES of it), and xf translate the same with each
#     row's search and weights (the reference a row's "same as xf" counts against)
#   the table: $WORK_DIR/ship.md (markdown) and ship.json, and the trainings' time
#
#   bash recipes/multi30k/ship.sh [en-de|en-fr]
#   RUNTIMES="xf ctranslate2 marian" SHIP_LINES=100 bash recipes/multi30k/ship.sh en-de
#
# Runtimes (RUNTIMES, words of): xf (float32), xf-int8-shortlist (--quantize int8 --shortlist),
# ctranslate2 (ctranslate2.Translator), huggingface (transformers' generate on the export),
# argos (argostranslate on the installed package, in a home under $WORK_DIR/ship/home), marian
# (pymarian), bergamot (the page in headless Chromium: int8 with the shortlist), bergamot-float32 (the
# page of the float32 model, no shortlist), libretranslate (one request to a
# LibreTranslate server, in bench/libretranslate_env.py's venv). A runtime that cannot run here
# (its package, the browser or the Bergamot engine missing) has a row "not run: why".
#
# Settings (environment, all optional):
#   TEACHER, TEACHER_SEEDS, TEACHER_LENPEN, TEACHER_ARGS, DISTILL_NBEST, FILTER_DROP, CONFIG (the
#                    student's YAML), PREPROCESS_ARGS, TRAIN_ARGS, ...: as recipes/multi30k/distill.sh
#                    takes them (TEACHER default: work-dirs/multi30k-PAIR/averaged.pt, trained by run.sh
#                    with cpu.yaml when missing, or TEACHER_SEEDS of them)
#   WORK_DIR         outputs (default work-dirs/multi30k-PAIR-ship); a re-run skips finished steps
#   RUNTIMES         the rows, in order (default: all of the above)
#   SHIP_LINES       translate the first this many lines of test2016 (default: all 1,000)
#   BEAM (4), LENPEN (default: the student's, chosen on val), MAX_LEN (256 subwords), BATCH (16
#                    lines), THREADS (1): the search of every row, score / |Y|^LENPEN (the length
#                    penalty every other runtime has; xf's --lenpen-style length)
#                    (a re-run with other values than $WORK_DIR/ship's is refused: delete ship/ first)
#   BERGAMOT_PACKAGE the npm package @browsermt/bergamot-translator 0.4.9 (default: .bergamot/..., make bergamot)
# A step that fails stops the recipe with one line, "ship.sh: step 'NAME' failed: ...", the last
# line of its messages; its whole log is $WORK_DIR/ship/logs/NAME.log.
set -euo pipefail
source "$(dirname "$0")/../lib.sh"

PAIR=${1:-en-de}
[[ $PAIR == en-de || $PAIR == en-fr ]] || die "usage: $0 [en-de|en-fr]"
SRC=${PAIR%-*} TGT=${PAIR#*-}
WORK_DIR=${WORK_DIR:-$REPO/work-dirs/multi30k-$PAIR-ship}
ALL="xf xf-int8-shortlist ctranslate2 huggingface argos marian bergamot bergamot-float32 libretranslate"
RUNTIMES=${RUNTIMES:-$ALL}
BEAM=${BEAM:-4} MAX_LEN=${MAX_LEN:-256} BATCH=${BATCH:-16} THREADS=${THREADS:-1}
BERGAMOT_PACKAGE=${BERGAMOT_PACKAGE:-$REPO/.bergamot/node_modules/@browsermt/bergamot-translator}
export WORK_DIR
S=$WORK_DIR/ship
mkdir -p "$S/logs" "$S/runs"
PY=$(sed -n '1s/^#! *//p' "$(command -v xf)")  # the Python that runs xf: it imports xf and the runtimes
[[ $PY != *" "* && -x $PY ]] || PY=python3
HELPER=$RECIPES/multi30k/ship_runtimes.py

# fail NAME MESSAGE: the one line of a failed step, and the exit
fail() {
  printf 'ship.sh: step '\''%s'\'' failed: %s\n' "$1" "$2" >&2
  exit 1
}

# ship_step NAME DONE CMD...: run CMD unless DONE exists; its messages shown and kept in
# $S/logs/NAME.log; a failure is one line naming the step, with the last line of its messages.
ship_step() {
  local name=$1 done=$2 log rc last
  shift 2
  if [[ -e $done ]]; then
    log "$name: skipped, $done exists"
    return 0
  fi
  log "$name"
  log=$S/logs/${name//[^A-Za-z0-9_.-]/_}.log
  exec 3>&1
  set +e
  "$@" 2>&1 >&3 3>&- | tee "$log" >&2
  rc=${PIPESTATUS[0]}
  set -e
  exec 3>&-
  if ((rc != 0)); then
    last=$(sed 's/\x1b\[[0-9;]*m//g' "$log" | grep -v '^[[:space:]]*$' | tail -n 1)
    fail "$name" "${last:-exit $rc, no message} (log: $log)"
  fi
  [[ -e $done ]] || fail "$name" "it wrote no $done"
}

for word in $RUNTIMES; do
  [[ " $ALL " == *" $word "* ]] || fail "settings" "RUNTIMES: '$word' is no runtime; choose among: $ALL"
done
[[ -z ${SHIP_LINES:-} || $SHIP_LINES =~ ^[1-9][0-9]*$ ]] || fail "settings" "SHIP_LINES=$SHIP_LINES is not a line count"
wants() { [[ " $RUNTIMES " == *" $1 "* ]]; }

source "$RECIPES/multi30k/data.sh"
multi30k_data  # sets DATA

ship_step "distill" "$WORK_DIR/shortlist.npz" bash "$RECIPES/multi30k/distill.sh" "$PAIR" student
# the teacher the student learned from (TEACHER, or the default one or ensemble distill.sh trained
# and chose): for Hugging Face and the trainings' time
[[ -f $WORK_DIR/teacher.txt ]] || fail "distill" "it named no teacher in $WORK_DIR/teacher.txt: delete $WORK_DIR/shortlist.npz"
read -r -a teachers <"$WORK_DIR/teacher.txt"
LENPEN=${LENPEN:-$("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["chosen"]["lenpen"])' "$WORK_DIR/choice.json" 2>/dev/null || echo 0.6)}
# the translations in $S hold for one search and test set: a re-run with others is refused, not mixed in
settings="lines ${SHIP_LINES:-all}, beam $BEAM, lenpen $LENPEN, max_len $MAX_LEN, batch $BATCH, threads $THREADS"
[[ -f $S/settings.txt ]] || echo "$settings" >"$S/settings.txt"
[[ $(<"$S/settings.txt") == "$settings" ]] ||
  fail "settings" "$S translated with $(<"$S/settings.txt"), not $settings: delete $S to translate anew"

# test_slice: the first SHIP_LINES lines of test2016 (all without it), both sides
test_slice() {
  local side
  for side in "$SRC" "$TGT"; do
    head -n "${SHIP_LINES:-1000000}" "$DATA/test2016.$side" >"$S/test2016.$side.tmp" && mv "$S/test2016.$side.tmp" "$S/test2016.$side" || return
  done
}
ship_step "test set" "$S/test2016.$TGT" test_slice

ship_step "model for Hugging Face" "$S/hf-model.tsv" \
  to_file "$S/hf-model.tsv" "$PY" "$HELPER" hf-model "$WORK_DIR/averaged.pt" "${teachers[@]}"

student=$WORK_DIR/averaged.pt
wants argos || wants libretranslate &&
  ship_step "export argos" "$S/student.argosmodel" \
    xf export argos --path "$student" --output "$S/student.argosmodel" --quantization int8
wants marian &&
  ship_step "export marian" "$S/marian" \
    xf export marian --path "$student" --output "$S/marian" --beam-size "$BEAM" --lenpen "$LENPEN"
# the page twice: int8 with the shortlist (what ship.sh deploys), and float32 (what it is weighed against)
for page in bergamot bergamot-float32; do
  wants $page || continue
  if [[ -f $BERGAMOT_PACKAGE/package.json ]]; then
    rm -f "$S/$page.not-run"  # (ship_runtimes.py reads it: the row's reason not to run)
    weights=(--quantization int8 --shortlist "$WORK_DIR/shortlist.npz")
    [[ $page == bergamot ]] || weights=(--quantization float32)
    ship_step "export $page" "$S/$page" \
      xf export bergamot --path "$student" --output "$S/$page" "${weights[@]}" \
      --beam-size "$BEAM" --lenpen "$LENPEN" --bergamot-package "$BERGAMOT_PACKAGE"
  else
    echo "no Bergamot engine at $BERGAMOT_PACKAGE (make bergamot installs it)" >"$S/$page.not-run"
  fi
done
wants huggingface &&
  ship_step "export huggingface" "$S/hf" \
    xf export huggingface --path "$(cut -f1 "$S/hf-model.tsv")" --output "$S/hf" --beam-size "$BEAM" --lenpen "$LENPEN"

search=(--beam "$BEAM" --lenpen "$LENPEN" --max-len "$MAX_LEN" --batch "$BATCH" --threads "$THREADS")
for runtime in $RUNTIMES; do
  ref=$("$PY" "$HELPER" reference "$runtime")  # the xf run it is compared with, run first
  ship_step "xf translate: $ref" "$S/runs/$ref.json" \
    "$PY" "$HELPER" run "$ref" --work "$WORK_DIR" --source "$S/test2016.$SRC" --pair "$PAIR" "${search[@]}"
  # a row that did not run is not finished: tried again (its package or browser may have come since)
  if grep -q '"not_run"' "$S/runs/$runtime.json" 2>/dev/null; then rm "$S/runs/$runtime.json"; fi
  ship_step "translate: $runtime" "$S/runs/$runtime.json" \
    "$PY" "$HELPER" run "$runtime" --work "$WORK_DIR" --source "$S/test2016.$SRC" --pair "$PAIR" "${search[@]}"
done

read -r -a rows <<<"$RUNTIMES"
rm -f "$WORK_DIR/ship.md"  # the table, always anew: it costs nothing, and RUNTIMES may have changed
ship_step "table" "$WORK_DIR/ship.md" "$PY" "$HELPER" table "${rows[@]}" --work "$WORK_DIR" --ref "$S/test2016.$TGT" >/dev/null
printf '\n'
cat "$WORK_DIR/ship.md"
logs=()
for t in "${teachers[@]}"; do logs+=("$(dirname "$t")/checkpoints/train_log.jsonl"); done
"$PY" "$HELPER" training-time "${logs[@]}" "$WORK_DIR/checkpoints/train_log.jsonl"
