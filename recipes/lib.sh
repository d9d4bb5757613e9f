# recipes/lib.sh: the pipeline every recipe runs, and its helpers. Sourced by the run.sh scripts.
#
# `pipeline` chains the five xf commands. Every step is skipped when its output exists, so a
# re-run after an interruption resumes at the first unfinished step (and `xf train` itself resumes
# from checkpoint_last.pt). Delete a step's output (or the whole WORK_DIR) to redo it.
#
#   xf preprocess          raw text      -> $WORK_DIR/data-bin      (done: data-bin/meta.json)
#   xf train               data-bin      -> $WORK_DIR/checkpoints   (done: checkpoints/train.done)
#   xf average-checkpoints checkpoints   -> $WORK_DIR/averaged.pt
#     (where the config's average_checkpoints has choose_on_valid: true, the average and the lenpen
#      of the test translation are chosen on the validation set -> also $WORK_DIR/choice.json)
#   xf translate           test source   -> $WORK_DIR/test.hyp.$TGT
#   xf score               hypotheses    -> $WORK_DIR/score.json
#   xf plot curves         train_log     -> $WORK_DIR/curves.png     (needs matplotlib; else a note)
#
# The caller sets: NAME (a label), CONFIG (the YAML file), WORK_DIR, SRC and TGT (language
# suffixes), TRAINPREF, VALIDPREF and TESTPREF (raw text prefixes: PREFIX.$SRC, PREFIX.$TGT),
# and optionally PAPER (the paper's tokenized BLEU, for the results table) and TOKENS_PER_UPDATE
# (keep the effective batch at that many tokens per side whatever the GPU count).
#
# Users may add flags to any step, which win over the YAML file:
#   PREPROCESS_ARGS, TRAIN_ARGS, AVERAGE_ARGS, TRANSLATE_ARGS, SCORE_ARGS   e.g. TRAIN_ARGS="--max-update 500"
# and set NGPU (default: the GPUs nvidia-smi sees), EXAMPLES=N (print N example translations).

RECIPES="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(dirname "$RECIPES")"

if [[ -t 2 ]]; then BOLD=$'\033[1m' RED=$'\033[31m' PLAIN=$'\033[0m'; else BOLD= RED= PLAIN=; fi
log() { printf '\n%s==> %s%s\n' "$BOLD" "$*" "$PLAIN" >&2; }
note() { printf '    %s\n' "$*" >&2; }
die() { printf '%serror:%s %s\n' "$RED" "$PLAIN" "$*" >&2; exit 1; }
need() { command -v "$1" >/dev/null 2>&1 || die "'$1' is not on PATH: $2"; }

need xf "install xf (make venv) and put its bin/ on PATH, or run through make (make demo)"
need python3 "python3 is needed to print the results table"

# step NAME DONE CMD...: run CMD unless the file DONE exists; log the step's wall time.
# (CMD runs where `set -e` does not apply, so the helpers below check their own commands.)
step() {
  local name=$1 done=$2 start=$SECONDS
  shift 2
  if [[ -e $done ]]; then
    log "$name: skipped, $done exists"
    return 0
  fi
  log "$name"
  local rc=0
  "$@" || rc=$?
  # an interrupted step's time counts too: the table adds up the runs that finished it
  printf '%s\t%s\n' "$name" "$((SECONDS - start))" >>"$WORK_DIR/timings.tsv"
  ((rc == 0)) || die "$name failed (exit $rc); a re-run resumes here, finished steps are kept"
  [[ -e $done ]] || die "$name finished without writing $done"
}

# yaml_get FILE SECTION KEY: a scalar from a two-level YAML file such as our configs.
yaml_get() {
  awk -v s="$2:" -v k="$3:" '/^[^ #]/ { in_s = ($1 == s) } in_s && $1 == k { print $2; exit }' "$1"
}

gpu_count() {
  if [[ -n ${CUDA_VISIBLE_DEVICES:-} ]]; then
    tr ',' '\n' <<<"$CUDA_VISIBLE_DEVICES" | grep -c .
  elif command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true
  else
    echo 0
  fi
}

