"""The runtimes of recipes/multi30k/ship.sh: each translates the test set with an export of the
student (Hugging Face: of the model whose sinusoids MarianMT takes), timed, and the table of them.

    python ship_runtimes.py hf-model STUDENT TEACHER...       the model for MarianMT, and why (tab-separated)
    python ship_runtimes.py run ROW --work DIR --source FILE  one row: DIR/ship/runs/ROW.{txt,json}
    python ship_runtimes.py table --work DIR --ref FILE ROW...  DIR/ship.md and DIR/ship.json
    python ship_runtimes.py training-time LOG...               the trainings' time (train_log.jsonl)
    python ship_runtimes.py reference ROW                      the xf run (REFERENCES) ROW is compared with
    python ship_runtimes.py screenshot PAGE OUT.png TEXT       the page translating TEXT, as a picture

Every row searches alike: beam BEAM, score / |Y|^LENPEN (the length penalty of CTranslate2,
transformers, Marian and Bergamot; xf's --lenpen-style length), at most MAX_LEN subwords, BATCH
lines a batch, THREADS threads; argostranslate fixes its own (beam 4, |Y|^0.2, 256 subwords, its
batch), Marian and the page bound an output at twice its source, and their xf references take
those. A row's "same" column counts the lines equal to one xf translate run with that row's
search and weights (REFERENCE below); a row that cannot run writes why ("not run: ..."), never
nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import http.server
import importlib.util
import json
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ARGOS_SEARCH = dict(beam=4, lenpen=0.2, max_len=256)  # argostranslate 1.11's translate_batch, fixed
# Marian bounds an output by a factor of its source's length, not by a count; the page's worker
# fixes that factor at 2 (translator-worker.js), and pymarian is given the same
MARIAN_SEARCH = dict(length_factor=2.0)


@dataclass(frozen=True)
class Search:
    """The search every row runs (ship.sh's BEAM, LENPEN, MAX_LEN, BATCH, THREADS)."""
    beam: int
    lenpen: float
    max_len: int
    batch: int
    threads: int
    length_factor: float = 0.0  # else at most this many times (the source's subwords + eos), not max_len

    @property
    def marian_b(self) -> int:
        """xf's --max-len-b for Marian's bound, f x (|X| + eos) = f|X| + f tokens (a whole f: Marian's
        ceiling and xf's floor meet), at which --beam-rule marian ends a line as it is."""
        return int(self.length_factor)

    def describe(self) -> str:
        cap = (f"<= {self.length_factor:g} x (source subwords + eos)" if self.length_factor
               else f"<= {self.max_len} subwords")
        return f"beam {self.beam}, score/length^{self.lenpen:g}, {cap}, batch {self.batch}, {self.threads} thread(s)"


class NotRun(Exception):
    """A runtime that cannot run here; its message is the row's reason."""


# -- one function per runtime: (the lines translated, seconds of translation alone) ----------------
def xf_translate(model: Path, lines_file: Path, s: Search, *extra: str) -> tuple[list[str], float]:
    """xf translate as a user runs it; its own sentences/s (decoding, model loading apart)."""
    out = lines_file.with_suffix(".xf.tmp")
    cmd = ["xf", "translate", "--path", str(model), "--input", str(lines_file), "--output", str(out),
           "--beam-size", str(s.beam), "--lenpen", str(s.lenpen), "--lenpen-style", "length",
           "--max-len-a", str(s.length_factor), "--max-len-b", str(s.marian_b) if s.length_factor else str(s.max_len),
           "--batch-size", str(s.batch), "--threads", str(s.threads), "--device", "cpu", *extra]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"xf translate: {(done.stderr.strip().splitlines() or ['no message'])[-1]}")
    speed = re.findall(r"sentences/s\s+([0-9.,]+)", done.stderr)
    hyps = out.read_text(encoding="utf-8").splitlines()
    out.unlink()
    return hyps, len(hyps) / float(speed[-1].replace(",", "")) if speed else float("nan")


