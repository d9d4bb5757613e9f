"""Builders the test modules share (fixtures are in conftest.py): a micro training set-up, a tiny
checkpoint and sentencepiece model, slices of Multi30k, the test data (../shared/data or a corpus
generated in its place), the search fixtures and a server process. No test module imports another:
what two share is here."""

from __future__ import annotations

import asyncio
import atexit
import functools
import http.client
import itertools
import os
import random
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import importlib.util
import io
import json
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from xformer_cli.model.checkpoint import make_checkpoint, save_checkpoint
from xformer_cli.commands.preprocess import preprocess
from xformer_cli.commands.train import train
from xformer_cli.commands.translate import translate
from xformer_cli.model.transformer import build_model
from xformer_cli.settings.options import DecodingOptions, PreprocessOptions, TrainOptions, TranslateOptions
from xformer_cli.decode.search import Hypothesis, length_penalty
from xformer_cli.text.vocab import BOS_ID, EOS_ID, PAD_ID

REPO = Path(__file__).resolve().parents[1]
MAX_POSITIONS = 128  # of tiny_checkpoint's model: so that a long line must be truncated

# A model small enough that an update takes milliseconds.
# fp32 by name: --precision auto would pick bf16 on CPUs with bf16 instructions (test_precision.py)
MICRO = dict(arch="tiny", d_model=32, d_ff=64, heads=2, encoder_layers=1, decoder_layers=1,
             max_tokens=300, warmup_updates=4, log_interval=1, device="cpu", seed=3, threads=1, precision="fp32")


