#!/usr/bin/env bash
# WMT14 English-German with the Transformer base or big, end to end:
#   prepare.sh (download, verify, extract) -> xf preprocess (joint BPE 37000) -> xf train
#   -> xf average-checkpoints (last 5 / 20) -> xf translate newstest2014 (beam 4, alpha 0.6)
#   -> xf score (sacreBLEU, and the paper's tokenized compound-split BLEU: 27.3 base, 28.4 big)
#
#   bash recipes/wmt14_en_de/run.sh base        # or: big
#   WMT14_DIR=/data/wmt14 NGPU=8 bash recipes/wmt14_en_de/run.sh big
#   TRAIN_ARGS="--max-update 20000" WORK_DIR=/scratch/ende bash recipes/wmt14_en_de/run.sh base
#
# The batch follows the paper on any GPU count (about 25k source + 25k target tokens per update,
# TOKENS_PER_UPDATE): --update-freq = ceil(25000 / (GPUs x max_tokens)), under torchrun when there
# is more than one GPU. More settings: recipes/lib.sh, and the YAML files beside this script.
set -euo pipefail
source "$(dirname "$0")/../wmt14.sh"

TGT=de PAPER_BASE=27.3 PAPER_BIG=28.4
wmt14_run "${1:-}"
