#!/usr/bin/env bash
# What `make demo` runs: the Multi30k EN-DE recipe in a short setting (10-13 minutes on a
# 2-core CPU), ending with its BLEU, a few example translations and the path of curves.png.
#
#   bash recipes/quickstart.sh                      # outputs in work-dirs/quickstart
#   WORK_DIR=/tmp/demo bash recipes/quickstart.sh   # elsewhere
# A re-run reuses finished steps; delete WORK_DIR to start over. The data comes from
# MULTI30K_DIR, ../shared/data/multi30k, or is downloaded (see recipes/multi30k/run.sh).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
export WORK_DIR=${WORK_DIR:-$(dirname "$here")/work-dirs/quickstart}
export CONFIG=${CONFIG:-$here/multi30k/quick.yaml}
export EXAMPLES=${EXAMPLES:-5}
exec bash "$here/multi30k/run.sh" en-de
