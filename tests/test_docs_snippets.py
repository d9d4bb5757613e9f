"""The manual's snippets run as written: every ```bash/```sh/```console and ```python block of README.md
and docs/*.md is either run here, for real, on a tiny trained model in a directory holding the files it
names (RUN), or listed in NOT_RUNNABLE with the reason it cannot be (a GPU, WMT data, hours of training,
the network, a program xf does not install). A new snippet in neither fails the test until it is
classified."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from xformer_cli.model.checkpoint import load_checkpoint

from helpers import REPO, bench_module, multilingual_checkpoint, random_checkpoint, read, write

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(bash|sh|console|python)\n(.*?)^```", re.M | re.S)


def snippets(pages=PAGES, root=REPO) -> dict[tuple[str, str], tuple[str, str]]:
    """(page, the snippet's first line) -> (language, text), in the order of the pages; a page's
    second snippet that begins as an earlier one does is "FIRST LINE (2)"."""
    out = {}
    for page in pages:
        for m in FENCE.finditer(page.read_text(encoding="utf-8")):
            first = m.group(2).splitlines()[0].strip()
            key, n = (page.relative_to(root).as_posix(), first), 1
            while key in out:
                n += 1
                key = (key[0], f"{first} ({n})")
            out[key] = (m.group(1), m.group(2))
    return out


# Run for real, each page's in the page's order in one directory (a later snippet may read what an
# earlier one wrote, as a reader's would). The directory holds the names the snippets use:
# averaged.pt, avg.pt, model.pt, a.pt, b.pt (copies of the tiny model), checkpoints (its training
# directory), test.en, test.de and hypotheses (Multi30k's test2016), data-bin (its data directory);
# decoding.md's too: multi.pt (helpers.multilingual_checkpoint), en-de.pt and a random de-en.pt
# over its vocabulary, train.* and val.* (Multi30k's first lines).
RUN = {
    ("docs/data.md", "from xformer_cli.data.batching import batch_by_size, collate"),
    ("docs/decoding.md", "xf score-pairs --path model.pt --source train.en --target train.de > scores.jsonl"),
    ("docs/decoding.md", "xf calibrate --path en-de.pt --reverse-path de-en.pt --source val.en --reference val.de \\"),
    ("docs/decoding.md", "xf translate --path multi.pt --target-lang de < test.en > test.hyp.de"),
    ("docs/decoding.md", "printf 'A man sleeps. A dog barks!\\n' | xf translate --path avg.pt --split-sentences en"),
    ("docs/decoding.md", """printf '%s\\n' '{"source": "A man in a blue shirt sleeps .", "prefix": "Ein Herr"}' \\"""),
    ("docs/decoding.md", "xf translate --path avg.pt --input-format jsonl --input in.jsonl --alternatives 3"),
    ("docs/decoding.md", """printf '%s\\n' '{"source": "a man sleeps", "constraints": ["Hund", ["Katze", "Katzen"]]}' \\"""),
    ("docs/decoding.md", "xf shortlist data-bin --output shortlist.npz     # defaults: --frequent 100 --per-source 20 --em-iterations 5"),
    ("docs/export.md", "xf export ctranslate2 --path averaged.pt --output model-ct2               # float32 weights"),
    ("docs/export.md", "xf export argos --path averaged.pt --output en_de.argosmodel \\"),  # argostranslate's files in the page's directory
    ("docs/export.md", "unzip en_de.argosmodel 'translate-en_de-1_0/model/*'"),
    ("docs/export.md", "xf train data-bin --init-from averaged.pt --init-from-convert --sinusoids tensor2tensor --decoder-start zero \\"),
    ("docs/huggingface.md", "xf export huggingface --path averaged.pt --output model-hf --beam-size 4 --lenpen 1.0 --bleu test.score.json"),
    ("docs/huggingface.md", "from transformers import MarianMTModel, MarianTokenizer"),
    ("docs/metrics.md", "xf score --ref newstest2014.de --hyp hyp.de                 # sacreBLEU, chrF, TER with signatures"),
    ("docs/model.md", "import torch"),
    ("docs/training.md", "xf average-checkpoints --inputs checkpoints --num-update-checkpoints 5 --output averaged.pt"),
}

_GPU = "needs a CUDA device"
_NET = "downloads packages or models (the network)"
_TRAIN = "trains a model on real data (hours), or on WMT data"
_SERVER = "talks to a running xf serve over HTTP (curl); tests/test_serve*.py send these requests"
_FRAGMENT = "a fragment: the names it uses (model, src, ...) are the reader's"
NOT_RUNNABLE = {
    ("README.md", "make demo   # creates .venv, installs xf, trains and evaluates on Multi30k end to end"): _NET,
    ("README.md", "make venv                    # only creates .venv and installs xf into it"): _NET,
    ("README.md", "make test TORCH='torch>=2.4'     # any torch 2.4 or newer; keeps an installed CUDA build"): _NET,
    ("README.md", "xf preprocess --source-lang en --target-lang de --trainpref raw/train --validpref raw/val \\"):
        _TRAIN + "; torchrun on 8 GPUs; a downloaded OPUS-MT model",
    ("README.md", "python bench/gpu_data.py --multi30k work-dirs/multi30k-data   # once, where Multi30k is: fills bench/gpu-data/"):
        _GPU + " (bench/gpu.sh); its data from the whole Multi30k",
    ("docs/cli.md", "make test TORCH='torch>=2.4'        # any torch 2.4 or newer; keeps an installed CUDA build"): _NET,
    ("docs/data.md", "xf preprocess --source-lang en --target-lang de \\"): ("an 8,000-piece vocabulary needs the whole Multi30k training set "
                                                                 "under raw/ (tests/test_data.py runs xf preprocess)"),
    ("docs/data.md", "xf preprocess --pairs en-de,en-fr,de-fr \\"): _TRAIN,
    ("docs/decoding.md", "xf translate --path averaged.pt < test.en > test.hyp.de          # beam 4, alpha 0.6: the paper's"): _GPU + " (its last line)",
    ("docs/decoding.md", "from xformer_cli.settings.options import DecodingOptions"): _FRAGMENT,
    ("docs/decoding.md", "from xformer_cli.decode.pair_scoring import score_pairs, dual_conditional_cross_entropy"): _FRAGMENT,
    ("docs/export.md", "python -m venv lt && lt/bin/pip install torch==2.13.0 && lt/bin/pip install libretranslate==1.9.6"): _NET,
    ("docs/export.md", "xf train --data data --arch base --sinusoids tensor2tensor --decoder-start zero --save-dir ckpt   # Marian's conventions"): _TRAIN + "; marian-decoder, a binary xf does not install",
    ("docs/export.md", "make bergamot                    # npm install --prefix .bergamot @browsermt/bergamot-translator@0.4.9"): _NET + " (npm); " + _TRAIN,
    ("docs/gpu.md", "python bench/gpu_data.py --multi30k work-dirs/multi30k-data"):
        "the GPU benchmark's data, from the whole Multi30k the quick start downloads",
    ("docs/gpu.md", "bash bench/gpu.sh gpu-results/"): _GPU,
    ("docs/gpu.md", "XF_GPU_TARBALL=gpu-results.tgz bash bench/gpu.sh /tmp/g"): _GPU,
    ("docs/gpu.md", "bash bench/gpu.sh --dry-run [OUT_DIR]"): "a usage line ([OUT_DIR] is optional); tests/test_gpu_script.py runs the dry run",
    ("docs/huggingface.md", 'batch = tokenizer([">>fra<< A man is riding a bike."], return_tensors="pt")'): _FRAGMENT,
    ("docs/huggingface.md", 'batch = tokenizer(sentences, return_tensors="pt", padding=True)'): _FRAGMENT,
    ("docs/huggingface.md", "huggingface-cli download Helsinki-NLP/opus-mt-en-de --local-dir opus-mt-en-de"): _NET,
    ("docs/huggingface.md", "pip install 'xformer-cli[hf,ctranslate2]'"): _NET,
    ("docs/metrics.md", "python bench/formality_score.py --hyp test.hyp.de --formal-refs F.formal.annotated.de \\"):
        "a system's output and CoCoA-MT's annotated references; tests/test_formality_score.py runs the script",
    ("docs/performance.md", "python bench/precision_quality.py --out work-dirs/precision    # Multi30k EN-DE, cpu.yaml, 2,000 updates"): _TRAIN,
    ("docs/plots.md", "xf plot curves work-dirs/quickstart/checkpoints -o curves.png                 # one run"): "the quick start's and the dropout runs' checkpoints: " + _TRAIN,
    ("docs/recipes.md", "bash recipes/multi30k/multilingual.sh                 # four models of 34 minutes, one after another"): _TRAIN,
    ("docs/recipes.md", "bash recipes/formality/run.sh                                   # two trainings of 1,500 updates"): _TRAIN,
    ("docs/recipes.md", "xf translate --path work-dirs/formality/tagged/averaged.pt --formality formal < examples.en"):
        "the formality recipe's trained model: " + _TRAIN,
    ("docs/recipes.md", "bash recipes/multi30k/distill.sh en-de              # teacher: run.sh's cpu.yaml model (trained when missing)"): _TRAIN,
    ("docs/recipes.md", "bash recipes/multi30k/ship.sh en-de                                 # all steps (the teacher trained when missing)"): _TRAIN,
    ("docs/serve.md", "pip install 'xformer-cli[serve]'            # Starlette, uvicorn, prometheus_client"): _NET,
    ("docs/serve.md", "xf serve --model checkpoints/multi/avg.pt                  # every pair the checkpoint records"): _SERVER,
    ("docs/serve.md", "curl -s http://127.0.0.1:5000/translate -H 'Content-Type: application/json' \\"): _SERVER,
    ("docs/serve.md", "curl -s http://127.0.0.1:5000/translate -H 'Content-Type: application/json' \\ (2)"): _SERVER,
    ("docs/serve.md", "curl -s -X POST 'http://127.0.0.1:5000/translate?q=Two%20dogs%20play.&source=en&target=de'"): _SERVER,
    ("docs/serve.md", "xf serve --model en-de=avg.pt --model en-fr=fr.pt --glossary en-de=terms.de.tsv --glossary en-fr=terms.fr.tsv"): _SERVER,
    ("docs/serve.md", """curl -s localhost:5000/translate -H 'Content-Type: application/json' -d '{"q": "<p class=\\"x\\">A man in a <b>red</b> shirt.</p><script>let a = 1 < 2;</script>", "source": "en", "target": "de", "format": "html"}'"""): _SERVER,
    ("docs/serve.md", "curl -s http://127.0.0.1:5000/detect -d 'q=Ein Hund läuft im Park.'"): _SERVER,
    ("docs/serve.md", "curl -s http://127.0.0.1:5000/translate_file -F file=@letter.txt -F source=en -F target=de"): _SERVER,
    ("docs/serve.md", "curl -s http://127.0.0.1:5000/languages"): _SERVER,
    ("docs/serve.md", "curl -s http://127.0.0.1:5000/health"): _SERVER,
    ("docs/serve.md", "curl -s http://127.0.0.1:5000/metrics | grep -v '^#'"): _SERVER,
    ("docs/serve.md", "curl -s http://127.0.0.1:5000/frontend/settings"): _SERVER,
    ("docs/training.md", "xf train data-bin/multi30k.en-de --arch small --save-dir checkpoints/m30k \\"): _TRAIN + "; torchrun on 8 GPUs",
}


def unclassified(found) -> list:
    return [key for key in found if key not in RUN and key not in NOT_RUNNABLE]


def test_every_snippet_is_run_or_listed_with_a_reason():
    found = snippets()
    assert not RUN & NOT_RUNNABLE.keys(), "a snippet both run and listed"
    assert RUN <= found.keys(), f"RUN names snippets the manual no longer has: {sorted(RUN - found.keys())}"
    assert NOT_RUNNABLE.keys() <= found.keys(), \
        f"NOT_RUNNABLE names snippets the manual no longer has: {sorted(NOT_RUNNABLE.keys() - found.keys())}"
    assert unclassified(found) == [], "snippets neither run nor listed in NOT_RUNNABLE"
    print(f"{len(found)} snippets: {len(RUN)} run, {len(NOT_RUNNABLE)} listed as not runnable")


def test_a_new_snippet_must_be_classified(tmp_path):
    """The classification can fail: a page with a snippet of its own."""
    page = write(tmp_path / "docs" / "model.md", ["```bash", "xf translate --path new.pt", "```",
                                                     "```python", "import torch", "```"])
    assert unclassified(snippets([page], tmp_path)) == [("docs/model.md", "xf translate --path new.pt")]


def workspace(root: Path, ckpt: Path, multi30k_dir: Path) -> dict[str, str]:
    """The names the snippets use, made from the tiny model and Multi30k; the environment that runs
    this checkout's xf (and this interpreter as `python`)."""
    bin_dir = root / "bin"
    bin_dir.mkdir(parents=True)
    for name, target in (("xf", f'"{sys.executable}" -m xformer_cli'), ("python", f'"{sys.executable}"')):
        (bin_dir / name).write_text(f'#!/bin/sh\nexec {target} "$@"\n')
        (bin_dir / name).chmod(stat.S_IRWXU)
    path = os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent), os.environ["PATH"]])  # argos-translate too
    env = {**os.environ, "PATH": path, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return env


def populate(page_dir: Path, page: str, ckpt: Path, data: Path, multi30k_dir: Path, env: dict) -> dict:
    """Fill the page's directory; the environment its snippets run in."""
    page_dir.mkdir()
    models = ("a.pt", "b.pt", "c.pt") if page == "docs/training.md" else ("averaged.pt", "avg.pt", "model.pt", "a.pt", "b.pt")
    for name in models:  # copies: a snippet may write one
        shutil.copyfile(ckpt, page_dir / name)
    (page_dir / "checkpoints").symlink_to(ckpt.parent)
    english = read(multi30k_dir / "test2016.en")[:6]
    german = read(multi30k_dir / "test2016.de")[:6]
    write(page_dir / "test.en", english)
    for name in ("test.de", "test2.de", "newstest2014.de", "hyp.de", "a.de", "b.de"):
        write(page_dir / name, german)
    write(page_dir / "c.de", german[::-1])
    # data-bin: the model's data directory, as `xf shortlist data-bin` reads it; data.md names
    # data-bin/multi30k.en-de
    if page == "docs/data.md":
        (page_dir / "data-bin").mkdir()
        (page_dir / "data-bin" / "multi30k.en-de").symlink_to(data)
    else:
        (page_dir / "data-bin").symlink_to(data)
    if page == "docs/decoding.md":  # a multilingual model; a de-en model (random) over the en-de model's vocabulary
        multilingual_checkpoint(page_dir / "multi.pt", multi30k_dir)
        shutil.copyfile(ckpt, page_dir / "en-de.pt")
        spm = load_checkpoint(str(ckpt))["spm_model"]
        random_checkpoint(page_dir / "de-en.pt", spm, {"source_lang": "de", "target_lang": "en"}, vocab_size=1000)
        for split, n in (("train", 30), ("val", 40)):
            for lang in ("en", "de"):
                write(page_dir / f"{split}.{lang}", read(multi30k_dir / f"{split}.{lang}")[:n])
        shutil.copyfile(page_dir / "hyp.de", page_dir / "test.hyp.de")
    if page == "docs/huggingface.md":  # --bleu test.score.json: xf score --json's
        subprocess.run("xf score --ref test.de --hyp hyp.de --json > test.score.json", shell=True, check=True,
                       cwd=page_dir, env=env, timeout=120)
    if page == "docs/export.md":  # argostranslate's packages and settings in the page's directory, no downloads
        argos = bench_module("libretranslate_env").argos_env(page_dir / "argos-home")
        env = {**argos, **{k: env[k] for k in ("PATH", "PYTHONPATH", "OMP_NUM_THREADS")}}
    return env


@pytest.mark.slow
def test_the_runnable_snippets_run_as_written(trained_tiny, multi30k_dir, tmp_path):
    found = snippets()
    env = workspace(tmp_path, trained_tiny, multi30k_dir)
    failed, ran = [], 0
    for page in dict.fromkeys(page for page, _ in found):
        keys = [key for key in found if key[0] == page and key in RUN]
        if not keys:
            continue
        page_dir = tmp_path / page.replace("/", "_")
        page_env = populate(page_dir, page, trained_tiny, trained_tiny.parent.parent / "data", multi30k_dir, env)
        for key in keys:
            lang, text = found[key]
            command = [sys.executable, "-c", text] if lang == "python" else ["bash", "-e", "-o", "pipefail", "-c", text]
            out = subprocess.run(command, cwd=page_dir, env=page_env, capture_output=True, text=True, timeout=300)
            ran += 1
            if out.returncode != 0:
                failed.append(f"{page}: {key[1]!r} exited {out.returncode}:\n{out.stdout[-1500:]}\n{out.stderr[-2500:]}")
    print(f"{len(found)} snippets: {ran} run, {len(NOT_RUNNABLE)} listed as not runnable")
    assert ran == len(RUN)
    assert failed == [], "\n\n".join(failed)
