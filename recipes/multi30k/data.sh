# recipes/multi30k/data.sh: the Multi30k files, found or downloaded and checked. Sourced (after
# recipes/lib.sh, with SRC and TGT set) by run.sh and distill.sh.
#
# Data: MULTI30K_DIR (train/val/test2016 .en/.de/.fr; missing files are downloaded into it), else
# ../shared/data/multi30k beside the repository, else work-dirs/multi30k-data, downloaded from
# github.com/multi30k/dataset (data/task1/raw at a pinned commit, sha256-checked; MULTI30K_URL
# names a mirror of that folder).

# The dataset's repository, pinned; sha256 of the gunzipped files (as in ../shared/data/multi30k).
URL=${MULTI30K_URL:-https://raw.githubusercontent.com/multi30k/dataset/a3d2e0d26b56f3846f66a952536ffed4e401d05a/data/task1/raw}
declare -A SHA256=(
  [train.en]=460a15fbd157e34a7a9957ee388c1ca247fe47af3ef25fb50442af6c274e0fc6
  [train.de]=2c2b73fd2b548fbcde3a875e0a78d6ee94d498bfdee6bd3eae3945779e9ddf72
  [train.fr]=5925a3c18f1587b6b54b87743106e6e8ab93618edb6f65d19eac0621f853a10d
  [val.en]=1f2a23d992769b5b3d209b0a10dd0b77c08cceb1f20dfb97ed0aafa49d107227
  [val.de]=660e09eb7e1da2f856ea13ee5ad3cf6d36b3d5b0b733c857e94c5747a3dfc660
  [val.fr]=5304e444d842e962b2dda4d816b70b22a1765b15401642b7ca37a67477e708dc
  [test2016.en]=399a4382932c1aadd3ceb9bef1008d388a64c76d4ae4e9d4728c6f4301cac182
  [test2016.de]=4be6b5b3236b79c25475c6bb829800a7ce559e9ba7a1f6c2394fe4d40be46d16
  [test2016.fr]=cb3160d69b002bb638e66cc7612fcd56cb0af82eadc9c142dedc438afb885ef6
)

download_multi30k() {
  local dir=$1 split lang name remote
  mkdir -p "$dir"
  for split in train val test2016; do
    for lang in "$SRC" "$TGT"; do
      name=$split.$lang
      [[ -f $dir/$name ]] && continue
      remote=$split.$lang.gz
      [[ $split == test2016 ]] && remote=test_2016_flickr.$lang.gz
      fetch "$URL/$remote" "$dir/$remote"  # only what is missing
      gzip -dc "$dir/$remote" >"$dir/$name.tmp" && rm "$dir/$remote"
      [[ $(sha256 "$dir/$name.tmp") == "${SHA256[$name]}" ]] || die "$URL/$remote: unexpected sha256"
      mv "$dir/$name.tmp" "$dir/$name"
    done
  done
}

# multi30k_data: set DATA to the folder of {train,val,test2016}.{$SRC,$TGT}, downloading what is
# missing, and check that the two sides of every split align.
multi30k_data() {
  if [[ -n ${MULTI30K_DIR:-} ]]; then
    DATA=$MULTI30K_DIR                          # files missing there are downloaded into it
  elif [[ -f $REPO/../shared/data/multi30k/train.$SRC ]]; then
    DATA=$(cd "$REPO/../shared/data/multi30k" && pwd)
  else
    DATA=$REPO/work-dirs/multi30k-data
  fi
  download_multi30k "$DATA"
  local split lines
  for split in train val test2016; do
    [[ -f $DATA/$split.$SRC && -f $DATA/$split.$TGT ]] || die "$DATA lacks $split.$SRC or $split.$TGT"
    lines=$(check_lines "$DATA/$split.$SRC" "$DATA/$split.$TGT")
    note "$split: $lines pairs ($DATA)"
  done
}
