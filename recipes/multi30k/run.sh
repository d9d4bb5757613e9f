#!/usr/bin/env bash
# Multi30k (task 1, train 29,000 / val 1,014 / test2016 1,000 pairs) on a CPU, end to end:
#   xf preprocess (joint BPE) -> xf train -> xf average-checkpoints -> xf translate test2016
#   -> xf score (sacreBLEU, chrF, TER, and tokenized BLEU where sacremoses is installed)
#
#   bash recipes/multi30k/run.sh [en-de|en-fr]                             # cpu.yaml: ~35 min, 2 cores
#   CONFIG=recipes/multi30k/quick.yaml bash recipes/multi30k/run.sh en-de  # 10-13 min (make demo)
#   TRAIN_ARGS="--max-update 300" WORK_DIR=/tmp/m30k bash recipes/multi30k/run.sh en-fr
#
# Data: MULTI30K_DIR (train/val/test2016 .en/.de/.fr; missing files are downloaded into it), else
# ../shared/data/multi30k beside the repository, else work-dirs/multi30k-data, downloaded from
# github.com/multi30k/dataset (data/task1/raw at a pinned commit, sha256-checked; MULTI30K_URL
# names a mirror of that folder).
# Outputs go to WORK_DIR (default work-dirs/multi30k-PAIR); a re-run skips finished steps.
# More settings (extra flags per step, EXAMPLES=N): recipes/lib.sh.
set -euo pipefail
source "$(dirname "$0")/../lib.sh"

PAIR=${1:-en-de}
[[ $PAIR == en-de || $PAIR == en-fr ]] || die "usage: $0 [en-de|en-fr]"
SRC=${PAIR%-*} TGT=${PAIR#*-}
NAME="Multi30k $PAIR"
CONFIG=${CONFIG:-$RECIPES/multi30k/cpu.yaml}
WORK_DIR=${WORK_DIR:-$REPO/work-dirs/multi30k-$PAIR}

source "$RECIPES/multi30k/data.sh"
multi30k_data  # sets DATA

TRAINPREF=$DATA/train VALIDPREF=$DATA/val TESTPREF=$DATA/test2016
pipeline
