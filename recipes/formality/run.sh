#!/usr/bin/env bash
# Formality on request, du or Sie: does a model trained with formality tags (xf preprocess
# --formality-tags) take the address xf translate --formality asks for? Two EN-DE models trained
# on Tatoeba for the same budget (CONFIG's max_update), one with the tags and one without, both
# over the same vocabulary, translate CoCoA-MT's English (400 segments of conversation); each
# output is scored by CoCoA-MT's formality accuracy and by sacreBLEU against the formal and the
# informal reference.
#
#   bash recipes/formality/run.sh                       # cpu.yaml: two trainings of 1,500 updates
#   TRAIN_ARGS="--max-update 500" WORK_DIR=/tmp/f bash recipes/formality/run.sh
#
# Steps (each skipped when its output exists, so a re-run continues where it stopped):
#   split       Tatoeba -> WORK_DIR/raw/{train,valid}.{en,de} by English sentence (split.py: 2% of
#               the English sentences, by a hash, with all their translations, go to valid);
#               CoCoA-MT's two domains -> WORK_DIR/raw/test.* (the English, both references)
#   preprocess  WORK_DIR/tagged/data-bin with --formality-tags (learns the vocabulary, the tags
#               among its control symbols), WORK_DIR/plain/data-bin with that vocabulary, untagged
#   train, average  each model (CONFIG's train and average_checkpoints sections)
#   translate   plain: once, untagged; tagged: --formality formal, --formality informal, untagged;
#               Tatoeba's validation split: both untagged, the tagged model also with each line's
#               reference's formality (oracle.py: a jsonl "formality" where the classifier finds one)
#   table       WORK_DIR/results.md (table.py)
#
# Data: TATOEBA_DIR (default ../shared/data/tatoeba beside the repository: tatoeba.en-de.en/.de),
# COCOA_DIR (default ../shared/data/cocoa-mt). Outputs: WORK_DIR (default work-dirs/formality).
# PREPROCESS_ARGS, TRAIN_ARGS, TRANSLATE_ARGS add flags to every call of that step.
set -euo pipefail
source "$(dirname "$0")/../lib.sh"

CONFIG=${CONFIG:-$RECIPES/formality/cpu.yaml}
WORK_DIR=${WORK_DIR:-$REPO/work-dirs/formality}
TATOEBA_DIR=${TATOEBA_DIR:-$REPO/../shared/data/tatoeba}
COCOA_DIR=${COCOA_DIR:-$REPO/../shared/data/cocoa-mt}
[[ -f $CONFIG ]] || die "config $CONFIG not found"
[[ -f $TATOEBA_DIR/tatoeba.en-de.en ]] || die "no Tatoeba EN-DE in $TATOEBA_DIR (set TATOEBA_DIR)"
[[ -f $COCOA_DIR/formality-control.train.telephony.en-de.en ]] || die "no CoCoA-MT EN-DE in $COCOA_DIR (set COCOA_DIR)"
read -r -a preprocess_args <<<"${PREPROCESS_ARGS:-}"
read -r -a train_args <<<"${TRAIN_ARGS:-}"
read -r -a translate_args <<<"${TRANSLATE_ARGS:-}"
xf_python=$(head -1 "$(command -v xf)" | sed -n 's/^#!//p')  # the interpreter xf is installed in
[[ -x ${xf_python:-} ]] || xf_python=python3
mkdir -p "$WORK_DIR"
RAW=$WORK_DIR/raw

log "formality: config $CONFIG, work dir $WORK_DIR"
step "split Tatoeba by English sentence; CoCoA-MT as the test set" "$RAW/split.json" \
  "$xf_python" "$RECIPES/formality/split.py" "$TATOEBA_DIR" "$COCOA_DIR" "$RAW"

languages=(--source-lang en --target-lang de --trainpref "$RAW/train" --validpref "$RAW/valid")
step "tagged: preprocess (--formality-tags)" "$WORK_DIR/tagged/data-bin/meta.json" \
  xf preprocess --config "$CONFIG" --destdir "$WORK_DIR/tagged/data-bin" "${languages[@]}" --formality-tags \
  --overwrite "${preprocess_args[@]}"
# the plain data takes the tagged data's vocabulary: CONFIG less what learns one (--spm-model gives it)
mkdir -p "$WORK_DIR/plain"
"$xf_python" - "$CONFIG" "$WORK_DIR/plain/config.yaml" <<'EOF'
import sys, yaml
config = yaml.safe_load(open(sys.argv[1], encoding="utf-8")) or {}
for key in ("bpe_vocab_size", "bpe_sample_lines"):
    (config.get("preprocess") or {}).pop(key, None)
open(sys.argv[2], "w", encoding="utf-8").write(yaml.safe_dump(config))
EOF
step "plain: preprocess (the tagged data's vocabulary)" "$WORK_DIR/plain/data-bin/meta.json" \
  xf preprocess --config "$WORK_DIR/plain/config.yaml" --destdir "$WORK_DIR/plain/data-bin" "${languages[@]}" \
  --spm-model "$WORK_DIR/tagged/data-bin/spm.model" --overwrite "${preprocess_args[@]}"

for model in plain tagged; do
  dir=$WORK_DIR/$model
  step "$model: train" "$dir/checkpoints/train.done" train_then_mark "$dir/checkpoints/train.done" \
    xf train "$dir/data-bin" --config "$CONFIG" --save-dir "$dir/checkpoints" "${train_args[@]}"
  step "$model: average" "$dir/averaged.pt" \
    xf average-checkpoints --config "$CONFIG" --no-choose-on-valid --inputs "$dir/checkpoints" --output "$dir/averaged.pt"
done

for asked in none formal informal; do
  for model in plain tagged; do
    [[ $model == plain && $asked != none ]] && continue  # a model without tags refuses --formality
    formality=()
    [[ $asked != none ]] && formality=(--formality "$asked")
    step "$model: translate CoCoA-MT ($asked)" "$WORK_DIR/$model/test.$asked.de" \
      to_file "$WORK_DIR/$model/test.$asked.de" xf translate --config "$CONFIG" --path "$WORK_DIR/$model/averaged.pt" \
      --input "$RAW/test.en" "${formality[@]}" "${translate_args[@]}"
  done
done

# Tatoeba's validation split: both models untagged, and the tagged one with each line's own
# address as its reference says it (the classifier's label: what the tags cost where they are right)
step "tagged: the validation sources with their references' formality" "$RAW/valid.oracle.jsonl" \
  "$xf_python" "$RECIPES/formality/oracle.py" "$RAW/valid.en" "$RAW/valid.de" "$RAW/valid.oracle.jsonl"
for model in plain tagged; do
  step "$model: translate the validation split (untagged)" "$WORK_DIR/$model/valid.none.de" \
    to_file "$WORK_DIR/$model/valid.none.de" xf translate --config "$CONFIG" --path "$WORK_DIR/$model/averaged.pt" \
    --input "$RAW/valid.en" "${translate_args[@]}"
done
step "tagged: translate the validation split (each line's own formality)" "$WORK_DIR/tagged/valid.oracle.de" \
  to_file "$WORK_DIR/tagged/valid.oracle.de" xf translate --config "$CONFIG" --path "$WORK_DIR/tagged/averaged.pt" \
  --input "$RAW/valid.oracle.jsonl" --input-format jsonl "${translate_args[@]}"

"$xf_python" "$RECIPES/formality/table.py" "$WORK_DIR"