def ctranslate2_translate(model_dir: Path, lines: list[str], s: Search) -> tuple[list[str], float]:
    import ctranslate2
    import sentencepiece

    sp = sentencepiece.SentencePieceProcessor(model_file=str(model_dir / "spm.model"))
    translator = ctranslate2.Translator(str(model_dir), device="cpu", compute_type="int8", intra_threads=s.threads)
    start = time.perf_counter()
    results = translator.translate_batch([sp.encode(line, out_type=str) for line in lines], max_batch_size=s.batch,
                                         beam_size=s.beam, length_penalty=s.lenpen, max_decoding_length=s.max_len,
                                         replace_unknowns=True)
    hyps = [sp.decode(r.hypotheses[0]) for r in results]
    return hyps, time.perf_counter() - start


def huggingface_translate(model_dir: Path, lines: list[str], s: Search) -> tuple[list[str], float]:
    import torch
    import transformers

    torch.set_num_threads(s.threads)
    tokenizer = transformers.MarianTokenizer.from_pretrained(str(model_dir))
    model = transformers.MarianMTModel.from_pretrained(str(model_dir)).eval()
    hyps, start = [], time.perf_counter()
    with torch.inference_mode():
        for i in range(0, len(lines), s.batch):
            batch = tokenizer(lines[i:i + s.batch], return_tensors="pt", padding=True)
            # xf's bound counts the subwords before eos, transformers' max_length the decoder start and the
            # eos too (the export forces it last); max_length, not max_new_tokens, which the export's
            # generation_config.json (its max_length) would contradict in a warning every batch
            out = model.generate(**batch, num_beams=s.beam, length_penalty=s.lenpen, max_length=s.max_len + 2)
            hyps += tokenizer.batch_decode(out, skip_special_tokens=True)
    return hyps, time.perf_counter() - start


ARGOS = """
import json, sys, time
from argostranslate import package, translate
package.install_from_path(sys.argv[1])
lines = json.load(sys.stdin)
model = translate.get_translation_from_codes(sys.argv[2], sys.argv[3])
start = time.perf_counter()
hyps = [model.translate(line) for line in lines]
print(json.dumps({"hyps": hyps, "seconds": time.perf_counter() - start}))
"""


def argos_env(home: Path) -> dict:
    """argostranslate's environment, every file of it under ``home`` (bench/libretranslate_env.py)."""
    sys.path.insert(0, str(REPO / "bench"))
    from libretranslate_env import argos_env as env

    return env(home)


def argos_translate(package: Path, lines: list[str], s: Search, home: Path, pair: tuple[str, str]):
    """argostranslate on the installed package, in int8 (the package's weights), in a private home."""
    if importlib.util.find_spec("argostranslate") is None:
        raise NotRun("argostranslate is not installed (pip install 'xformer-cli[argos]')")
    env = {**argos_env(home), "ARGOS_COMPUTE_TYPE": "int8", "ARGOS_INTRA_THREADS": str(s.threads)}
    done = subprocess.run([sys.executable, "-c", ARGOS, str(package), *pair], input=json.dumps(lines), env=env,
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"argostranslate: {(done.stderr.strip().splitlines() or ['no message'])[-1]}")
    out = json.loads(done.stdout.strip().splitlines()[-1])
    return out["hyps"], out["seconds"]


def libretranslate_translate(package: Path, lines: list[str], s: Search, home: Path, pair: tuple[str, str]):
    """One request of all the lines to a LibreTranslate server that serves the package."""
    sys.path.insert(0, str(REPO / "bench"))
    import libretranslate_env

    python = libretranslate_env.venv_dir() / "bin" / "python"
    if not (libretranslate_env.venv_dir() / "complete").exists():
        raise NotRun(f"LibreTranslate's venv {libretranslate_env.venv_dir()} is not built "
                     "(python bench/libretranslate_env.py builds it)")
    libretranslate_env.install_package(python, package, home)
    server = libretranslate_env.LibreTranslate(python, home, pair, threads=s.threads)
    try:
        start = time.perf_counter()
        hyps = server.translate(lines, *pair)
        return hyps, time.perf_counter() - start
    finally:
        server.close()