def slice_multi30k(src_dir: Path, out: Path, train_lines: int, valid_lines: int) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", train_lines), ("val", valid_lines)):
        for lang in ("en", "de"):
            lines = (src_dir / f"{split}.{lang}").read_text(encoding="utf-8").splitlines()[:n]
            (out / f"{split}.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out


def make_data(raw: Path, dest: Path, vocab: int) -> Path:
    preprocess(PreprocessOptions(destdir=str(dest), trainpref=str(raw / "train"), validpref=str(raw / "val"),
                                 bpe_vocab_size=vocab, workers=1))
    return dest


def opts(data_dir, save_dir, **kw) -> TrainOptions:
    return TrainOptions(data=str(data_dir), save_dir=str(save_dir), **{**MICRO, **kw})


def records(save_dir, kind):
    lines = (Path(save_dir) / "train_log.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["type"] == kind]


def cli_args(data_dir, save_dir, **kw) -> list[str]:
    args = [str(data_dir), "--save-dir", str(save_dir)]
    for k, v in {**MICRO, **kw}.items():
        args += [f"--{k.replace('_', '-')}", str(v)]
    return args


def learn_spm(lines, vocab_size=200, symbols=()) -> bytes:
    """A sentencepiece BPE of ``lines`` with xf's special ids; ``symbols``: reserved pieces
    (control symbols: never made from text, as the target-language tags of a multilingual model)."""
    import sentencepiece as spm

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=model, vocab_size=vocab_size, model_type="bpe",
        character_coverage=1.0, pad_id=0, unk_id=1, bos_id=2, eos_id=3, minloglevel=2,
        **({"control_symbols": list(symbols)} if symbols else {}),
    )
    return model.getvalue()


def multilingual_checkpoint(path, multi30k_dir: Path, pairs=("en-de", "en-fr"), seed: int = 0, **overrides) -> str:
    """A random tiny multilingual model (as random_checkpoint) whose vocabulary, learned on 300
    Multi30k lines of each language, reserves the target tags of ``pairs``, and whose meta records
    them as xf train does (text/languages.py): for tests of choosing a target, serving, exporting."""
    from xformer_cli.text.languages import parse_pairs, tag

    parsed = parse_pairs(list(pairs))
    langs = list(dict.fromkeys(lang for pair in parsed for lang in pair))
    lines = [line for lang in langs for line in (multi30k_dir / f"train.{lang}").read_text(encoding="utf-8").splitlines()[:300]]
    spm_model = learn_spm(lines, 300, symbols=[tag(t) for t in dict.fromkeys(t for _, t in parsed)])
    torch.manual_seed(seed)
    model = build_model("tiny", **{**dict(vocab_size=300, d_model=32, d_ff=64, heads=4, max_positions=MAX_POSITIONS),
                                   **overrides})
    meta = {"epoch": 1, "num_updates": 1, "end_of_epoch": True, "source_lang": "src", "target_lang": "tgt",
            "pairs": [f"{s}-{t}" for s, t in parsed]}
    save_checkpoint(path, make_checkpoint(model, spm_model, meta=meta))
    return str(path)


def random_checkpoint(path, spm_model: bytes, meta: dict | None = None, **overrides) -> str:
    """A random tiny model (vocabulary 200, d_model 32) whose LayerNorms, biases and output bias are
    away from their initialisation (ones and zeros), so that an export has to map them right;
    ``meta``: the checkpoint's (its languages, e.g. {"source_lang": "de", "target_lang": "en"})."""
    torch.manual_seed(0)
    model = build_model("tiny", **{**dict(vocab_size=200, d_model=32, d_ff=64, heads=4, max_positions=128), **overrides})
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
        if model.output_bias is not None:
            model.output_bias.copy_(torch.randn_like(model.output_bias))
    save_checkpoint(path, make_checkpoint(model, spm_model, meta=meta) if meta else make_checkpoint(model, spm_model))
    return str(path)


def tiny_checkpoint(path, spm_model: bytes, seed: int):
    torch.manual_seed(seed)
    model = build_model("tiny", vocab_size=200, d_model=32, d_ff=64, heads=4, max_positions=MAX_POSITIONS)
    save_checkpoint(path, make_checkpoint(model, spm_model, meta={"epoch": 1, "num_updates": 1, "end_of_epoch": True}))
    return str(path)


def train_tiny(multi30k_dir: Path, tmp: Path, **model) -> Path:
    """A 2-layer model trained for 300 updates on 3,000 Multi30k pairs (a minute on one core):
    tmp/data (vocabulary 1,000) and tmp/ckpt/checkpoint_last.pt; ``model``: ModelConfig fields."""
    raw = slice_multi30k(multi30k_dir, tmp / "raw", 3000, 50)
    make_data(raw, tmp / "data", 1000)
    train(TrainOptions(data=str(tmp / "data"), save_dir=str(tmp / "ckpt"), arch="tiny", max_tokens=2000,
                       warmup_updates=50, max_update=300, device="cpu", threads=1, seed=1, dropout=0.0,
                       save_interval_minutes=0, precision="fp32",  # auto is bf16 on CPUs with bf16: one model on every CPU
                       lr_scheduler="inverse_sqrt", lr=3e-3, **model))  # noam's peak (0.018 at d_model 64) stalls it in a target LM
    return tmp / "ckpt" / "checkpoint_last.pt"


def bench_module(name: str):
    """bench/NAME.py as a module (bench/ on sys.path: the benchmarks import each other)."""
    bench = Path(__file__).resolve().parents[1] / "bench"
    sys.path.insert(0, str(bench))
    spec = importlib.util.spec_from_file_location(name, bench / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before it runs: its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


# -- searches over tiny random models ---------------------------------------------------------------
D = DecodingOptions


def tiny(vocab_size=40, seed=0, **overrides):
    torch.manual_seed(seed)
    shape = dict(d_model=32, d_ff=64, heads=4, encoder_layers=2, decoder_layers=2)
    return build_model("tiny", vocab_size=vocab_size, **{**shape, **overrides}).eval()


def batch(*sentences):
    """Right-padded source batch of ids + [eos]."""
    src = torch.full((len(sentences), max(map(len, sentences)) + 1), PAD_ID)
    for i, s in enumerate(sentences):
        src[i, : len(s)] = torch.tensor(s)
        src[i, len(s)] = EOS_ID
    return src


SOURCES = ([5, 6, 7, 8, 9, 10], [11, 12], [13, 14, 15, 16], [17])


def assert_same(a, b, atol=1e-4):
    assert len(a) == len(b)
    for hyps_a, hyps_b in zip(a, b):
        assert [h.tokens for h in hyps_a] == [h.tokens for h in hyps_b]
        for ha, hb in zip(hyps_a, hyps_b):
            assert ha.score == pytest.approx(hb.score, abs=atol)
            assert ha.positional_scores == pytest.approx(hb.positional_scores, abs=atol)


# -- beam search against exhaustive search ---------------------------------------------------------
def exhaustive(model, src_row, max_len, alpha, style, nbest):
    """Score every output of at most max_len tokens (+ eos) by full teacher-forced decoding."""
    vocab = model.cfg.vocab_size
    allowed = [t for t in range(vocab) if t not in (PAD_ID, BOS_ID, EOS_ID)]
    results = []
    with torch.no_grad():
        for n in range(max_len + 1):
            for body in itertools.product(allowed, repeat=n):
                out = list(body) + [EOS_ID]
                prev = torch.tensor([[BOS_ID] + out[:-1]])
                lprobs = F.log_softmax(model(src_row[None], prev).float(), dim=-1)[0]
                logp = lprobs.gather(1, torch.tensor(out)[:, None]).sum().item()
                results.append((logp / length_penalty(len(out), alpha, style), out))
    results.sort(key=lambda r: -r[0])
    return results[:nbest]


# -- compiled searches against eager ----------------------------------------------------------------
def random_batch(generator, sentences: int, longest: int) -> torch.Tensor:
    """sentences (B, longest + 1) of random ids + eos, right-padded, of random lengths 1..longest."""
    lengths = torch.randint(1, longest + 1, (sentences,), generator=generator)
    lengths[0] = longest
    src = torch.full((sentences, longest + 1), PAD_ID)
    for i, n in enumerate(lengths.tolist()):
        src[i, :n] = torch.randint(4, 40, (n,), generator=generator)
        src[i, n] = EOS_ID
    return src


def assert_same_search(a, b):
    for hyps_a, hyps_b in zip(a, b, strict=True):
        assert [h.tokens for h in hyps_a] == [h.tokens for h in hyps_b]
        for x, y in zip(hyps_a, hyps_b):
            assert x.score == pytest.approx(y.score, abs=1e-4)
            assert x.positional_scores == pytest.approx(y.positional_scores, abs=1e-4)


# -- the recipes, run on slices ---------------------------------------------------------------------
RECIPES = REPO / "recipes"


TINY = """\
# a model that trains in seconds: tests only
preprocess:
  bpe_vocab_size: 300
  workers: 1
train:
  arch: tiny
  max_update: 6
  max_tokens: 600
  save_interval_updates: 2
  keep_last_checkpoints: 3
  warmup_updates: 2
  log_interval: 1
  device: cpu
  precision: fp32
average_checkpoints:
  num_update_checkpoints: 2
translate:
  beam: 2
  max_len_a: 0
  max_len_b: 6
  batch_size: 256
  device: cpu
"""


def read(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def write(path: Path, lines) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def run_recipe(script: str, env: dict, *args, check=True, timeout=600) -> subprocess.CompletedProcess:
    """Run a recipe script with xf from this interpreter's environment first on PATH."""
    full_env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", "NGPU": "0"}
    full_env.update({k: str(v) for k, v in env.items()})
    out = subprocess.run(
        ["bash", str(RECIPES / script), *args], env=full_env, capture_output=True, text=True, timeout=timeout
    )
    if check and out.returncode != 0:
        raise AssertionError(f"{script} failed ({out.returncode}):\n{out.stdout[-3000:]}\n{out.stderr[-5000:]}")
    return out


def shared(*parts) -> Path:
    """A file of ../shared/data, or of the corpus generated in its place (tests/testdata.py)."""
    return data_root()[0].joinpath(*parts)


def multi30k_slice(root: Path) -> Path:
    """The first lines of Multi30k: 400 train, 40 val, 30 test2016 pairs, all three languages."""
    src = shared("multi30k")
    for split, n in (("train", 400), ("val", 40), ("test2016", 30)):
        for lang in ("en", "de", "fr"):
            write(root / f"{split}.{lang}", read(src / f"{split}.{lang}")[:n])
    return root


# -- int8 against fp32 ------------------------------------------------------------------------------
# How far an int8 engine's log-probabilities may be from the fp32 model's, in nats, at any position
# and vocabulary entry. The bound is against fp32 on the same machine, never one int8 library
# against another: the int8 kernels of every x86 kind accumulate the int8 products exactly in
# int32 (VNNI and AMX natively; AVX2 through 16-bit pair sums that 7-bit activations, torch's
# reduce_range on x86, keep from saturating), so what separates an engine from fp32 is the
# quantization itself (half a step of 1/127 of each activation's range, of 1/255 of each weight
# tensor's), the same on every CPU. Measured on this tiny model: 0.099 nats at most on Multi30k,
# 0.103 on the generated corpus, fbgemm and oneDNN alike, with AVX-512 VNNI and capped at AVX2
# (tests/test_cpu_kinds.py); 0.25 leaves 2.5x that. Decoded tokens are not compared: the random
# model's near-ties turn any error into other tokens, on one CPU kind and not another (fbgemm
# and oneDNN outputs agreed on 6 of 7 sentences on one CPU, their scores 0.02 apart on another).
INT8_LOG_PROB_BOUND = 0.25


def teacher_forced_log_probs(model, sp, sources: list[str], targets: list[str]) -> torch.Tensor:
    """log p of every vocabulary entry at every target position (the targets' subwords and eos),
    (N, V) in float32, the targets fed to the decoder."""
    import numpy as np

    from xformer_cli.data.batching import collate
    from xformer_cli.text.vocab import PAD_ID

    batch = collate([(np.array(sp.encode(a)), np.array(sp.encode(b))) for a, b in zip(sources, targets)])
    with torch.no_grad():
        log_probs = model(batch["src"], batch["prev_output"]).float().log_softmax(-1)
    return log_probs[batch["target"] != PAD_ID]


# -- xf import huggingface: a good MarianMT config.json, whose fields the tests change ----------------
MARIAN_CONFIG = dict(model_type="marian", vocab_size=200, decoder_vocab_size=200, d_model=32, encoder_layers=2,
                     decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                     decoder_ffn_dim=64, max_position_embeddings=128, activation_function="swish", dropout=0.1,
                     scale_embedding=False, share_encoder_decoder_embeddings=True, tie_word_embeddings=True)


# -- xf serve --------------------------------------------------------------------------------------
DECODING = ["--nbest", "2", "--max-len-a", "0.5", "--max-len-b", "3", "--threads", "1"]


# -- a server process ----------------------------------------------------------------------------
class Served:
    """``xf serve ARGS --port 0`` as a process; its port from the start line, its stderr kept."""

    def __init__(self, *args: str, env=None):
        self.proc = subprocess.Popen([sys.executable, "-m", "xformer_cli", "serve", "--port", "0", *args],
                                     stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, cwd=REPO,
                                     env={**os.environ, **(env or {})})
        self.lines: list[str] = []
        deadline = time.time() + 120
        while time.time() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                raise AssertionError(f"xf serve exited {self.proc.wait()}: {''.join(self.lines)}")
            self.lines.append(line)
            if "listening on http://127.0.0.1:" in line:
                self.port = int(line.split("127.0.0.1:")[1].split()[0])
                break
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stderr:
            self.lines.append(line)

    def request(self, method: str, path: str, body=None, headers=None, raw: bytes | None = None):
        """(status, headers, parsed JSON or text) of one request on a fresh connection."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        conn.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
        response = conn.getresponse()
        payload = response.read().decode("utf-8")
        conn.close()
        kind = response.getheader("Content-Type", "")
        return response.status, dict(response.getheaders()), json.loads(payload) if "json" in kind else payload

    def translate(self, q, **fields):
        return self.request("POST", "/translate", {"q": q, "source": "en", "target": "de", **fields})

    def stop(self, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout)
        self.reader.join(5)
        return code

    @property
    def log(self) -> str:
        return "".join(self.lines)


def xf_translate(ckpt_path, lines: list[str], tmp_path, **overrides) -> list[list[str]]:
    """xf translate's hypotheses (texts, best first) for each line, with the servers' options."""
    (tmp_path / "ref.in").write_text("\n".join(lines) + "\n", encoding="utf-8")
    options = dict(path=(ckpt_path,), input=str(tmp_path / "ref.in"), output=str(tmp_path / "ref.jsonl"), nbest=2,
                   max_len_a=0.5, max_len_b=3, output_format="jsonl", quiet=True, **overrides)
    translate(TranslateOptions(**options))
    records = [json.loads(line) for line in (tmp_path / "ref.jsonl").read_text(encoding="utf-8").splitlines()]
    return [[h["text"] for h in r["hypotheses"]] for r in records]


def until(condition, seconds: float) -> bool:
    """Polls condition every 20 ms for at most ``seconds``; whether it came true."""
    deadline = time.time() + seconds
    while not condition():
        if time.time() > deadline:
            return False
        time.sleep(0.02)
    return True


# -- fakes of an engine and a sentencepiece model, for the queue without a server --------------
class FakeEngine:
    """Translates a sentence to itself reversed; records the sentences of each search."""

    max_source = 100

    def __init__(self):
        self.batches: list[list[list[int]]] = []

    def search(self, sentences, options, generator=None):
        self.batches.append([list(s) for s in sentences])
        return [[Hypothesis(list(reversed(s)) + [3], 0.0, [])] for s in sentences]


class FakeSp:
    def decode(self, ids):
        return " ".join(map(str, ids))

    def encode(self, lines, out_type=int):  # "5 6 7" -> [5, 6, 7]
        return [[int(word) for word in line.split()] for line in lines]

    def id_to_piece(self, i):  # every number a word of its own
        return f"\u2581{i}"


async def call(app, path: str, body: bytes = b"", method: str = "POST", leave: asyncio.Event | None = None,
               content_type: str = "application/json", headers: list[tuple[bytes, bytes]] | None = None,
               query: bytes = b""):
    """(status, JSON answer) of one request to the ASGI app; the client disconnects once ``leave`` is set.
    ``headers``: the request's (default: ``content_type``'s); ``query``: its query string."""
    messages, sent = [{"type": "http.request", "body": body, "more_body": False}], []

    async def receive():
        if messages:
            return messages.pop(0)
        await (leave or asyncio.Event()).wait()
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    headers = [(b"content-type", content_type.encode())] if headers is None else headers
    scope = {"type": "http", "method": method, "path": path, "headers": headers,
             "query_string": query, "http_version": "1.1", "scheme": "http", "root_path": "",
             "server": ("127.0.0.1", 5000), "client": ("127.0.0.1", 40000)}
    await asyncio.wait_for(app(scope, receive, send), 10)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    return status, json.loads(b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body"))


# -- the test data: ../shared/data, or a corpus generated in its place -------------------------------
# The tests' data: ../shared/data when it is there, else a corpus generated here, never a skip.
# 
# ``data_root()`` is a directory laid out like ../shared/data (``multi30k/``, ``wmt14/``,
# ``wmt_sample/``) with the same file names and line counts. Set ``XF_TEST_DATA`` to use another
# such directory, and ``MULTI30K_DIR`` for Multi30k alone. Where a file is missing, the whole tree
# is generated (about a second): Multi30k-like image captions in English, German and French, made
# from a small bilingual lexicon and a caption grammar, plus made-up place names so that a 2,000
# piece BPE has enough to learn. The sentences are word-for-word rather than grammatical German or
# French, but aligned, learnable and seeded: the same on every run. ``pytest``'s header says which
# data the run used.
SHARED = (Path(__file__).resolve().parents[1] / ".." / "shared" / "data").resolve()
LANGS = ("en", "de", "fr")
# file -> line count, as in ../shared/data
LAYOUT = {
    **{f"multi30k/{split}.{lang}": n for split, n in (("train", 29000), ("val", 1014), ("test2016", 1000))
       for lang in LANGS},
    **{f"wmt14/newstest2013.en-{tgt}.{lang}": 3000 for tgt in ("de", "fr") for lang in ("en", tgt)},
    **{f"wmt_sample/news-commentary.en-fr.{lang}": 5000 for lang in ("en", "fr")},
}

# (en, de, fr)
PEOPLE = [
    ("man", "Mann", "homme"), ("woman", "Frau", "femme"), ("boy", "Junge", "garçon"),
    ("girl", "Mädchen", "fille"), ("child", "Kind", "enfant"), ("worker", "Arbeiter", "ouvrier"),
    ("musician", "Musiker", "musicien"), ("cyclist", "Radfahrer", "cycliste"), ("player", "Spieler", "joueur"),
    ("tourist", "Tourist", "touriste"), ("police officer", "Polizist", "policier"), ("chef", "Koch", "cuisinier"),
    ("farmer", "Bauer", "fermier"), ("student", "Student", "étudiant"), ("teacher", "Lehrer", "professeur"),
    ("doctor", "Arzt", "médecin"), ("dancer", "Tänzer", "danseur"), ("singer", "Sänger", "chanteur"),
    ("climber", "Kletterer", "grimpeur"), ("skier", "Skifahrer", "skieur"), ("surfer", "Surfer", "surfeur"),
    ("fisherman", "Fischer", "pêcheur"), ("baby", "Baby", "bébé"), ("dog", "Hund", "chien"),
    ("cat", "Katze", "chat"), ("horse", "Pferd", "cheval"), ("soldier", "Soldat", "soldat"),
    ("painter", "Maler", "peintre"), ("runner", "Läufer", "coureur"), ("vendor", "Verkäufer", "vendeur"),
    ("swimmer", "Schwimmer", "nageur"), ("guitarist", "Gitarrist", "guitariste"), ("photographer", "Fotograf", "photographe"),
]
ADJECTIVES = [
    ("young", "junger", "jeune"), ("old", "alter", "vieux"), ("tall", "großer", "grand"),
    ("small", "kleiner", "petit"), ("happy", "fröhlicher", "heureux"), ("tired", "müder", "fatigué"),
    ("smiling", "lächelnder", "souriant"), ("blond", "blonder", "blond"), ("bearded", "bärtiger", "barbu"),
    ("elderly", "älterer", "âgé"), ("busy", "beschäftigter", "occupé"), ("curious", "neugieriger", "curieux"),
]
COLORS = [
    ("red", "roten", "rouge"), ("blue", "blauen", "bleu"), ("green", "grünen", "vert"),
    ("black", "schwarzen", "noir"), ("white", "weißen", "blanc"), ("yellow", "gelben", "jaune"),
    ("orange", "orangen", "orange"), ("pink", "rosa", "rose"), ("gray", "grauen", "gris"),
    ("brown", "braunen", "marron"), ("purple", "lila", "violet"), ("striped", "gestreiften", "rayé"),
]
CLOTHES = [
    ("shirt", "Hemd", "chemise"), ("jacket", "Jacke", "veste"), ("hat", "Hut", "chapeau"),
    ("dress", "Kleid", "robe"), ("helmet", "Helm", "casque"), ("sweater", "Pullover", "pull"),
    ("coat", "Mantel", "manteau"), ("uniform", "Uniform", "uniforme"), ("scarf", "Schal", "écharpe"),
    ("apron", "Schürze", "tablier"), ("costume", "Kostüm", "costume"), ("t-shirt", "T-Shirt", "tee-shirt"),
]
ACTIONS = [
    ("is riding a bike", "fährt Fahrrad", "fait du vélo"), ("is playing the guitar", "spielt Gitarre", "joue de la guitare"),
    ("is reading a newspaper", "liest eine Zeitung", "lit un journal"), ("is eating an apple", "isst einen Apfel", "mange une pomme"),
    ("is jumping into the water", "springt ins Wasser", "saute dans l'eau"), ("is climbing a rock", "klettert auf einen Felsen", "escalade un rocher"),
    ("is selling vegetables", "verkauft Gemüse", "vend des légumes"), ("is cooking dinner", "kocht das Abendessen", "prépare le dîner"),
    ("is throwing a ball", "wirft einen Ball", "lance un ballon"), ("is walking a dog", "führt einen Hund aus", "promène un chien"),
    ("is painting a wall", "streicht eine Wand", "peint un mur"), ("is carrying a box", "trägt eine Kiste", "porte une boîte"),
    ("is talking on the phone", "telefoniert", "parle au téléphone"), ("is taking a picture", "macht ein Foto", "prend une photo"),
    ("is sitting on a bench", "sitzt auf einer Bank", "est assis sur un banc"), ("is waiting for the bus", "wartet auf den Bus", "attend le bus"),
    ("is running down the street", "läuft die Straße entlang", "court dans la rue"), ("is drinking coffee", "trinkt Kaffee", "boit du café"),
    ("is fixing a car", "repariert ein Auto", "répare une voiture"), ("is dancing with friends", "tanzt mit Freunden", "danse avec des amis"),
    ("is sleeping", "schläft", "dort"), ("is laughing", "lacht", "rit"), ("is singing a song", "singt ein Lied", "chante une chanson"),
    ("is kicking a soccer ball", "schießt einen Fußball", "frappe un ballon de football"),
    ("is pushing a stroller", "schiebt einen Kinderwagen", "pousse une poussette"),
    ("is holding an umbrella", "hält einen Regenschirm", "tient un parapluie"),
]
PLACES = [
    ("in the park", "im Park", "dans le parc"), ("on the beach", "am Strand", "sur la plage"),
    ("in the snow", "im Schnee", "dans la neige"), ("on a busy street", "auf einer belebten Straße", "dans une rue animée"),
    ("in front of a building", "vor einem Gebäude", "devant un bâtiment"), ("near the river", "in der Nähe des Flusses", "près de la rivière"),
    ("at the market", "auf dem Markt", "au marché"), ("in a kitchen", "in einer Küche", "dans une cuisine"),
    ("on a stage", "auf einer Bühne", "sur une scène"), ("in the forest", "im Wald", "dans la forêt"),
    ("on a bridge", "auf einer Brücke", "sur un pont"), ("at the train station", "am Bahnhof", "à la gare"),
    ("in a field", "auf einem Feld", "dans un champ"), ("on the mountain", "auf dem Berg", "sur la montagne"),
    ("in the rain", "im Regen", "sous la pluie"), ("outside a cafe", "vor einem Café", "devant un café"),
]
EXTRA = ("und im Hintergrund stehen viele große alte Gebäude mit hellen Fenstern und Balkonen",
         "et à l'arrière-plan se trouvent de nombreux grands bâtiments anciens avec des fenêtres claires")
SYLLABLES = ["ka", "lo", "mer", "vin", "ta", "ros", "bel", "dun", "sa", "ri", "hol", "gen", "por", "tiv", "anz",
             "el", "mo", "ruk", "sel", "bra", "nov", "ost", "qui", "zel", "fa", "dor", "lu", "wes", "kri", "pan"]


def place_name(rng: random.Random) -> str:
    return "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 4))).capitalize()


def caption(rng: random.Random, towns: list[str]) -> tuple[str, str, str]:
    """One aligned (en, de, fr) caption."""
    who, adj, color, cloth = rng.choice(PEOPLE), rng.choice(ADJECTIVES), rng.choice(COLORS), rng.choice(CLOTHES)
    act, place = rng.choice(ACTIONS), rng.choice(PLACES)
    en = ["An" if adj[0][0] in "aeiou" else "A", adj[0], who[0]]
    de = ["Ein", adj[1], who[1]]
    fr = ["Un", who[2], adj[2]]
    if rng.random() < 0.5:
        en += ["in a", color[0], cloth[0]]
        de += ["in einem", color[1], cloth[1]]
        fr += ["en", cloth[2], color[2]]
    en += [act[0], place[0]]
    de += [act[1], place[1]]
    fr += [act[2], place[2]]
    if rng.random() < 0.4:
        town = rng.choice(towns)
        en += ["in", town]
        de += ["in", town]
        fr += ["à", town]
    return " ".join(en) + " .", " ".join(de) + " .", " ".join(fr) + " ."


def write_corpus(root: Path, seed: int = 1) -> None:
    """The layout of LAYOUT, generated: each file pair (triple) aligned line by line."""
    rng = random.Random(seed)
    towns = sorted({place_name(rng) for _ in range(6000)})
    groups: dict[str, dict[str, int]] = {}
    for name, count in LAYOUT.items():
        stem, lang = name.rsplit(".", 1)
        groups.setdefault(stem, {})[lang] = count
    for stem, langs in sorted(groups.items()):
        count = next(iter(langs.values()))
        lines = {lang: [] for lang in LANGS}
        for _ in range(count):
            en, de, fr = caption(rng, towns)
            if stem.endswith("train") and rng.random() < 0.02:  # loose translations: cleaning drops some
                de, fr = f"{de[:-2]} {EXTRA[0]} .", f"{fr[:-2]} {EXTRA[1]} ."
            for lang, text in zip(LANGS, (en, de, fr)):
                lines[lang].append(text)
        for lang in langs:
            path = root / f"{stem}.{lang}"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("\n".join(lines[lang]) + "\n", encoding="utf-8")


def _complete(root: Path, prefix: str = "") -> bool:
    return all((root / name[len(prefix):]).is_file() for name in LAYOUT if name.startswith(prefix))


@functools.lru_cache(maxsize=None)
def generated() -> Path:
    root = Path(tempfile.mkdtemp(prefix="xf-test-data-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    write_corpus(root)
    return root


def data_root() -> tuple[Path, str]:
    """The data directory (XF_TEST_DATA, else ../shared/data, else generated) and a line saying
    which it is."""
    root = Path(os.environ.get("XF_TEST_DATA", SHARED))
    if _complete(root):
        return root, f"{root} (Multi30k and WMT14 samples)"
    return generated(), f"a corpus generated in {generated()} ({root} is missing or incomplete)"


def multi30k() -> tuple[Path, str]:
    """The Multi30k directory (MULTI30K_DIR, else data_root()'s) and a line saying which it is."""
    if "MULTI30K_DIR" not in os.environ:
        root, line = data_root()
        return root / "multi30k", line
    path = Path(os.environ["MULTI30K_DIR"])
    if _complete(path, "multi30k/"):
        return path, f"Multi30k from MULTI30K_DIR={path}"
    return generated() / "multi30k", f"a Multi30k-like corpus generated in {generated()} (MULTI30K_DIR={path} is missing or incomplete)"


def cli_fails(args, message: str) -> str:
    """``xf ARGS`` in-process exits non-zero with one error line holding ``message``; returns it."""
    from typer.testing import CliRunner

    from xformer_cli.cli import app

    result = CliRunner().invoke(app, [str(a) for a in args])
    assert result.exit_code != 0
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("xf: error:") and message in lines[0], result.output
    return lines[0]