# check_lines A B: the two sides of a parallel file have the same number of lines (prints it).
check_lines() {
  local a b
  a=$(wc -l <"$1") b=$(wc -l <"$2")
  ((a == b)) || die "$1 has $a lines but $2 has $b: the two sides of a parallel corpus must align"
  ((a > 0)) || die "$1 is empty"
  echo "$a"
}

# fetch URL FILE: download to FILE (atomically), with curl or wget.
fetch() {
  mkdir -p "$(dirname "$2")"
  note "downloading $1"
  if command -v curl >/dev/null 2>&1; then
    curl -fL --retry 3 -o "$2.part" "$1" || die "download failed: $1"
  elif command -v wget >/dev/null 2>&1; then
    wget -q -O "$2.part" "$1" || die "download failed: $1"
  else
    die "neither curl nor wget is installed; download $1 by hand into $(dirname "$2")"
  fi
  mv "$2.part" "$2"
}

sha256() {
  if command -v sha256sum >/dev/null 2>&1; then sha256sum "$1" | cut -d' ' -f1; else shasum -a 256 "$1" | cut -d' ' -f1; fi
}

# Can `xf score --tokenized-bleu` run here (sacremoses installed)?
have_tokenized_bleu() {
  local t
  t=$(mktemp)
  echo "a-b" >"$t"
  xf score --ref "$t" --hyp "$t" --metrics "" --tokenized-bleu >/dev/null 2>&1 && rm -f "$t" && return 0
  rm -f "$t"
  return 1
}

