#!/usr/bin/env bash
# Multi30k, one model for several languages (the OPUS-MT way: a >>deu<< tag first on the source),
# beside bilingual models trained for the same time. Multi30k is three-way parallel (the same
# 29,000 captions in English, German and French), so every model learns from the same sentences.
#
#   bash recipes/multi30k/multilingual.sh           # four trainings of cpu.yaml's budget (34 min each)
#   TRAIN_ARGS="--stop-time-hours 0.25" JOBS=2 bash recipes/multi30k/multilingual.sh
#
# The models (MODELS picks some, e.g. MODELS="en-de en-de+fr"):
#   en-de, en-fr      bilingual, as run.sh trains them
#   en-de+fr          one model EN->DE and EN->FR   (xf preprocess --pairs en-de,en-fr)
#   english-centric   EN<->DE and EN<->FR           (--pairs en-de,de-en,en-fr,fr-en); it is asked
#                     all six directions of the three languages: DE->FR and FR->DE are zero-shot
#                     (never seen in training: only the target's tag tells it the language)
# Every model trains with CONFIG's train section (the same wall-time budget: "equal training
# time"), is averaged over its last checkpoints (CONFIG's num_update_checkpoints, the fixed rule:
# no choice on val, which is one direction's) and translates test2016 with CONFIG's lenpen.
# One difference, chosen on val: the English-centric model trains at half CONFIG's peak learning
# rate (CENTRIC_ARGS, default "--lr 1e-3" for cpu.yaml's 2e-3): at 2e-3 it never learned to read
# its source (an unconditional language model: val BLEU 2.3 after 3,789 updates; docs/recipes.md).
# JOBS=2 trains two models at once, each on half the threads (every model then trains under the
# same conditions; a fair table on a 2-core machine), JOBS=1 (default) one after another on all.
#
# The table ($WORK_DIR/results.md): sacreBLEU on test2016 per direction and model, the model's
# parameters, and the off-target rate: the share of outputs whose language py3langid (the detect
# extra) finds to be another of the three than the target ("-" without py3langid).
# Data as run.sh (MULTI30K_DIR, ../shared/data/multi30k, or downloaded); WORK_DIR (default
# work-dirs/multi30k-multilingual); a re-run skips finished steps.
set -euo pipefail
source "$(dirname "$0")/../lib.sh"

CONFIG=${CONFIG:-$RECIPES/multi30k/cpu.yaml}
WORK_DIR=${WORK_DIR:-$REPO/work-dirs/multi30k-multilingual}
MODELS=${MODELS:-en-de en-fr en-de+fr english-centric}
JOBS=${JOBS:-1}
[[ $JOBS == 1 || $JOBS == 2 ]] || die "JOBS=$JOBS: 1 (one model at a time) or 2 (two at once)"
[[ -f $CONFIG ]] || die "config $CONFIG not found"

pairs_of() {  # the --pairs of a model name
  case $1 in
    en-de | en-fr) echo "$1" ;;
    en-de+fr) echo "en-de,en-fr" ;;
    english-centric) echo "en-de,de-en,en-fr,fr-en" ;;
    *) die "unknown model '$1' in MODELS: en-de, en-fr, en-de+fr, english-centric" ;;
  esac
}
directions_of() {  # the directions a model is asked on test2016
  case $1 in
    english-centric) echo "en-de de-en en-fr fr-en de-fr fr-de" ;;
    *) pairs_of "$1" | tr ',' ' ' ;;
  esac
}
for model in $MODELS; do pairs_of "$model" >/dev/null; done

