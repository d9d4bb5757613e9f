#!/usr/bin/env bash
# Multi30k distillation (sequence-level knowledge distillation, Kim and Rush 2016): a small, fast
# student learns from its teacher's translations instead of the references.
#   teacher translates val and train.$SRC (beam 4)  -> $WORK_DIR/distilled/{val,train}.$TGT
#   xf score-pairs (teacher's forced decoding)      -> distilled/{val,train}.scores.jsonl
#   filter: drop the pairs of lowest per-token log-prob (FILTER_DROP, FILTER_MIN_MEAN)
#                                                   -> distilled/kept.{$SRC,$TGT}, filter.json
#     (and on val, filter-val.txt: what each cut would drop, scored against the references)
#   the pipeline of run.sh on the kept pairs, with the teacher's sentencepiece (--vocab-from):
#   preprocess -> train the student (student.yaml) -> average (chosen on val) -> translate
#   test2016 -> score
#   the teacher on test2016; both exported to CTranslate2 int8; bench: the table in table.txt
#
#   bash recipes/multi30k/distill.sh [en-de|en-fr]         # all steps, then the table
#   bash recipes/multi30k/distill.sh en-de bench           # the timing step again (alone on the machine)
#   bash recipes/multi30k/distill.sh en-de size            # decoding speed of candidate student shapes
#   bash recipes/multi30k/distill.sh en-de student         # all steps but the bench (recipes/multi30k/ship.sh)
#   TEACHER=/path/averaged.pt bash recipes/multi30k/distill.sh en-de
#
# Settings (environment, all optional):
#   TEACHER          the teacher checkpoint (an ensemble: several paths separated by spaces). Default:
#                    run.sh's averaged model, work-dirs/multi30k-PAIR/averaged.pt (cpu.yaml), trained
#                    by run.sh when missing.
#   TEACHER_SEEDS    without TEACHER: train this many teachers (default 2), seed K>1 in TEACHER_DIR-seedK
#                    (on seed 1's data), and teach with the better on val of seed 1 alone and the
#                    ensemble of all (the choice: distilled/teacher-val.tsv)
#   TEACHER_DIR      the default teacher's run.sh WORK_DIR (default work-dirs/multi30k-PAIR), and
#   TEACHER_CONFIG   its YAML (default recipes/multi30k/cpu.yaml)
#   DISTILL_NBEST    the teacher's N best of each training source, and the one of highest sentence chrF
#                    against the reference kept (distill_pick.py; default 1: the teacher's best); the
#                    lists are kept in distilled/train.nbest.jsonl
#   TEACHER_LENPEN   the teacher's length penalty (default: the lenpen run.sh chose on val, in
#                    choice.json beside the teacher, else 0.6)
#   TEACHER_ARGS     extra flags for the teacher's translations (e.g. "--quantize int8")
#   FILTER_DROP      drop this fraction of the distilled pairs, those of lowest per-token log-prob
#                    (xf score-pairs' mean); default 0.05, chosen on val (docs/recipes.md#distillation)
#   FILTER_MIN_MEAN  also drop the pairs whose per-token log-prob is lower (default -inf: none)
#   CONFIG           the student's YAML (default recipes/multi30k/student.yaml); PREPROCESS_ARGS,
#                    TRAIN_ARGS, ... as in recipes/lib.sh
#   WORK_DIR         outputs (default work-dirs/multi30k-PAIR-distill); a re-run skips finished steps
#   BENCH_THREADS (2), BENCH_WORKERS (2: batches at once, each on threads/workers threads; both
#                    engines' fastest setting on 2 cores), BENCH_BATCH (64), BENCH_REPEATS (3): the
#                    bench's settings; BENCH_SOURCE: the text it translates (default test2016.$SRC)
#   CHUNK_LINES      the teacher translates train in chunks of this many lines (2000), each kept when
#                    done: an interrupted run resumes at the first chunk missing
#   SIZES            the shapes `size` measures, ENCxDEC:D_MODEL:D_FF, e.g. "3x3:256:1024 3x1:256:1024"
set -euo pipefail
source "$(dirname "$0")/../lib.sh"

PAIR=${1:-en-de}
MODE=${2:-all}
[[ $PAIR == en-de || $PAIR == en-fr ]] && [[ $MODE == all || $MODE == bench || $MODE == size || $MODE == student ]] ||
  die "usage: $0 [en-de|en-fr] [all|bench|size|student]"