pipeline() {
  : "${NAME:?} ${CONFIG:?} ${WORK_DIR:?} ${SRC:?} ${TGT:?} ${TRAINPREF:?} ${VALIDPREF:?} ${TESTPREF:?}"
  [[ -f $CONFIG ]] || die "config $CONFIG not found"
  mkdir -p "$WORK_DIR"
  local data_bin="$WORK_DIR/data-bin" save_dir="$WORK_DIR/checkpoints"
  local averaged="$WORK_DIR/averaged.pt" hyp="$WORK_DIR/test.hyp.$TGT" scores="$WORK_DIR/score.json"
  local preprocess_args train_args average_args translate_args score_args  # user flags, as words
  read -r -a preprocess_args <<<"${PREPROCESS_ARGS:-}"
  read -r -a train_args <<<"${TRAIN_ARGS:-}"
  read -r -a average_args <<<"${AVERAGE_ARGS:-}"
  read -r -a translate_args <<<"${TRANSLATE_ARGS:-}"
  read -r -a score_args <<<"${SCORE_ARGS:-}"
  NGPU=${NGPU:-$(gpu_count)}

  # The paper's batches held about 25000 source and 25000 target tokens (8 GPUs). To keep that on
  # any GPU count, devices * max_tokens * update_freq ~= TOKENS_PER_UPDATE, where the config's
  # max_tokens (or MAX_TOKENS) is the most one device holds at once.
  local batch_args=()
  if [[ -n ${TOKENS_PER_UPDATE:-} ]]; then
    local cap devices update_freq max_tokens
    cap=${MAX_TOKENS:-$(yaml_get "$CONFIG" train max_tokens)}
    [[ $cap =~ ^[0-9]+$ ]] || die "no train.max_tokens in $CONFIG (or set MAX_TOKENS)"
    devices=$((NGPU > 0 ? NGPU : 1))
    update_freq=$(((TOKENS_PER_UPDATE + devices * cap - 1) / (devices * cap)))
    max_tokens=$(((TOKENS_PER_UPDATE + devices * update_freq - 1) / (devices * update_freq)))
    batch_args=(--max-tokens "$max_tokens" --update-freq "$update_freq")
    note "batch: $devices device(s) x $max_tokens tokens x update_freq $update_freq = $((devices * max_tokens * update_freq)) tokens per update"
  fi
  local launcher=(xf)
  if ((NGPU > 1)); then
    need torchrun "torchrun comes with torch; it runs one training process per GPU"
    launcher=(torchrun --standalone --nproc_per_node "$NGPU" -m xformer_cli)
  fi

  local tokenized=()
  if have_tokenized_bleu; then
    tokenized=(--tokenized-bleu)
  elif [[ -n ${PAPER:-} ]]; then
    die "the paper-comparable BLEU needs sacremoses: pip install sacremoses (or xformer-cli[moses])"
  fi

  log "$NAME: config $CONFIG, work dir $WORK_DIR, $NGPU GPU(s)"
  step "preprocess" "$data_bin/meta.json" \
    xf preprocess --config "$CONFIG" --destdir "$data_bin" --source-lang "$SRC" --target-lang "$TGT" \
    --trainpref "$TRAINPREF" --validpref "$VALIDPREF" --testpref "$TESTPREF" --overwrite \
    "${preprocess_args[@]}"
  step "train" "$save_dir/train.done" train_then_mark "$save_dir/train.done" \
    "${launcher[@]}" train "$data_bin" --config "$CONFIG" --save-dir "$save_dir" \
    "${batch_args[@]}" "${train_args[@]}"
  local choice="$WORK_DIR/choice.json" chosen=()
  if [[ $(yaml_get "$CONFIG" average_checkpoints choose_on_valid) == true ]]; then
    # the checkpoints to average and the lenpen, chosen on val (never the test set) among
    # candidates that include the config's fixed rule (its average and its translate lenpen)
    local fixed=() lenpen beam
    lenpen=$(yaml_get "$CONFIG" translate lenpen) beam=$(yaml_get "$CONFIG" translate beam_size)
    [[ -n $lenpen ]] && fixed+=(--choose-lenpen "$lenpen")
    [[ -n $beam ]] && fixed+=(--choose-beam-size "$beam")
    step "choose on $(basename "$VALIDPREF").$SRC" "$choice" \
      xf average-checkpoints --config "$CONFIG" --inputs "$save_dir" --output "$averaged" \
      --valid-source "$VALIDPREF.$SRC" --valid-reference "$VALIDPREF.$TGT" --choose-report "$choice" \
      "${fixed[@]}" "${average_args[@]}"
    chosen=(--lenpen "$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["chosen"]["lenpen"])' "$choice")")
  else
    step "average checkpoints" "$averaged" \
      xf average-checkpoints --config "$CONFIG" --inputs "$save_dir" --output "$averaged" "${average_args[@]}"
  fi
  step "translate $(basename "$TESTPREF").$SRC" "$hyp" \
    to_file "$hyp" xf translate --config "$CONFIG" --path "$averaged" --input "$TESTPREF.$SRC" \
    "${chosen[@]}" "${translate_args[@]}"
  step "score" "$scores" \
    to_file "$scores" xf score --config "$CONFIG" --ref "$TESTPREF.$TGT" --hyp "$hyp" --json \
    "${tokenized[@]}" "${score_args[@]}"

  NGPU=$NGPU CONFIG=$CONFIG CHOICE=$choice results_table "$scores" "$WORK_DIR/timings.tsv" "$NAME" "${PAPER:-}" | tee "$WORK_DIR/results.txt"
  if [[ -n ${EXAMPLES:-} ]]; then
    examples "$TESTPREF.$SRC" "$TESTPREF.$TGT" "$hyp" "$EXAMPLES"
  fi
  training_curves "$save_dir" "$WORK_DIR/curves.png"
}

# training_curves SAVE_DIR PNG: draw the run's curves (drawn anew on every run; cheap) and print
# where they are, or say in one line why not (matplotlib missing: how to install it).
training_curves() {
  local err
  if err=$(xf plot curves "$1" -o "$2" 2>&1); then
    printf '\ntraining curves: %s\n' "$2"
  else
    note "no training curves: ${err#xf: error: }"
  fi
}

# train_then_mark DONE CMD...: run the training command, then mark training as finished.
train_then_mark() {
  local done=$1
  shift
  "$@" || return
  touch "$done"
}