def marian_translate(model_dir: Path, lines: list[str], s: Search) -> tuple[list[str], float]:
    """pymarian (Marian's CPU build) over decoder.yml, as marian-decoder -c decoder.yml runs."""
    try:
        import pymarian
    except ImportError:
        raise NotRun("pymarian is not installed (pip install 'xformer-cli[marian]')") from None
    flags = ["-c", model_dir / "decoder.yml", "--beam-size", s.beam, "--normalize", s.lenpen,
             "--max-length-factor", s.length_factor,
             "--mini-batch", s.batch, "--maxi-batch", 1, "--cpu-threads", s.threads, "--quiet"]
    translator = pymarian.Translator(" ".join(map(str, flags)))
    start = time.perf_counter()
    hyps = translator.translate(lines)
    return hyps, time.perf_counter() - start


class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@contextlib.contextmanager
def page_in_chromium(page_dir: Path, home: Path, size: tuple[int, int] | None = None):
    """The page xf export bergamot wrote, served by a static file server, open in headless
    Chromium (its profile under ``home``) once its model has loaded: the selenium driver."""
    chromium, chromedriver = shutil.which("chromium"), shutil.which("chromedriver")
    if not (chromium and chromedriver):
        raise NotRun("no headless browser: apt-get install chromium chromium-driver")
    try:
        from selenium import webdriver
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support.ui import WebDriverWait
    except ImportError:
        raise NotRun("selenium is not installed (the test extra)") from None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(page_dir)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
                 f"--user-data-dir={home / 'chromium-profile'}"):
        options.add_argument(flag)
    if size:
        options.add_argument(f"--window-size={size[0]},{size[1]}")
    driver = webdriver.Chrome(service=webdriver.ChromeService(executable_path=chromedriver), options=options)
    try:
        driver.set_script_timeout(3600)
        driver.get(f"http://127.0.0.1:{server.server_address[1]}/index.html")
        status = driver.find_element(By.ID, "status")
        WebDriverWait(driver, 300).until(lambda _: status.get_attribute("data-state") in ("ready", "error"))
        if status.get_attribute("data-state") != "ready":
            raise RuntimeError(f"the page: {status.text}")
        yield driver
    finally:
        driver.quit()
        server.shutdown()
        server.server_close()


def bergamot_translate(page_dir: Path, lines: list[str], s: Search, home: Path) -> tuple[list[str], float]:
    """The page in headless Chromium (page_in_chromium): its own search (registry.json: beam,
    normalize; the worker's length factor 2; its WebAssembly engine single-threaded); seconds from
    the loaded page's first line to its last."""
    with page_in_chromium(page_dir, home) as driver:
        start = time.perf_counter()
        hyps = driver.execute_async_script("xfTranslate(arguments[0]).then(arguments[1], e => arguments[1]("
                                           "'error: ' + e.message))", lines)
        seconds = time.perf_counter() - start
    if not isinstance(hyps, list):
        raise RuntimeError(f"the page: {hyps}")
    return hyps, seconds