SRC=${PAIR%-*} TGT=${PAIR#*-}
NAME="Multi30k $PAIR student"
CONFIG=${CONFIG:-$RECIPES/multi30k/student.yaml}
WORK_DIR=${WORK_DIR:-$REPO/work-dirs/multi30k-$PAIR-distill}
FILTER_DROP=${FILTER_DROP:-0.05} FILTER_MIN_MEAN=${FILTER_MIN_MEAN:--inf}
mkdir -p "$WORK_DIR/distilled"
# the Python that runs xf (its shebang): it has sacrebleu and torch, which the steps below import
PY=$(sed -n '1s/^#! *//p' "$(command -v xf)")
[[ $PY != *" "* && -x $PY ]] || PY=python3

source "$RECIPES/multi30k/data.sh"
multi30k_data  # sets DATA

TEACHER_SEEDS=${TEACHER_SEEDS:-2} DISTILL_NBEST=${DISTILL_NBEST:-1}
[[ $TEACHER_SEEDS =~ ^[1-9]$ ]] || die "TEACHER_SEEDS=$TEACHER_SEEDS: a number of teachers from 1 to 9"
[[ $DISTILL_NBEST =~ ^[1-9][0-9]?$ ]] || die "DISTILL_NBEST=$DISTILL_NBEST: a number of hypotheses from 1 to 99"
D=$WORK_DIR/distilled
choose=0
if [[ -z ${TEACHER:-} ]]; then
  # the default teachers: run.sh's (cpu.yaml) with seeds 1..TEACHER_SEEDS, each trained when missing;
  # seed K>1 on a copy of seed 1's data (one sentencepiece: an ensemble needs one vocabulary)
  TEACHER_DIR=${TEACHER_DIR:-$REPO/work-dirs/multi30k-$PAIR} TEACHER_CONFIG=${TEACHER_CONFIG:-$RECIPES/multi30k/cpu.yaml}
  TEACHER=
  for ((k = 1; k <= TEACHER_SEEDS; k++)); do
    teacher_dir=$TEACHER_DIR
    seed_args=
    ((k == 1)) || teacher_dir+=-seed$k seed_args="--seed $k"
    if [[ ! -f $teacher_dir/averaged.pt ]]; then
      log "teacher: $teacher_dir/averaged.pt missing, training it with run.sh ($TEACHER_CONFIG${seed_args:+, $seed_args})"
      if ((k > 1)) && [[ ! -f $teacher_dir/data-bin/meta.json ]]; then
        mkdir -p "$teacher_dir" && rm -rf "$teacher_dir/data-bin.tmp" &&
          cp -r "$TEACHER_DIR/data-bin" "$teacher_dir/data-bin.tmp" &&
          mv "$teacher_dir/data-bin.tmp" "$teacher_dir/data-bin" || die "cannot copy seed 1's data to $teacher_dir"
      fi
      WORK_DIR=$teacher_dir CONFIG=$TEACHER_CONFIG TRAIN_ARGS=$seed_args PREPROCESS_ARGS= AVERAGE_ARGS= \
        TRANSLATE_ARGS= SCORE_ARGS= bash "$RECIPES/multi30k/run.sh" "$PAIR" >&2 ||
        die "run.sh $PAIR (teacher $k) failed: a re-run resumes it"
    fi
    TEACHER+="${TEACHER:+ }$teacher_dir/averaged.pt"
  done
  ((TEACHER_SEEDS == 1)) || choose=1
fi
read -r -a teacher <<<"$TEACHER"
for t in "${teacher[@]}"; do
  [[ -f $t ]] || die "teacher checkpoint $t not found"
done
if [[ -z ${TEACHER_LENPEN:-} ]]; then
  choice=$(dirname "${teacher[0]}")/choice.json
  TEACHER_LENPEN=0.6
  [[ -f $choice ]] && TEACHER_LENPEN=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["chosen"]["lenpen"])' "$choice")
fi
read -r -a teacher_args <<<"${TEACHER_ARGS:-}"

