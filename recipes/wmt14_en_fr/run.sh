#!/usr/bin/env bash
# WMT14 English-French with the Transformer base or big, end to end:
#   prepare.sh (download, verify, extract) -> xf preprocess (joint BPE 32000) -> xf train
#   -> xf average-checkpoints (last 5 / 20) -> xf translate newstest2014 (beam 4, alpha 0.6)
#   -> xf score (sacreBLEU, and the paper's tokenized compound-split BLEU: 38.1 base, 41.8 big)
#
#   bash recipes/wmt14_en_fr/run.sh base        # or: big
#   WMT14_DIR=/data/wmt14 NGPU=8 bash recipes/wmt14_en_fr/run.sh big
#
# The batch follows the paper on any GPU count (about 25k source + 25k target tokens per update,
# TOKENS_PER_UPDATE): --update-freq = ceil(25000 / (GPUs x max_tokens)), under torchrun when there
# is more than one GPU. More settings: recipes/lib.sh, and the YAML files beside this script.
set -euo pipefail
source "$(dirname "$0")/../wmt14.sh"

TGT=fr PAPER_BASE=38.1 PAPER_BIG=41.8
wmt14_run "${1:-}"
