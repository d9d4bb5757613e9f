#!/usr/bin/env bash
# Table 3 of the paper (Sec. 6.2), scaled down, on Multi30k EN-DE: each row trained from the same
# seed for the same number of updates, validated on val (last checkpoint, beam 4), and the table
# written in the paper's columns with the paper's numbers beside (docs/ablations.md).
#
#   bash recipes/ablations/run.sh                         # every row; finished rows are skipped
#   bash recipes/ablations/run.sh base A1-h1 D1-drop0     # some rows (base.yaml is the row 'base')
#   ROWS_DIR=my-rows bash recipes/ablations/run.sh        # other rows (NAME.yaml: train options)
#
# Every step of every row is skipped when its output exists, so the study spreads over sittings:
# stop it any time (xf train resumes a row from checkpoint_last.pt) and re-run. Two runs side by
# side must be given different rows. After the rows, the table is rewritten from every finished
# row: WORK_DIR/table.md, table.csv and table.png (the plot needs matplotlib).
#
# Data: MULTI30K_DIR (train/val .en/.de), else ../shared/data/multi30k beside the repository.
# WORK_DIR (default work-dirs/ablations): data-bin/ (shared by all rows), rows/NAME/.
# CONFIG (default base.yaml here), TRAIN_ARGS, TRANSLATE_ARGS: as in recipes/lib.sh.
set -euo pipefail
source "$(dirname "$0")/../lib.sh"

HERE=$RECIPES/ablations
CONFIG=${CONFIG:-$HERE/base.yaml}
ROWS_DIR=${ROWS_DIR:-$HERE/rows}
WORK_DIR=${WORK_DIR:-$REPO/work-dirs/ablations}
DATA=${MULTI30K_DIR:-$REPO/../shared/data/multi30k}
SRC=en TGT=de
for split in train val; do
  [[ -f $DATA/$split.$SRC && -f $DATA/$split.$TGT ]] || die "$DATA lacks $split.$SRC or $split.$TGT (set MULTI30K_DIR)"
  check_lines "$DATA/$split.$SRC" "$DATA/$split.$TGT" >/dev/null
done

if (($# == 0)); then  # base first, then the rows in file-name order
  set -- base $(cd "$ROWS_DIR" && ls -- *.yaml 2>/dev/null | sed 's/\.yaml$//')
fi
for row in "$@"; do
  [[ $row == base || -f $ROWS_DIR/$row.yaml ]] || die "no row '$row': $ROWS_DIR/$row.yaml not found"
done

# row_flags FILE: a row's `key: value` lines as xf train flags (--key value)
row_flags() {
  awk '{ sub(/#.*/, "") } NF == 2 && $1 ~ /:$/ { k = substr($1, 1, length($1) - 1); gsub(/_/, "-", k); print "--" k; print $2 }' "$1"
}

mkdir -p "$WORK_DIR"
read -r -a train_args <<<"${TRAIN_ARGS:-}"
read -r -a translate_args <<<"${TRANSLATE_ARGS:-}"
data_bin=$WORK_DIR/data-bin
log "Table 3 ablations: config $CONFIG, rows $*, work dir $WORK_DIR"
step "preprocess" "$data_bin/meta.json" \
  xf preprocess --config "$CONFIG" --destdir "$data_bin" --source-lang "$SRC" --target-lang "$TGT" \
  --trainpref "$DATA/train" --validpref "$DATA/val" --overwrite

for row in "$@"; do
  dir=$WORK_DIR/rows/$row
  mkdir -p "$dir"
  flags=()
  [[ $row == base ]] || mapfile -t flags < <(row_flags "$ROWS_DIR/$row.yaml")
  step "$row: train${flags[*]:+ ${flags[*]}}" "$dir/checkpoints/train.done" train_then_mark "$dir/checkpoints/train.done" \
    xf train "$data_bin" --config "$CONFIG" --save-dir "$dir/checkpoints" "${flags[@]}" "${train_args[@]}"
  step "$row: translate val.$SRC" "$dir/val.hyp.$TGT" \
    to_file "$dir/val.hyp.$TGT" xf translate --config "$CONFIG" --path "$dir/checkpoints/checkpoint_last.pt" \
    --input "$DATA/val.$SRC" "${translate_args[@]}"
  step "$row: score" "$dir/val.score.json" \
    to_file "$dir/val.score.json" xf score --ref "$DATA/val.$TGT" --hyp "$dir/val.hyp.$TGT" --json --metrics bleu
done

# the table: xf's own interpreter (it has matplotlib when the plot extra is installed)
python=$(dirname "$(command -v xf)")/python
[[ -x $python ]] || python=python3
"$python" "$HERE/table.py" "$WORK_DIR" "$HERE/paper.csv"