# choose_teacher: seed 1 alone against the ensemble of all seeds, each translating val (beam 4), the
# better sacreBLEU kept: distilled/teacher-val.tsv (BLEU, paths), the chosen first; its translation
# of val is the distilled val
choose_teacher() {
  local rows=$D/teacher-val.tsv.tmp candidate paths i=0
  : >"$rows"
  for candidate in "${teacher[0]}" "${teacher[*]}"; do
    paths=() i=$((i + 1))
    for t in $candidate; do paths+=(--path "$t"); done
    xf translate "${paths[@]}" --input "$DATA/val.$SRC" --output "$D/val-choice$i.$TGT" --beam-size 4 \
      --lenpen "$TEACHER_LENPEN" --batch-size 64 "${teacher_args[@]}" || return
    printf '%s\t%s\t%s\n' "$("$PY" -c 'import sys, sacrebleu
hyps, refs = (open(p, encoding="utf-8").read().splitlines() for p in sys.argv[1:3])
print(f"{sacrebleu.corpus_bleu(hyps, [refs]).score:.2f}")' "$D/val-choice$i.$TGT" "$DATA/val.$TGT")" "$candidate" "$i" \
      >>"$rows" || return
  done
  sort -t $'\t' -k1,1gr -s "$rows" >"$D/teacher-val.tsv.sorted" || return
  i=$(head -n 1 "$D/teacher-val.tsv.sorted" | cut -f3)
  [[ -f $D/val.$TGT ]] || mv "$D/val-choice$i.$TGT" "$D/val.$TGT" || return
  rm -f "$D"/val-choice*."$TGT" "$rows"
  cut -f1,2 "$D/teacher-val.tsv.sorted" >"$D/teacher-val.tsv.tmp" && mv "$D/teacher-val.tsv.tmp" "$D/teacher-val.tsv" &&
    rm "$D/teacher-val.tsv.sorted"
}
if ((choose)); then
  step "teacher chosen on val (seed 1 or the ensemble of $TEACHER_SEEDS)" "$D/teacher-val.tsv" choose_teacher
  cat "$D/teacher-val.tsv" >&2
  read -r -a teacher <<<"$(head -n 1 "$D/teacher-val.tsv" | cut -f2)"
fi
teacher_paths=()
for t in "${teacher[@]}"; do teacher_paths+=(--path "$t"); done
echo "${teacher[*]}" >"$WORK_DIR/teacher.txt"  # the teacher the student learned from (ship.sh reads it)
note "teacher: ${teacher[*]} (lenpen $TEACHER_LENPEN)"