for SRC_TGT in en-de en-fr; do  # all three languages, each split aligned
  SRC=${SRC_TGT%-*} TGT=${SRC_TGT#*-}
  source "$RECIPES/multi30k/data.sh"
  multi30k_data
done
mkdir -p "$WORK_DIR"

threads=()
if ((JOBS == 2)); then
  threads=(--threads "$(($(nproc) / 2 > 0 ? $(nproc) / 2 : 1))")
fi
read -r -a train_args <<<"${TRAIN_ARGS:-}"

# half_lr: "--lr X", half CONFIG's peak learning rate (nothing when CONFIG sets none: noam's own).
half_lr() {
  local lr
  lr=$(yaml_get "$CONFIG" train lr)
  [[ -z $lr ]] || python3 -c 'import sys; print(f"--lr {float(sys.argv[1]) / 2:g}")' "$lr"
}

# train_model NAME: preprocess, train and average one model into $WORK_DIR/NAME/averaged.pt.
train_model() {
  local name=$1 pairs dir
  pairs=$(pairs_of "$name") dir=$WORK_DIR/$name
  mkdir -p "$dir"
  local languages=(--pairs "$pairs")
  if [[ $pairs != *,* ]]; then  # bilingual: the data directory run.sh writes
    languages=(--source-lang "${pairs%-*}" --target-lang "${pairs#*-}")
  fi
  WORK_DIR=$dir step "$name: preprocess" "$dir/data-bin/meta.json" \
    xf preprocess --config "$CONFIG" --destdir "$dir/data-bin" "${languages[@]}" \
    --trainpref "$DATA/train" --validpref "$DATA/val" --overwrite --workers 1
  local own=()  # the model's own settings, before the user's TRAIN_ARGS (which win)
  [[ $name == english-centric ]] && read -r -a own <<<"${CENTRIC_ARGS-$(half_lr)}"
  WORK_DIR=$dir step "$name: train" "$dir/checkpoints/train.done" train_then_mark "$dir/checkpoints/train.done" \
    xf train "$dir/data-bin" --config "$CONFIG" --save-dir "$dir/checkpoints" "${threads[@]}" "${own[@]}" \
    "${train_args[@]}"
  WORK_DIR=$dir step "$name: average" "$dir/averaged.pt" \
    xf average-checkpoints --config "$CONFIG" --no-choose-on-valid --inputs "$dir/checkpoints" --output "$dir/averaged.pt"
}

# translate_model NAME: test2016 in every direction the model is asked -> NAME/test.SRC-TGT.
translate_model() {
  local name=$1 dir=$WORK_DIR/$1 direction src tgt target=()
  for direction in $(directions_of "$name"); do
    src=${direction%-*} tgt=${direction#*-}
    [[ $(pairs_of "$name") == *,* ]] && target=(--target-lang "$tgt")
    WORK_DIR=$dir step "$name: translate test2016 $direction" "$dir/test.$direction" \
      to_file "$dir/test.$direction" xf translate --config "$CONFIG" --path "$dir/averaged.pt" \
      --input "$DATA/test2016.$src" "${target[@]}" "${threads[@]}"
  done
}

log "multilingual Multi30k: models $MODELS; config $CONFIG; $JOBS at a time; work dir $WORK_DIR"
set -- $MODELS
while (($#)); do
  if ((JOBS == 2 && $# >= 2)); then  # two trainings side by side, each on half the cores
    train_model "$1" >"$WORK_DIR/$1.log" 2>&1 &
    first=$!
    train_model "$2" >"$WORK_DIR/$2.log" 2>&1 &
    second=$!
    status=0
    wait "$first" || status=1
    wait "$second" || status=$((status + 2))
    cat "$WORK_DIR/$1.log" "$WORK_DIR/$2.log" >&2  # what each step said, one model after the other
    ((status & 1)) && die "$1 failed: see $WORK_DIR/$1.log"
    ((status & 2)) && die "$2 failed: see $WORK_DIR/$2.log"
    shift 2
  else
    train_model "$1"
    shift
  fi
done
for model in $MODELS; do translate_model "$model"; done

# the table: sacreBLEU per direction, parameters, off-target rate
xf_python=$(head -1 "$(command -v xf)" | sed -n 's/^#!//p')
[[ -x ${xf_python:-} ]] || xf_python=python3
"$xf_python" - "$WORK_DIR" "$DATA" "$CONFIG" $MODELS <<'EOF' | tee "$WORK_DIR/results.md"
import json, os, platform, sys
from pathlib import Path

import sacrebleu
import torch

work, data, config, models = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4:]
try:
    from xformer_cli.text.language_id import LanguageId
    language_id = LanguageId.load(["en", "de", "fr"])
except ImportError:
    language_id = None
directions = ["en-de", "en-fr", "de-en", "fr-en", "de-fr", "fr-de"]
trained = {}
rows = []
for model in models:
    ckpt = torch.load(work / model / "averaged.pt", map_location="cpu", weights_only=True)
    meta = ckpt.get("meta", {})
    pairs = meta.get("pairs") or [f"{meta.get('source_lang')}-{meta.get('target_lang')}"]
    params = sum({t.data_ptr(): t.numel() for t in ckpt["model"].values() if torch.is_tensor(t)}.values())  # tied: once
    cells = []
    for d in directions:
        hyp = work / model / f"test.{d}"
        if not hyp.exists():
            cells.append("")
            continue
        src, tgt = d.split("-")
        lines = hyp.read_text(encoding="utf-8").splitlines()
        refs = (data / f"test2016.{tgt}").read_text(encoding="utf-8").splitlines()
        bleu = sacrebleu.corpus_bleu(lines, [refs]).score
        off = "-"
        if language_id is not None:
            wrong = sum(1 for line in lines if line.strip() and language_id.rank(line)[0][0][0] != tgt)
            off = f"{100 * wrong / len(lines):.1f}%"
        cells.append(f"{bleu:.2f} ({off})" + ("" if d in pairs else " zero-shot"))
    updates = meta.get("num_updates", "?")
    rows.append(f"| {model} | {', '.join(pairs)} | {params / 1e6:.1f}M | {updates} | " + " | ".join(cells) + " |")
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.machine())
print(f"Multi30k test2016, sacreBLEU (off-target rate); config {os.path.basename(config)}; {cpu}, {os.cpu_count()} CPU threads\n")
print("| model | trained on | parameters | updates | " + " | ".join(d.upper().replace("-", "->") for d in directions) + " |")
print("|---|---|---|---|" + "---|" * len(directions))
print("\n".join(rows))
EOF
