# recipes/wmt14.sh: what the WMT14 EN-DE and EN-FR recipes share. Sourced by their scripts.
#
# wmt14_prepare OUT  writes raw text OUT/{train,valid,test}.{en,$TGT} from the official archives.
#   The caller sets TGT, ARCHIVES (url ...), CORPORA (file stem, expected line count, ...) and
#   TEST_SGM (the newstest2014 source and reference .sgm names in test-full.tgz).
#   Each archive is taken from WMT14_DIR when it holds a file of that name, else downloaded into
#   OUT/../downloads. Archives are extracted whole into OUT/../extracted, the corpora found there
#   by name, checked (both sides align; line counts against WMT's), and concatenated.
#   Nothing else is done to the text: cleaning and BPE are xf preprocess's job.
# wmt14_run VARIANT  runs the pipeline of recipes/lib.sh with VARIANT.yaml (base or big).

source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# find_corpus DIR STEM LANG: the path of STEM.LANG (or STEM.LANG.gz) under DIR.
find_corpus() {
  local found
  found=$(find "$1" \( -path "*/$2.$3" -o -path "*/$2.$3.gz" \) -print | sort | head -n 1)
  [[ -n $found ]] || die "$2.$3 not found in the extracted archives under $1 (is an archive missing or truncated?)"
  echo "$found"
}

# cat_any FILE: print FILE, decompressing a .gz (giga-fren ships gzipped inside its tar).
cat_any() { if [[ $1 == *.gz ]]; then gzip -dc "$1"; else cat "$1"; fi; }

# sgm_to_text SGM OUT: the segments of a WMT .sgm file, one per line, whitespace normalized as
# sacrebleu does for these files (so scores match `sacrebleu -t wmt14/full`).
sgm_to_text() {
  python3 - "$1" "$2" <<'EOF'
import re, sys
with open(sys.argv[1], encoding="utf-8") as f, open(sys.argv[2], "w", encoding="utf-8") as out:
    for line in f:
        if line.lstrip().startswith("<seg "):
            text = re.sub(r"<seg.*?>(.*)</seg>.*?", r"\1", line.strip())
            out.write(re.sub(r"\s+", " ", text.strip()) + "\n")
EOF
}

wmt14_prepare() {
  local out=$1 src=en
  local downloads extracted tmp
  # downloads and extracted archives are shared by EN-DE and EN-FR (Europarl, Common Crawl, ...)
  downloads="$(dirname "$out")/wmt14-downloads" extracted="$(dirname "$out")/wmt14-extracted" tmp="$out.tmp"
  mkdir -p "$downloads" "$extracted"

  log "WMT14 $src-$TGT: archives"
  local url file archive
  for url in "${ARCHIVES[@]}"; do
    file=$(basename "$url")
    if [[ -n ${WMT14_DIR:-} && -f $WMT14_DIR/$file ]]; then
      archive="$WMT14_DIR/$file"
    else
      archive="$downloads/$file"
      [[ -f $archive ]] || fetch "$url" "$archive"
    fi
    if [[ ! -f $extracted/.$file.done ]]; then
      note "extracting $archive"
      tar -xf "$archive" -C "$extracted" || die "cannot extract $archive (truncated download? delete it and re-run)"
      touch "$extracted/.$file.done"
    fi
  done

  rm -rf "$tmp" && mkdir -p "$tmp"
  log "WMT14 $src-$TGT: training corpora"
  local i stem expected a b lines total=0
  for ((i = 0; i < ${#CORPORA[@]}; i += 2)); do
    stem=${CORPORA[i]} expected=${CORPORA[i + 1]}
    a=$(find_corpus "$extracted" "$stem" "$src")
    b=$(find_corpus "$extracted" "$stem" "$TGT")
    cat_any "$a" >"$tmp/part.$src"
    cat_any "$b" >"$tmp/part.$TGT"
    lines=$(check_lines "$tmp/part.$src" "$tmp/part.$TGT")
    if ((lines == expected)); then
      note "$stem: $lines pairs (as published)"
    else
      note "WARNING: $stem: $lines pairs, WMT14's release has $expected: a different release of the corpus?"
    fi
    cat "$tmp/part.$src" >>"$tmp/train.$src" && cat "$tmp/part.$TGT" >>"$tmp/train.$TGT"
    total=$((total + lines))
  done
  rm -f "$tmp/part.$src" "$tmp/part.$TGT"
  note "train: $total pairs (xf preprocess drops empty, over-long and length-ratio outliers)"

  log "WMT14 $src-$TGT: newstest2013 (valid) and newstest2014 (test)"
  local lang
  for lang in "$src" "$TGT"; do  # dev.tgz: plain text
    a=$(find_corpus "$extracted" newstest2013 "$lang")
    cp "$a" "$tmp/valid.$lang"
  done
  a=$(find_corpus "$extracted" "${TEST_SGM[0]%.sgm}" sgm)  # test-full.tgz: sgm
  b=$(find_corpus "$extracted" "${TEST_SGM[1]%.sgm}" sgm)
  sgm_to_text "$a" "$tmp/test.$src"
  sgm_to_text "$b" "$tmp/test.$TGT"
  lines=$(check_lines "$tmp/valid.$src" "$tmp/valid.$TGT")
  ((lines == 3000)) || die "newstest2013 has $lines lines, expected 3000"
  lines=$(check_lines "$tmp/test.$src" "$tmp/test.$TGT")
  ((lines == 3003)) || die "newstest2014 (full) has $lines lines, expected 3003"
  note "valid: 3000 lines, test: 3003 lines"

  rm -rf "$out" && mv "$tmp" "$out"
  note "raw text in $out"
}

wmt14_run() {
  local variant=${1:-}
  [[ $variant == base || $variant == big ]] || die "usage: $0 base|big"
  local here
  here="$(cd "$(dirname "$0")" && pwd)"
  NAME="WMT14 en-$TGT $variant"
  CONFIG=${CONFIG:-$here/$variant.yaml}
  WORK_DIR=${WORK_DIR:-$REPO/work-dirs/wmt14_en_$TGT-$variant}
  RAW=${RAW:-$(dirname "$WORK_DIR")/wmt14_en_$TGT-raw}  # shared by base and big
  SRC=en TRAINPREF=$RAW/train VALIDPREF=$RAW/valid TESTPREF=$RAW/test
  TOKENS_PER_UPDATE=${TOKENS_PER_UPDATE:-25000}
  [[ $variant == base ]] && PAPER=$PAPER_BASE || PAPER=$PAPER_BIG
  if [[ ! -f $RAW/test.$TGT ]]; then
    bash "$here/prepare.sh" "$RAW"
  else
    log "prepare: skipped, $RAW/test.$TGT exists"
  fi
  pipeline
}
