#!/usr/bin/env bash
# WMT14 English-German, the data of the paper-era recipes (tensor2tensor, fairseq):
#   train  Europarl v7 + Common Crawl + News Commentary v9   (4.5M pairs)
#   valid  newstest2013 (3000 lines)      test  newstest2014, the full 3003-line set
# Writes raw, untokenized text OUT/{train,valid,test}.{en,de}; xf preprocess learns the BPE.
#
#   bash recipes/wmt14_en_de/prepare.sh OUT
#   WMT14_DIR=/data/wmt14 bash recipes/wmt14_en_de/prepare.sh OUT   # archives downloaded already
#
# WMT14_DIR may hold any of the archives below under their own names; the rest are downloaded.
set -euo pipefail
source "$(dirname "$0")/../wmt14.sh"

TGT=de
ARCHIVES=(
  http://www.statmt.org/wmt13/training-parallel-europarl-v7.tgz
  http://www.statmt.org/wmt13/training-parallel-commoncrawl.tgz
  http://www.statmt.org/wmt14/training-parallel-nc-v9.tgz
  http://www.statmt.org/wmt14/dev.tgz
  http://www.statmt.org/wmt14/test-full.tgz
)
CORPORA=(  # file stem in the archives, pairs in WMT14's release
  europarl-v7.de-en 1920209
  commoncrawl.de-en 2399123
  news-commentary-v9.de-en 201288
)
TEST_SGM=(newstest2014-deen-src.en.sgm newstest2014-deen-ref.de.sgm)

wmt14_prepare "${1:?usage: $0 OUT}"