def screenshot(page_dir: Path, text: str, out: Path, home: Path) -> None:
    """A picture of the page translating ``text`` as a user does: typed into its box, the button
    pressed, the translation shown; ``out``, a PNG."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    with page_in_chromium(page_dir, home, size=(1000, 820)) as driver:
        driver.find_element(By.ID, "source").send_keys(text)
        driver.find_element(By.ID, "translate").click()
        target = driver.find_element(By.ID, "target")
        WebDriverWait(driver, 300).until(lambda _: driver.find_element(By.ID, "speed").text)
        if not target.get_attribute("value").strip():
            raise RuntimeError("the page showed no translation")
        tmp = out.with_name(out.stem + ".tmp.png")
        driver.save_screenshot(str(tmp))
        tmp.replace(out)


# -- the rows ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Row:
    runtime: str      # as the table names it
    model: str        # student, or hf (the model hf-model chose)
    files: str        # what it runs, under WORK_DIR
    reference: str    # the xf translate run (REFERENCES) whose lines it is compared with
    settings: str     # beyond the common search


# The xf runs the rows are compared with: (model, xf translate flags, search)
REFERENCES = {
    "xf": ("student", [], "common"),
    "xf-int8": ("student", ["--quantize", "int8"], "common"),
    "xf-int8-shortlist": ("student", ["--quantize", "int8", "--shortlist", "{shortlist}"], "common"),
    "xf-hf": ("hf", [], "common"),
    "xf-int8-argos": ("student", ["--quantize", "int8"], "argos"),
    "xf-marian": ("student", ["--beam-rule", "marian"], "marian"),
    "xf-int8-shortlist-marian": ("student", ["--beam-rule", "marian", "--quantize", "int8", "--shortlist", "{shortlist}"],
                                 "marian"),
}
ROWS = {
    "xf": Row("xf translate", "student", "averaged.pt", "xf", "float32"),
    "xf-int8-shortlist": Row("xf translate", "student", "averaged.pt", "xf",
                             "--quantize int8 --shortlist (shortlist.npz)"),
    "ctranslate2": Row("CTranslate2 (ctranslate2.Translator)", "student", "student-ct2-int8", "xf-int8",
                       "int8 (xf export ctranslate2 --quantization int8)"),
    "huggingface": Row("Hugging Face transformers generate", "hf", "ship/hf", "xf-hf",
                       "float32 MarianMT (xf export huggingface)"),
    "argos": Row("argostranslate", "student", "ship/student.argosmodel", "xf-int8-argos",
                 "int8 package (xf export argos), argostranslate's own search"),
    "libretranslate": Row("LibreTranslate server", "student", "ship/student.argosmodel", "xf-int8-argos",
                          "the argos package, one request of every line"),
    "marian": Row("Marian (pymarian)", "student", "ship/marian", "xf-marian", "float32 (xf export marian)"),
    "bergamot": Row("Bergamot page, headless Chromium", "student", "ship/bergamot", "xf-int8-shortlist-marian",
                    "int8 + shortlist (xf export bergamot), 1 WebAssembly thread"),
    "bergamot-float32": Row("Bergamot page, headless Chromium", "student", "ship/bergamot-float32", "xf-marian",
                            "float32 (xf export bergamot), 1 WebAssembly thread"),
}


def search_of(name: str, common: Search) -> Search:
    """The search of a row or reference: the common one, argostranslate's or Marian's bound."""
    own = {"argos": ARGOS_SEARCH, "libretranslate": ARGOS_SEARCH, "marian": MARIAN_SEARCH, "bergamot": MARIAN_SEARCH,
           "bergamot-float32": MARIAN_SEARCH}
    return Search(**{**asdict(common), **own.get(name, {})})


def model_path(work: Path, which: str) -> Path:
    return Path((work / "ship" / "hf-model.tsv").read_text().split("\t")[0]) if which == "hf" else work / "averaged.pt"


def write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def run(name: str, work: Path, source: Path, common: Search, pair: tuple[str, str]) -> None:
    """Translate ``source`` with row (or reference) ``name``: ship/runs/NAME.txt and NAME.json (the
    json last: it marks the run done). A runtime that cannot run writes only the json, with why."""
    runs = work / "ship" / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    lines = source.read_text(encoding="utf-8").splitlines()
    home = work / "ship" / "home"  # argostranslate's and Chromium's files: never the user's home
    home.mkdir(parents=True, exist_ok=True)
    record = {"name": name}
    if name in REFERENCES:  # the xf rows among them: each is its own run
        which, flags, search = REFERENCES[name]
        s = search_of(search, common)
        hyps, seconds = xf_translate(model_path(work, which), source, s,
                                     *(f.format(shortlist=work / "shortlist.npz") for f in flags))
        command = " ".join(["xf translate", *(f.format(shortlist="shortlist.npz") for f in flags)])
        record.update(model=str(model_path(work, which)), command=command, search=s.describe())
    else:
        row = ROWS[name]
        s = search_of(name, common)
        files = work / row.files
        not_run = (work / "ship" / f"{name}.not-run").read_text().strip() if (work / "ship" / f"{name}.not-run").exists() else ""
        try:
            if not_run:
                raise NotRun(not_run)
            if name == "ctranslate2":
                hyps, seconds = ctranslate2_translate(files, lines, s)
            elif name == "huggingface":
                hyps, seconds = huggingface_translate(files, lines, s)
            elif name == "argos":
                hyps, seconds = argos_translate(files, lines, s, home, pair)
            elif name == "libretranslate":
                hyps, seconds = libretranslate_translate(files, lines, s, home, pair)
            elif name == "marian":
                hyps, seconds = marian_translate(files, lines, s)
            else:
                hyps, seconds = bergamot_translate(files, lines, s, home)
        except NotRun as e:
            record["not_run"] = str(e)
            write_atomically(runs / f"{name}.json", json.dumps(record) + "\n")
            return
        record.update(model=str(model_path(work, row.model)), search=s.describe())
    if len(hyps) != len(lines):
        raise RuntimeError(f"{name}: {len(hyps)} lines translated of {len(lines)}")
    write_atomically(runs / f"{name}.txt", "".join(h + "\n" for h in hyps))
    record.update(lines=len(hyps), seconds=seconds)
    write_atomically(runs / f"{name}.json", json.dumps(record) + "\n")


def hf_model(student: Path, teachers: list[Path]) -> tuple[Path, str]:
    """The first of the student and the teacher(s) that xf export huggingface takes, and why."""
    from xformer_cli.model.checkpoint import load_checkpoint
    from xformer_cli.model.facts import facts_of

    refused = {}
    for who, path in [("student", student)] + [("teacher", t) for t in teachers]:
        reason = facts_of(load_checkpoint(path), path).export_refusal("huggingface")
        if not reason:
            why = "" if who == "student" else f"; the student is refused: {refused['student']}"
            return path, f"{who} ({path.name}: the paper's sinusoids{why})"
        refused[who] = reason.split(";")[0]  # what it lacks; the rest says how to retrain
    raise RuntimeError(f"no model for MarianMT: {'; '.join(f'{w}: {r}' for w, r in refused.items())}")


def size_on_disk(path: Path, name: str) -> int:
    """Bytes of what the runtime loads: the files of a directory (the Bergamot page: its model,
    shortlist and vocabulary, not the engine the page carries), else the file."""
    if name.startswith("bergamot"):
        entry = next(iter(json.loads((path / "registry.json").read_text()).values()))
        return sum((path / entry[part]["name"]).stat().st_size for part in ("model", "lex", "vocab") if part in entry)
    if name == "xf-int8-shortlist":
        return path.stat().st_size + (path.parent / "shortlist.npz").stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else path.stat().st_size


def table(work: Path, ref: Path, names: list[str], hf_why: str) -> str:
    """ship.md (returned) and ship.json from the runs of ``names``."""
    import sacrebleu

    refs = ref.read_text(encoding="utf-8").splitlines()
    runs = work / "ship" / "runs"
    rows = []
    for name in names:
        record = json.loads((runs / f"{name}.json").read_text())
        row = ROWS[name]
        model = hf_why if row.model == "hf" else "student (averaged.pt: portable)"
        entry = {"row": name, "runtime": row.runtime, "model": model}
        reference = json.loads((runs / f"{row.reference}.json").read_text()) if row.reference != name else record
        if "not_run" in record:
            rows.append({**entry, "not_run": record["not_run"]})
            continue
        hyps = (runs / f"{name}.txt").read_text(encoding="utf-8").splitlines()
        theirs = (runs / f"{row.reference}.txt").read_text(encoding="utf-8").splitlines()
        rows.append({**entry, "bleu": sacrebleu.corpus_bleu(hyps, [refs[:len(hyps)]]).score,
                     "same": sum(a == b for a, b in zip(hyps, theirs)), "lines": len(hyps),
                     "compared_with": "itself" if row.reference == name else
                     reference["command"] + ("" if reference["search"] == record["search"] else f" ({reference['search']})"),
                     "sentences_per_s": len(hyps) / record["seconds"] if record["seconds"] > 0 else float("nan"),
                     "size_mb": size_on_disk(work / row.files, name) / 1e6,
                     "settings": f"{row.settings}; {record['search']}"})
    head = ["runtime", "model", "BLEU", "same as xf", "sentences/s", "size (MB)", "settings", "compared with"]
    md = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        if "not_run" in r:
            md.append(f"| {r['runtime']} | {r['model']} | not run: {r['not_run']} | | | | | |")
        else:
            md.append(f"| {r['runtime']} | {r['model']} | {r['bleu']:.2f} | {r['same']} of {r['lines']} | "
                      f"{r['sentences_per_s']:.1f} | {r['size_mb']:.1f} | {r['settings']} | {r['compared_with']} |")
    note = (f"{len(refs)} lines of {ref.name}, sacreBLEU. \"same as xf\": the lines equal to those of xf translate "
            "with the flags of \"compared with\", on the same model, with the row's search (its settings); "
            "sentences/s: the translation alone, models loaded before")
    text = note + "\n\n" + "\n".join(md) + "\n"
    write_atomically(work / "ship.json", json.dumps({"test": str(ref), "rows": rows}, indent=1) + "\n")
    write_atomically(work / "ship.md", text)
    return text


def training_time(logs: list[Path]) -> str:
    """The training time of each train_log.jsonl (its runs' summaries: updates timed, start-up and
    validation apart; a resumed training's runs added up) and their sum, h:mm:ss."""
    hms = lambda sec: f"{int(sec) // 3600}:{int(sec) // 60 % 60:02d}:{int(sec) % 60:02d}"  # noqa: E731
    parts = []
    for log in logs:
        if not log.is_file():
            parts.append(float("nan"))
            continue
        records = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines() if line.strip()]
        parts.append(sum(r.get("train_seconds", 0.0) for r in records if r.get("type") == "summary"))
    each = ", ".join(f"{log}: {hms(sec) if sec == sec else 'no log'}" for log, sec in zip(logs, parts))
    return f"training time: {hms(sum(p for p in parts if p == p))} ({each}; updates only: start-up and validation apart)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    hf = sub.add_parser("hf-model")
    hf.add_argument("student", type=Path)
    hf.add_argument("teachers", type=Path, nargs="+")
    one = sub.add_parser("run")
    one.add_argument("name", choices=[*ROWS, *REFERENCES])
    one.add_argument("--source", type=Path, required=True)
    one.add_argument("--pair", default="en-de")
    ref = sub.add_parser("reference")
    ref.add_argument("name", choices=list(ROWS))
    took = sub.add_parser("training-time")
    took.add_argument("logs", type=Path, nargs="+")
    shot = sub.add_parser("screenshot")
    shot.add_argument("page", type=Path)
    shot.add_argument("out", type=Path)
    shot.add_argument("text")
    tab = sub.add_parser("table")
    tab.add_argument("names", nargs="+", choices=list(ROWS))
    tab.add_argument("--ref", type=Path, required=True)
    for p in (one, tab):
        p.add_argument("--work", type=Path, required=True)
    for p, kind, default in (("--beam", int, 4), ("--lenpen", float, 0.6), ("--max-len", int, 256),
                             ("--batch", int, 16), ("--threads", int, 1)):
        one.add_argument(p, type=kind, default=default)
    args = parser.parse_args()
    try:
        if args.command == "hf-model":
            path, why = hf_model(args.student, args.teachers)
            print(f"{path}\t{why}")
        elif args.command == "run":
            search = Search(args.beam, args.lenpen, args.max_len, args.batch, args.threads)
            run(args.name, args.work, args.source, search, tuple(args.pair.split("-")))
        elif args.command == "reference":
            print(ROWS[args.name].reference)
        elif args.command == "screenshot":
            with tempfile.TemporaryDirectory() as home:  # Chromium's profile, never beside the picture
                screenshot(args.page, args.text, args.out, Path(home))
        elif args.command == "training-time":
            print(training_time(args.logs))
        else:
            why = (args.work / "ship" / "hf-model.tsv").read_text().rstrip("\n").split("\t")[1]
            print(table(args.work, args.ref, args.names, why), end="")
    except Exception as e:  # noqa: BLE001 - the recipe shows one line per failed step
        sys.exit(f"{type(e).__name__}: {e}" if not isinstance(e, RuntimeError) else str(e))


if __name__ == "__main__":
    main()
