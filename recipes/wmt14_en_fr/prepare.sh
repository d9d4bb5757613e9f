#!/usr/bin/env bash
# WMT14 English-French, the data of the paper-era recipes (tensor2tensor, fairseq):
#   train  Europarl v7 + Common Crawl + UN + News Commentary v9 + 10^9 French-English (Giga)
#          (40.8M pairs; about 36M after xf preprocess's cleaning, as in the paper)
#   valid  newstest2013 (3000 lines)      test  newstest2014, the full 3003-line set
# Writes raw, untokenized text OUT/{train,valid,test}.{en,fr}; xf preprocess learns the BPE.
#
#   bash recipes/wmt14_en_fr/prepare.sh OUT
#   WMT14_DIR=/data/wmt14 bash recipes/wmt14_en_fr/prepare.sh OUT   # archives downloaded already
#
# WMT14_DIR may hold any of the archives below under their own names; the rest are downloaded
# (about 6 GB for the UN and Giga corpora).
set -euo pipefail
source "$(dirname "$0")/../wmt14.sh"

TGT=fr
ARCHIVES=(
  http://www.statmt.org/wmt13/training-parallel-europarl-v7.tgz
  http://www.statmt.org/wmt13/training-parallel-commoncrawl.tgz
  http://www.statmt.org/wmt13/training-parallel-un.tgz
  http://www.statmt.org/wmt14/training-parallel-nc-v9.tgz
  http://www.statmt.org/wmt10/training-giga-fren.tar
  http://www.statmt.org/wmt14/dev.tgz
  http://www.statmt.org/wmt14/test-full.tgz
)
CORPORA=(  # file stem in the archives, pairs in WMT14's release
  europarl-v7.fr-en 2007723
  commoncrawl.fr-en 3244152
  undoc.2000.fr-en 12886831
  news-commentary-v9.fr-en 183251
  giga-fren.release2.fixed 22520376
)
TEST_SGM=(newstest2014-fren-src.en.sgm newstest2014-fren-ref.fr.sgm)

wmt14_prepare "${1:?usage: $0 OUT}"