# teacher_translate SPLIT: the teacher's beam-4 translation of $DATA/SPLIT.$SRC (written atomically)
teacher_translate() {
  xf translate "${teacher_paths[@]}" --input "$DATA/$1.$SRC" --output "$D/$1.$TGT" --beam-size 4 \
    --lenpen "$TEACHER_LENPEN" --batch-size 64 "${teacher_args[@]}"
}
# teacher_translate_train: the same for train, in chunks of CHUNK_LINES lines (default 2000), each
# written when done, so that an interrupted run resumes at the first chunk missing; with
# DISTILL_NBEST N > 1, each chunk's N best (beam max(4, N)), the one closest to the reference kept
teacher_translate_train() {
  local parts=$D/train-parts part n beam=$((DISTILL_NBEST > 4 ? DISTILL_NBEST : 4))
  mkdir -p "$parts"
  if [[ ! -f $parts/split.done ]]; then
    rm -f "$parts"/src.* "$parts"/ref.* "$parts"/hyp.* "$parts"/nbest.*
    split -l "${CHUNK_LINES:-2000}" -d -a 4 "$DATA/train.$SRC" "$parts/src." &&
      split -l "${CHUNK_LINES:-2000}" -d -a 4 "$DATA/train.$TGT" "$parts/ref." && touch "$parts/split.done" || return
  fi
  for part in "$parts"/src.*; do
    n=${part##*.}
    [[ -f $parts/hyp.$n ]] && continue
    note "chunk $n"
    if ((DISTILL_NBEST == 1)); then
      xf translate "${teacher_paths[@]}" --input "$part" --output "$parts/hyp.$n" --beam-size 4 \
        --lenpen "$TEACHER_LENPEN" --batch-size 64 "${teacher_args[@]}" || return
    else
      xf translate "${teacher_paths[@]}" --input "$part" --output "$parts/nbest.$n" --beam-size "$beam" \
        --nbest "$DISTILL_NBEST" --output-format jsonl --lenpen "$TEACHER_LENPEN" --batch-size 64 "${teacher_args[@]}" &&
        "$PY" "$RECIPES/multi30k/distill_pick.py" "$parts/nbest.$n" "$parts/ref.$n" "$parts/hyp.$n" || return
    fi
  done
  cat "$parts"/hyp.* >"$D/train.$TGT.tmp" || return
  [[ $(wc -l <"$D/train.$TGT.tmp") == $(wc -l <"$DATA/train.$SRC") ]] || { echo "the chunks' translations do not add up to $DATA/train.$SRC: delete $parts" >&2; return 1; }
  if ((DISTILL_NBEST > 1)); then  # the n-best lists kept beside the pick (another pick needs no teacher)
    cat "$parts"/nbest.* >"$D/train.nbest.jsonl.tmp" && mv "$D/train.nbest.jsonl.tmp" "$D/train.nbest.jsonl" || return
  fi
  mv "$D/train.$TGT.tmp" "$D/train.$TGT" && rm -r "$parts"
}
# teacher_scores SPLIT: the teacher's forced-decoding log-probs of its own translations
teacher_scores() {
  xf score-pairs "${teacher_paths[@]}" --source "$DATA/$1.$SRC" --target "$D/$1.$TGT" --output "$D/$1.scores.jsonl"
}

# filter_val REPORT: on val, what each cut of the teacher's per-token log-prob would drop, and how
# good the dropped and the kept translations are against the references (sentence chrF, corpus BLEU).
filter_val() {
  "$PY" - "$D/val.scores.jsonl" "$D/val.$TGT" "$DATA/val.$TGT" "$1" <<'EOF'
import json, sys
import sacrebleu
scores, hyps, refs, out = sys.argv[1:5]
mean = [json.loads(l)["mean"] for l in open(scores, encoding="utf-8")]
hyps = open(hyps, encoding="utf-8").read().splitlines()
refs = open(refs, encoding="utf-8").read().splitlines()
chrf = [sacrebleu.sentence_chrf(h, [r]).score for h, r in zip(hyps, refs)]
order = sorted(range(len(mean)), key=lambda i: mean[i])
avg = lambda xs: sum(xs) / len(xs) if xs else float("nan")
bleu = lambda ids: sacrebleu.corpus_bleu([hyps[i] for i in ids], [[refs[i] for i in ids]]).score if ids else float("nan")
rows = [f"{'drop':>6} {'cut (mean log-prob)':>20} {'chrF dropped':>13} {'chrF kept':>10} {'BLEU kept':>10}"]
for frac in (0.0, 0.02, 0.05, 0.10, 0.20):
    n = round(frac * len(order))
    dropped, kept = order[:n], order[n:]
    cut = f"{mean[order[n]]:.3f}" if n else "-inf"
    rows.append(f"{frac:>6.0%} {cut:>20} {avg([chrf[i] for i in dropped]):>13.1f} {avg([chrf[i] for i in kept]):>10.1f} {bleu(kept):>10.2f}")
open(out, "w", encoding="utf-8").write("\n".join(rows) + "\n")
EOF
}

# filter_train: drop the FILTER_DROP of the distilled pairs of lowest per-token log-prob, and those below
# FILTER_MIN_MEAN.
filter_train() {
  "$PY" "$RECIPES/multi30k/distill_filter.py" "$D/train.scores.jsonl" "$DATA/train.$SRC" "$D/train.$TGT" \
    "$D/kept" "$SRC" "$TGT" "$FILTER_DROP" "$FILTER_MIN_MEAN"
}

# export_int8 CKPT DIR: the checkpoint as a CTranslate2 model with int8 weights
export_int8() {
  xf export ctranslate2 --path "$1" --output "$2" --quantization int8 >/dev/null
}

# bench: teacher and student, xf int8 and CTranslate2 int8, each plain and at its fastest (fast),
# interleaved in one run; the table.
bench() {
  local threads=${BENCH_THREADS:-2} workers=${BENCH_WORKERS:-2} batch=${BENCH_BATCH:-64} repeats=${BENCH_REPEATS:-3}
  local source=${BENCH_SOURCE:-$DATA/test2016.$SRC} rows=$WORK_DIR/bench.tsv.tmp r who engine
  local lenpen_student
  lenpen_student=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["chosen"]["lenpen"])' "$WORK_DIR/choice.json" 2>/dev/null ||
    yaml_get "$CONFIG" translate lenpen)
  local mode compile=(--compile)
  [[ -f $WORK_DIR/shortlist.npz ]] || xf shortlist "$WORK_DIR/data-bin" --output "$WORK_DIR/shortlist.npz" >/dev/null
  # int8 compiled ahead of time needs exact int8 products (VNNI, AMX); elsewhere the eager int8
  "$PY" -c 'import sys; from xformer_cli.model.quantization import int8_matmul_exact; sys.exit(not int8_matmul_exact())' ||
    compile=()
  : >"$rows"
  # each engine as it is run (int8), and at its fastest (fast): xf with --compile (the decoder step
  # compiled ahead of time, its build outside the speed) and the shortlist, CTranslate2 with the
  # shortlist as its vocabulary map; the shortlist of the student's training pairs, for both models
  for ((r = 1; r <= repeats; r++)); do
    for who in teacher student; do
      for engine in xf ctranslate2; do
        for mode in int8 fast; do
          local path=$WORK_DIR/averaged.pt lenpen=$lenpen_student extra=()
          [[ $who == teacher ]] && path=${teacher[0]} lenpen=$TEACHER_LENPEN
          [[ $engine == ctranslate2 ]] && path=$WORK_DIR/$who-ct2-int8
          [[ $mode == fast ]] && extra=(--shortlist "$WORK_DIR/shortlist.npz")
          [[ $mode == fast && $engine == xf ]] && extra+=("${compile[@]}")
          xf translate --engine "$engine" --path "$path" --quantize int8 "${extra[@]}" --threads "$threads" \
            --workers "$workers" --beam-size 4 --batch-size "$batch" --lenpen "$lenpen" --input "$source" \
            --output "$WORK_DIR/bench.$who.$engine.$mode.$TGT" 2>"$WORK_DIR/bench.log" ||
            { cat "$WORK_DIR/bench.log" >&2; return 1; }
          local speed
          speed=$(grep -o 'sentences/s [0-9.,]*' "$WORK_DIR/bench.log" | tail -1 | tr -d , | cut -d' ' -f2)
          printf '%s\t%s\t%s\t%s\t%s\n' "$who" "$engine" "$mode" "$r" "$speed" >>"$rows"
          note "run $r: $who, $engine $mode: $speed sentences/s"
        done
      done
    done
  done
  mv "$rows" "$WORK_DIR/bench.tsv"
  rm -f "$WORK_DIR/bench.log"
  BENCH="threads $threads, workers $workers, batch $batch, beam 4, best of $repeats, $(basename "$source")" \
    TEACHERS="${#teacher[@]}" distill_table "${teacher[0]}" "$WORK_DIR" "$TGT" "$DATA/test2016.$TGT" | tee "$WORK_DIR/table.txt"
}