# to_file FILE CMD...: CMD's stdout into FILE, which appears only if CMD succeeds.
to_file() {
  local out=$1
  shift
  "$@" >"$out.tmp" || { rm -f "$out.tmp"; return 1; }
  mv "$out.tmp" "$out"
}

# results_table SCORE_JSON TIMINGS NAME PAPER: the final table (stdout).
results_table() {
  python3 - "$@" <<'EOF'
import json, os, platform, shutil, subprocess, sys
scores_path, timings_path, name, paper = sys.argv[1:5]
s = json.load(open(scores_path, encoding="utf-8"))
get = lambda key: f"{s[key]['score']:.2f}" if key in s else "-"
steps = {}  # step -> seconds, over all the runs that worked on it
for line in open(timings_path, encoding="utf-8") if os.path.exists(timings_path) else []:
    step, sec = line.rstrip("\n").split("\t")
    steps[step] = steps.get(step, 0) + int(sec)
minutes = lambda sec: f"{sec // 3600}:{sec // 60 % 60:02d}:{sec % 60:02d}"  # h:mm:ss
rows = [
    ("recipe", f"{name} ({os.path.basename(os.environ.get('CONFIG', '?'))})"),
    ("test set", f"{os.path.basename(s['refs'][0])} ({s['lines']} lines)"),
    ("sacreBLEU", get("bleu") + (f"   ({s['bleu']['signature']})" if "bleu" in s else "")),
    ("BLEU tokenized, compound-split", get("tokenized_bleu") + (f"   (paper: {paper})" if paper else "")),
    ("chrF2", get("chrf")),
    ("TER", get("ter")),
]
choice = os.environ.get("CHOICE", "")
if choice and os.path.exists(choice):  # xf average-checkpoints --choose-on-valid's report
    c = json.load(open(choice, encoding="utf-8"))
    fixed = c["fixed_rule"]
    pick = lambda r: f"{r['checkpoints']}, lenpen {r['lenpen']:g}: {r['bleu']:.2f}"
    rows.append(("chosen on val (sacreBLEU)", pick(c["chosen"]) + f"   (fixed rule {pick(fixed) if fixed else 'none'})"))
    for cand in c["candidates"]:
        rows.append((f"  val: {cand['checkpoints']}", "  ".join(f"{s['lenpen']:g}: {s['bleu']:.2f}" for s in cand["scores"])))
rows += [(f"time: {step}", minutes(sec)) for step, sec in steps.items()]
rows.append(("time: total", minutes(sum(steps.values()))))
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.machine()) if os.path.exists("/proc/cpuinfo") else platform.machine()
machine = f"{cpu}, {os.cpu_count()} CPU threads"
if int(os.environ.get("NGPU") or 0) > 0:
    query = ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"]
    gpu = subprocess.run(query, capture_output=True, text=True).stdout.split("\n")[0].strip() if shutil.which("nvidia-smi") else ""
    machine += f", {os.environ['NGPU']} x {gpu}" if gpu else f", NGPU={os.environ['NGPU']}"
rows.append(("machine", machine))
width = max(len(k) for k, _ in rows)
print(f"\n{'results':=^{width + 40}}")
for key, value in rows:
    print(f"{key:<{width}}  {value}")
print("=" * (width + 40))
EOF
}

# examples SRC REF HYP N: N example translations, spread over the test set.
examples() {
  python3 - "$@" <<'EOF'
import sys, textwrap
src, ref, hyp = ([l.rstrip("\n") for l in open(p, encoding="utf-8")] for p in sys.argv[1:4])
n = min(int(sys.argv[4]), len(hyp))
picks = [i * len(hyp) // n for i in range(n)]
rule = "-" * 100
print(f"\nexample translations ({n} of {len(hyp)}):\n{rule}")
for i in picks:
    for label, text in (("source", src[i]), ("reference", ref[i]), ("xf", hyp[i])):
        lines = textwrap.wrap(text, 84) or [""]
        print(f"{f'{i + 1}' if label == 'source' else '':>5} {label:<10}| {lines[0]}")
        for more in lines[1:]:
            print(f"{'':>16}| {more}")
    print(rule)
EOF
}
