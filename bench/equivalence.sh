#!/usr/bin/env bash
# The same-behaviour check of a restructuring: seeded short trainings (one fine-tuned with
# --init-from), a resume, and translations (text, n-best jsonl, alignments, both engines), each
# output hashed. Run it on the tree before and after a change and diff the two hash lists:
#   bash bench/equivalence.sh /tmp/before.txt   (on the old tree)
#   bash bench/equivalence.sh /tmp/after.txt && diff /tmp/before.txt /tmp/after.txt
# Needs xf on PATH (make venv; PATH=.venv/bin:$PATH), ctranslate2, and Multi30k at
# ../shared/data/multi30k (or DATA=dir with train/val/test2016 .en/.de).
# The micro model's outputs are mostly empty: MODEL=a trained en-de checkpoint (make demo's
# work-dirs/quickstart/averaged.pt) adds its translations of 150 test2016 lines, plain, n-best,
# alignments, int8, with a glossary and with constraints, and through CTranslate2.
set -euo pipefail
out=${1:?usage: bash bench/equivalence.sh HASHES.txt}
data=${DATA:-$(cd "$(dirname "$0")/.." && pwd)/../shared/data/multi30k}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
mkdir raw
for split in train val; do for l in en de; do
    n=$([ $split = train ] && echo 3000 || echo 200)
    head -n $n "$data/$split.$l" > raw/$split.$l
done; done
head -n 100 "$data/test2016.en" > test.en
export OMP_NUM_THREADS=1
micro=(--arch tiny --d-model 32 --d-ff 64 --heads 2 --encoder-layers 1 --decoder-layers 1 --max-tokens 600
       --warmup-updates 10 --log-interval 5 --device cpu --seed 3 --threads 1 --precision fp32)
xf preprocess --trainpref raw/train --validpref raw/val --destdir bin --bpe-vocab-size 500 --workers 1 >/dev/null 2>&1
xf train bin --save-dir a "${micro[@]}" --max-update 30 --save-interval-updates 15 >/dev/null 2>&1
# a resume: 30 updates, then to 45 (the same run continued)
xf train bin --save-dir a "${micro[@]}" --max-update 45 --save-interval-updates 15 >/dev/null 2>&1
# a fine-tune from it
xf train bin --save-dir ft --init-from a/checkpoint_last.pt --lr-factor 0.5 --device cpu --seed 5 --threads 1 \
    --precision fp32 --max-tokens 600 --max-update 12 --log-interval 4 --warmup-updates 4 >/dev/null 2>&1
t=(--beam-size 4 --threads 1 --quiet --input test.en)
xf translate --path a/checkpoint_last.pt "${t[@]}" --output hyp.txt
xf translate --path a/checkpoint_last.pt "${t[@]}" --nbest 3 --output-format jsonl --output nbest.jsonl
xf translate --path a/checkpoint_last.pt "${t[@]}" --print-alignment --output align.txt
xf translate --path ft/checkpoint_last.pt "${t[@]}" --output ft.txt
xf export ctranslate2 --path a/checkpoint_last.pt --output ct2 >/dev/null 2>&1
xf translate --path ct2 --engine ctranslate2 "${t[@]}" --output ct2.txt
{
python3 - a ft <<'PY'
import hashlib, sys, torch
for d in sys.argv[1:]:
    ck = torch.load(f"{d}/checkpoint_last.pt", map_location="cpu", weights_only=True)
    h = hashlib.sha256()
    for k in sorted(ck["model"]):
        h.update(k.encode()); h.update(ck["model"][k].numpy().tobytes())
    print(f"{d}/checkpoint_last.pt weights {h.hexdigest()}")
PY
for f in hyp.txt nbest.jsonl align.txt ft.txt ct2.txt; do echo "$f $(sha256sum < $f | cut -c1-64)"; done
if [[ -n ${MODEL:-} ]]; then
    head -n 150 "$data/test2016.en" > fixed.en
    python3 - <<'PY'
import json
words = ["Hund", "Mann", "Frau", "Straße"]
lines = open("fixed.en", encoding="utf-8").read().splitlines()[:40]
with open("constrained.jsonl", "w", encoding="utf-8") as f:
    for i, line in enumerate(lines):
        f.write(json.dumps({"source": line, "constraints": [words[i % 4]]}, ensure_ascii=False) + "\n")
with open("terms.tsv", "w", encoding="utf-8") as f:
    f.write("dog\tKöter\nman\tHerr\nwoman\tDame\nstreet\tGasse\n")
PY
    m=(--path "$MODEL" --threads 1 --quiet)
    xf translate "${m[@]}" --input fixed.en --output m.plain.txt
    xf translate "${m[@]}" --input fixed.en --nbest 2 --output-format jsonl --output m.nbest.jsonl
    xf translate "${m[@]}" --input fixed.en --print-alignment --output m.align.txt
    xf translate "${m[@]}" --input fixed.en --quantize int8 --output m.int8.txt
    xf translate "${m[@]}" --input fixed.en --glossary terms.tsv --output m.glossary.txt
    xf translate "${m[@]}" --input constrained.jsonl --input-format jsonl --output m.constrained.txt
    xf export ctranslate2 --path "$MODEL" --output m-ct2 >/dev/null 2>&1
    xf translate --path m-ct2 --engine ctranslate2 --threads 1 --quiet --input fixed.en --output m.ct2.txt
    for f in m.plain.txt m.nbest.jsonl m.align.txt m.int8.txt m.glossary.txt m.constrained.txt m.ct2.txt; do
        echo "MODEL $f $(sha256sum < $f | cut -c1-64)"
    done
fi
for d in a ft; do echo "$d/train_log losses $(grep -o '"loss": [0-9.e-]*' $d/train_log.jsonl | sha256sum | cut -c1-64)"; done
} > "$out"
cat "$out"