# distill_table TEACHER WORK_DIR TGT REF: teacher vs student (stdout).
distill_table() {
  "$PY" - "$@" <<'EOF'
import json, os, sys
import sacrebleu
import torch
teacher, work, tgt, ref = sys.argv[1:5]
refs = [open(ref, encoding="utf-8").read().splitlines()]
speed = {}
for line in open(os.path.join(work, "bench.tsv"), encoding="utf-8"):
    who, engine, mode, _, s = line.split("\t")
    speed[who, engine, mode] = max(speed.get((who, engine, mode), 0.0), float(s))
def params(path):
    state = torch.load(path, map_location="cpu", weights_only=True)["model"]
    return sum(t.numel() for t in {t.data_ptr(): t for t in state.values()}.values())  # tied weights once
def mb(path):
    files = [os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs] if os.path.isdir(path) else [path]
    return sum(os.path.getsize(f) for f in files) / 1e6
def bleu(path):
    hyps = open(path, encoding="utf-8").read().splitlines()
    return sacrebleu.corpus_bleu(hyps, refs).score if len(hyps) == len(refs[0]) else float("nan")
models = {"teacher": teacher, "student": os.path.join(work, "averaged.pt")}
tests = {"teacher": os.path.join(work, f"teacher.test.hyp.{tgt}"), "student": os.path.join(work, f"test.hyp.{tgt}")}
rows = [("", "teacher", "student", "student/teacher")]
def row(name, f, ratio=True, fmt="{:.2f}"):
    t, s = f("teacher"), f("student")
    rows.append((name, fmt.format(t), fmt.format(s), f"{s / t:.2f}x" if ratio else f"{s - t:+.2f}"))
row("test2016 sacreBLEU (xf fp32)", lambda w: bleu(tests[w]), ratio=False)
ENGINES = {("xf", "int8"): "xf int8", ("xf", "fast"): "xf int8 --compile --shortlist",
           ("ctranslate2", "int8"): "CTranslate2 int8", ("ctranslate2", "fast"): "CTranslate2 int8 + vmap"}
for (engine, mode), name in ENGINES.items():
    row(f"test2016 sacreBLEU ({name})", lambda w: bleu(os.path.join(work, f"bench.{w}.{engine}.{mode}.{tgt}")),
        ratio=False)
row("parameters (M)", lambda w: params(models[w]) / 1e6)
row("checkpoint on disk (MB, fp32)", lambda w: mb(models[w]), fmt="{:.1f}")
row("CTranslate2 int8 model (MB)", lambda w: mb(os.path.join(work, f"{w}-ct2-int8")), fmt="{:.1f}")
for (engine, mode), name in ENGINES.items():
    row(f"sent/s, {name}", lambda w: speed[w, engine, mode], fmt="{:.1f}")
fast = speed["student", "xf", "fast"] / speed["teacher", "xf", "int8"]
rows.append(("student xf int8 --compile --shortlist / teacher xf int8 (sent/s)", "", "", f"{fast:.2f}x"))
width = [max(len(r[i]) for r in rows) for i in range(4)]
print(f"\nteacher vs student ({os.environ.get('BENCH', '')}; speeds measured in the same run, interleaved)")
if int(os.environ.get("TEACHERS", "1")) > 1:
    print(f"the teacher: an ensemble of {os.environ['TEACHERS']} in xf fp32 (what the student learned from); "
          f"its first model, {teacher}, in every other row")
for r in rows:
    print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, width))))
EOF
}

# size: decoding speed of candidate student shapes, each engine plain and at its fastest (the
# bench's int8 and fast modes), each shape a model trained for one update on the distilled data
# (speed hardly depends on the weights): outputs are capped at the source length (max_len_a 1,
# max_len_b 0), about a real translation's length, so that every shape writes the same subwords.
# The shapes' runs interleaved, BENCH_REPEATS times, the best of each kept; each line ends with
# the shape's xf fast speed over the first shape's (the teacher's, by default).
size() {
  local threads=${BENCH_THREADS:-2} workers=${BENCH_WORKERS:-2} batch=${BENCH_BATCH:-64} repeats=${BENCH_REPEATS:-3}
  local shape dir compile=(--compile) shapes=(${SIZES:-3x3:256:1024 3x1:256:1024 2x1:256:1024 3x1:192:768 2x1:192:768 3x1:128:512})
  [[ -f $WORK_DIR/data-bin/meta.json ]] || die "size needs the student's data ($WORK_DIR/data-bin): run the recipe first"
  [[ -f $WORK_DIR/shortlist.npz ]] || xf shortlist "$WORK_DIR/data-bin" --output "$WORK_DIR/shortlist.npz" >/dev/null
  "$PY" -c 'import sys; from xformer_cli.model.quantization import int8_matmul_exact; sys.exit(not int8_matmul_exact())' ||
    compile=()
  for shape in "${shapes[@]}"; do
    local layers=${shape%%:*} rest=${shape#*:}
    dir=$WORK_DIR/size/$shape
    [[ -f $dir/checkpoint_last.pt ]] ||
      xf train "$WORK_DIR/data-bin" --config "$CONFIG" --save-dir "$dir" --max-update 1 --max-epoch 0 \
        --save-interval-updates 0 --encoder-layers "${layers%x*}" --decoder-layers "${layers#*x}" \
        --d-model "${rest%:*}" --d-ff "${rest#*:}" --threads "$threads" >/dev/null 2>&1 || die "xf train for $shape failed"
    [[ -d $dir/ct2-int8 ]] || export_int8 "$dir/checkpoint_last.pt" "$dir/ct2-int8" || die "xf export for $shape failed"
  done
  local -A best=()
  local r engine mode path extra speed
  for ((r = 1; r <= repeats; r++)); do
    for shape in "${shapes[@]}"; do
      dir=$WORK_DIR/size/$shape
      for engine in xf ctranslate2; do
        for mode in int8 fast; do
          path=$dir/checkpoint_last.pt extra=()
          [[ $engine == ctranslate2 ]] && path=$dir/ct2-int8
          [[ $mode == fast ]] && extra=(--shortlist "$WORK_DIR/shortlist.npz")
          [[ $mode == fast && $engine == xf ]] && extra+=("${compile[@]}")
          xf translate --engine "$engine" --path "$path" --quantize int8 "${extra[@]}" --threads "$threads" \
            --workers "$workers" --beam-size 4 --batch-size "$batch" --max-len-a 1 --max-len-b 0 --input "$DATA/val.$SRC" \
            2>"$dir/speed.log" >/dev/null || die "xf translate --engine $engine ($mode) for $shape failed: $dir/speed.log"
          speed=$(grep -o 'sentences/s [0-9.,]*' "$dir/speed.log" | tail -1 | tr -d , | cut -d' ' -f2)
          best[$shape $engine $mode]=$("$PY" -c 'import sys; print(max(float(a or 0) for a in sys.argv[1:]))' \
            "${best[$shape $engine $mode]:-}" "$speed")
        done
      done
    done
  done
  for shape in "${shapes[@]}"; do
    printf '%-14s xf int8 %s, xf fast %s, ctranslate2 int8 %s, ctranslate2 fast %s sentences/s (best of %s); xf fast %sx the first\n' \
      "$shape" "${best[$shape xf int8]}" "${best[$shape xf fast]}" "${best[$shape ctranslate2 int8]}" \
      "${best[$shape ctranslate2 fast]}" "$repeats" \
      "$("$PY" -c 'import sys; print(f"{float(sys.argv[1]) / float(sys.argv[2]):.2f}")' "${best[$shape xf fast]}" "${best[${shapes[0]} xf fast]}")"
  done
}

if [[ $MODE == bench ]]; then
  bench
  exit
fi
if [[ $MODE == size ]]; then
  size
  exit
fi

step "teacher translates val.$SRC" "$D/val.$TGT" teacher_translate val
step "teacher scores its val translations" "$D/val.scores.jsonl" teacher_scores val
step "filter cuts on val" "$D/filter-val.txt" filter_val "$D/filter-val.txt"
cat "$D/filter-val.txt" >&2
step "teacher translates train.$SRC" "$D/train.$TGT" teacher_translate_train
step "teacher scores its train translations" "$D/train.scores.jsonl" teacher_scores train
step "filter (drop the lowest $FILTER_DROP, and below $FILTER_MIN_MEAN)" "$D/kept.json" filter_train

PREPROCESS_ARGS="--vocab-from ${teacher[0]} ${PREPROCESS_ARGS:-}"
TRAINPREF=$D/kept VALIDPREF=$DATA/val TESTPREF=$DATA/test2016
pipeline

step "teacher translates test2016.$SRC" "$WORK_DIR/teacher.test.hyp.$TGT" \
  to_file "$WORK_DIR/teacher.test.hyp.$TGT" xf translate "${teacher_paths[@]}" --input "$DATA/test2016.$SRC" \
  --beam-size 4 --lenpen "$TEACHER_LENPEN" --batch-size 64
step "export the teacher (CTranslate2 int8)" "$WORK_DIR/teacher-ct2-int8" export_int8 "${teacher[0]}" "$WORK_DIR/teacher-ct2-int8"
step "export the student (CTranslate2 int8)" "$WORK_DIR/student-ct2-int8" export_int8 "$WORK_DIR/averaged.pt" "$WORK_DIR/student-ct2-int8"
step "shortlist of the student's training pairs" "$WORK_DIR/shortlist.npz" \
  xf shortlist "$WORK_DIR/data-bin" --output "$WORK_DIR/shortlist.npz"
[[ $MODE == student ]] && exit 0
if [[ -f $WORK_DIR/table.txt ]]; then
  log "bench: skipped, $WORK_DIR/table.txt exists (run '$0 $PAIR bench' to measure again)"
  cat "$WORK_DIR/table.txt"
else
  log "bench"
  bench
fi
