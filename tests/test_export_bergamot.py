"""xf export bergamot: bad input refused in one line with nothing written, and the pages it
writes, opened in a real headless chromium from a plain static file server that is then stopped:
float32 and greedy, the page chooses xf's pieces (the files hold xf's model); float32 at beam 4,
with and without a shortlist, the page's lines are Marian's (pymarian over the same files) on 99
of 100 test2016 lines; int8 with a shortlist, 100 lines score within 0.5 BLEU of xf translate
--quantize int8, and the lines the same as xf's and the sentences per second are printed, not
asserted. Line for line the int8 page has no twin to meet: Marian 1.12 (pymarian) cannot load an
intgemm8 model on the CPU, and xf's int8 rounds otherwise (on the tiny model xf's own int8 keeps
about a third of its float32 lines), so its search and shortlist are checked in float32."""

from __future__ import annotations

import functools
import http.server
import json
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from xformer_cli.cli import app
from xformer_cli.commands.export import export
from xformer_cli.commands.shortlist import shortlist as build_shortlist
from xformer_cli.commands.translate import translate
from xformer_cli.settings.options import ExportOptions, ShortlistOptions, TranslateOptions

from helpers import random_checkpoint, train_tiny

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / ".bergamot/node_modules/@browsermt/bergamot-translator"
CHROMIUM, CHROMEDRIVER, NPM = shutil.which("chromium"), shutil.which("chromedriver"), shutil.which("npm")
LINES = 100
runner = CliRunner()


def fails(args, message):
    result = runner.invoke(app, [str(a) for a in args])
    assert result.exit_code != 0
    err = result.stderr.strip()
    assert len(err.splitlines()) == 1 and message in err, err


@pytest.fixture(scope="module")
def engine() -> Path:
    """The pinned npm package, installed by make bergamot where it is not (CI has the npm registry)."""
    if not (PACKAGE / "package.json").is_file():
        if not NPM:
            pytest.skip("no npm to install @browsermt/bergamot-translator (make bergamot)")
        subprocess.run(["make", "bergamot"], cwd=REPO, check=True, capture_output=True)
    return PACKAGE


MARIAN = dict(sinusoids="tensor2tensor", decoder_start="zero")  # what Marian computes (formats.marian)


def test_bad_input_is_one_line_and_writes_nothing(tmp_path, spm_model):
    ckpt = random_checkpoint(tmp_path / "m.pt", spm_model, d_model=64, d_ff=128, **MARIAN)
    out = tmp_path / "page"
    fails(["export", "bergamot", "--path", ckpt, "--output", out, "--shortlist", tmp_path / "sl.npz",
           "--bergamot-package", tmp_path / "nowhere"], "install it with make bergamot")
    if (PACKAGE / "package.json").is_file():  # the rest passes the package check
        fails(["export", "bergamot", "--path", ckpt, "--output", out, "--shortlist", tmp_path / "sl.npz",
               "--source-lang", "e"], "two letters")
        odd = random_checkpoint(tmp_path / "odd.pt", spm_model, **MARIAN)  # d_model 32
        fails(["export", "bergamot", "--path", odd, "--output", out, "--shortlist", tmp_path / "sl.npz",
               "--quantization", "int8"], "d_model 32")
        fails(["export", "bergamot", "--path", ckpt, "--output", out, "--shortlist", tmp_path / "sl.npz",
               "--quantization", "bfloat16"], "float32 or int8")
        untied = random_checkpoint(tmp_path / "untied.pt", spm_model, d_model=64, d_ff=128, share_embeddings="none",
                                   **MARIAN)
        fails(["export", "bergamot", "--path", untied, "--output", out], "--share-embeddings none")
        paper = random_checkpoint(tmp_path / "paper.pt", spm_model, d_model=64, d_ff=128)  # xf's own conventions
        fails(["export", "bergamot", "--path", paper, "--output", out, "--shortlist", tmp_path / "sl.npz"],
              "--sinusoids tensor2tensor")
        fails(["export", "bergamot", "--path", ckpt, "--output", out, "--shortlist", tmp_path / "sl.npz"],
              "shortlist file not found")
    assert not out.exists()
    out.mkdir()
    (out / "mine.txt").write_text("mine")
    fails(["export", "bergamot", "--path", ckpt, "--output", out, "--shortlist", tmp_path / "sl.npz"], "--overwrite")
    fails(["export", "bergamot", "--path", ckpt, "--output", tmp_path, "--shortlist", tmp_path / "sl.npz",
           "--overwrite"], "m.pt")
    assert [p.name for p in out.iterdir()] == ["mine.txt"]


def test_quantization_auto_is_int8_where_the_engine_can(tmp_path, spm_model, engine):
    """The page's default weights: int8 (smaller and faster in the page, docs/benchmarks.md) where
    Bergamot's int8 engine can multiply the model, else float32 with the reason in the summary."""
    for name, widths, int8 in (("wide", dict(d_model=64, d_ff=128), True), ("odd", {}, False)):
        ckpt = random_checkpoint(tmp_path / f"{name}.pt", spm_model, **widths, **MARIAN)
        out = tmp_path / name
        result = runner.invoke(app, ["export", "bergamot", "--path", str(ckpt), "--output", str(out),
                                     "--bergamot-package", str(engine)])
        assert result.exit_code == 0, result.stderr
        entry = next(iter(json.loads((out / "registry.json").read_text()).values()))
        assert ("intgemm8" in entry["model"]["name"]) == int8, entry
        assert ("--quantization auto: float32, as Bergamot's int8 engine needs" in result.stderr) == (name == "odd")
        assert "d_model 32" in result.stderr or name == "wide"


# -- the page in a headless browser ----------------------------------------------------------------
needs_browser = pytest.mark.skipif(not (CHROMIUM and CHROMEDRIVER), reason="no headless browser: apt-get install "
                                   "chromium chromium-driver (.ci/run does)")


class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # the test's output is its result, not the server's log
        pass


@pytest.fixture(scope="module")
def marian_tiny(multi30k_dir, tmp_path_factory) -> Path:
    """conftest's trained_tiny with Marian's conventions (xf export marian and bergamot refuse others)."""
    return train_tiny(multi30k_dir, tmp_path_factory.mktemp("marian-tiny"), **MARIAN)


class Served:
    """An export of ``ckpt`` served by a plain static file server (stop() takes it away)."""

    def __init__(self, ckpt: Path, out: Path, **options):
        export(ExportOptions(format="bergamot", path=str(ckpt), output=str(out), bergamot_package=str(PACKAGE),
                             **options))
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(out)))
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/index.html"

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def tiny_shortlist(marian_tiny, tmp_path_factory) -> Path:
    """xf shortlist of marian_tiny's data."""
    path = tmp_path_factory.mktemp("shortlist") / "sl.npz"
    build_shortlist(ShortlistOptions(data=str(marian_tiny.parents[1] / "data"), output=str(path)))
    return path


@pytest.fixture(scope="module")
def page(marian_tiny, tiny_shortlist, engine, tmp_path_factory):
    """marian_tiny exported in int8 with its shortlist: (the served page, the shortlist)."""
    served = Served(marian_tiny, tmp_path_factory.mktemp("bergamot") / "page", shortlist=str(tiny_shortlist),
                    quantization="int8")
    yield served, tiny_shortlist
    served.stop()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium (the test extra) is not installed")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
                 f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=webdriver.ChromeService(executable_path=CHROMEDRIVER), options=options)
    driver.set_script_timeout(600)
    yield driver
    driver.quit()


def xf_int8(ckpt, lines, tmp_path, **options) -> list[str]:
    """xf translate --quantize int8 with the page's search: Marian's beam rule, beam 4, score / |Y|^1."""
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    translate(TranslateOptions(path=(str(ckpt),), input=str(tmp_path / "in.txt"), output=str(tmp_path / "int8.txt"),
                               quiet=True, device="cpu", quantize="int8", beam_size=4, lenpen=1.0,
                               lenpen_style="length", beam_rule="marian", **options))
    return (tmp_path / "int8.txt").read_text(encoding="utf-8").splitlines()


def translate_offline(browser, served: Served, lines: list[str]) -> tuple[list[str], float]:
    """Open the page, wait until its model is loaded, stop the server, translate ``lines``:
    (their translations, seconds)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(served.url)
    status = browser.find_element(By.ID, "status")
    WebDriverWait(browser, 120).until(lambda _: status.get_attribute("data-state") in ("ready", "error"))
    assert status.get_attribute("data-state") == "ready", status.text
    served.stop()  # loaded: from here on the page translates offline
    start = time.perf_counter()
    out = browser.execute_async_script("xfTranslate(arguments[0]).then(arguments[1], e => arguments[1]("
                                       "'error: ' + e.message))", lines)
    assert isinstance(out, list) and len(out) == len(lines), out
    return out, time.perf_counter() - start


@needs_browser
@pytest.mark.slow
def test_a_float32_page_computes_xfs_model(marian_tiny, engine, browser, multi30k_dir, tmp_path):
    """Greedy, float32, no shortlist: the page and xf choose the same pieces; a line may differ only
    where one engine's length limit cut it (Bergamot's worker fixes max-length-factor 2)."""
    source = (multi30k_dir / "test2016.en").read_text(encoding="utf-8").splitlines()[:LINES]
    page_lines, _ = translate_offline(browser, Served(marian_tiny, tmp_path / "page", beam_size=1,
                                                                quantization="float32"), source)
    (tmp_path / "in.txt").write_text("\n".join(source) + "\n", encoding="utf-8")
    translate(TranslateOptions(path=(str(marian_tiny),), input=str(tmp_path / "in.txt"), output=str(tmp_path / "xf"),
                               quiet=True, device="cpu", beam_size=1, precision="fp32"))
    xf_lines = (tmp_path / "xf").read_text(encoding="utf-8").splitlines()
    cut = [i for i, (a, b) in enumerate(zip(page_lines, xf_lines)) if a != b]
    print(f"\nxf export bergamot, float32 greedy: {LINES - len(cut)} of {LINES} lines as xf's, the rest cut apart")
    assert all(xf_lines[i].startswith(page_lines[i]) or page_lines[i].startswith(xf_lines[i]) for i in cut), cut


def pymarian_lines(directory: Path, lines: list[str]) -> list[str]:
    """Marian (pymarian) translating ``lines`` as marian-decoder's users run it (log-probabilities:
    no --skip-cost) with the float32 page's files in ``directory`` and its search: registry.json's
    beam and normalize, the worker's length limit (max-length-factor 2, fixed by
    translator-worker.js, times the widest source of a batch) and the page's batches (page.js's
    BatchTranslator sends 16 lines at a time, in order; the worker's 1,024 words a batch hold them)."""
    pymarian = pytest.importorskip("pymarian", reason="the marian extra is not installed")
    [entry] = json.loads((directory / "registry.json").read_text()).values()
    config = entry["config"]
    assert config["gemm-precision"] == "float32"  # Marian 1.12 on the CPU has no intgemm8 (pymarian aborts on one)
    flags = ["-m", directory / entry["model"]["name"], "-v", *[directory / entry["vocab"]["name"]] * 2,
             "--beam-size", config["beam-size"], "--normalize", config["normalize"], "--allow-unk",
             "--max-length-factor", 2, "--mini-batch", 16, "--maxi-batch", 1, "--cpu-threads", 1, "--quiet"]
    if "lex" in entry:
        flags += ["--shortlist", directory / entry["lex"]["name"], "false"]  # Marian reads the binary format
    return pymarian.Translator(" ".join(map(str, flags))).translate(lines)


@needs_browser
@pytest.mark.slow
@pytest.mark.parametrize("with_shortlist", [False, True], ids=["softmax", "shortlist"])
def test_the_page_runs_marians_beam_search(marian_tiny, tiny_shortlist, engine, browser, multi30k_dir, tmp_path,
                                           with_shortlist):
    """Beam 4, float32, with and without the shortlist the int8 page has: the page translates as
    Marian does with the same files and search, on at least 99 of 100 lines. The worker's default
    skip-cost ranks a beam by raw logits; the export turns it off (bergamot_format.worker_options).
    How many lines are also xf translate's with Marian's beam rule (--beam-rule marian; the
    bound per line, not per batch: test_marian) is printed."""
    source = (multi30k_dir / "test2016.en").read_text(encoding="utf-8").splitlines()[:LINES]
    shortlist = dict(shortlist=str(tiny_shortlist)) if with_shortlist else {}
    served = Served(marian_tiny, tmp_path / "page", beam_size=4, quantization="float32", **shortlist)
    page_lines, _ = translate_offline(browser, served, source)
    marian = pymarian_lines(tmp_path / "page", source)
    (tmp_path / "in.txt").write_text("\n".join(source) + "\n", encoding="utf-8")
    translate(TranslateOptions(path=(str(marian_tiny),), input=str(tmp_path / "in.txt"), output=str(tmp_path / "xf"),
                               quiet=True, device="cpu", beam_size=4, lenpen=1.0, lenpen_style="length",
                               beam_rule="marian", max_len_a=2, max_len_b=2, precision="fp32", **shortlist))
    xf_lines = (tmp_path / "xf").read_text(encoding="utf-8").splitlines()
    differ = [i for i, (a, b) in enumerate(zip(page_lines, marian)) if a != b]
    print(f"\nxf export bergamot, float32 beam 4{' with the shortlist' if with_shortlist else ''}: "
          f"{LINES - len(differ)} of {LINES} lines as Marian's (pymarian), "
          f"{sum(a == b for a, b in zip(page_lines, xf_lines))} as xf translate's")
    assert len(marian) == LINES and len(differ) <= LINES // 100, [(page_lines[i], marian[i]) for i in differ[:3]]


@needs_browser
@pytest.mark.slow
@pytest.mark.kernels
def test_the_page_translates_offline_as_well_as_xf_int8(page, browser, marian_tiny, multi30k_dir, tmp_path):
    import sacrebleu

    served, shortlist = page
    source = (multi30k_dir / "test2016.en").read_text(encoding="utf-8").splitlines()[:LINES]
    refs = (multi30k_dir / "test2016.de").read_text(encoding="utf-8").splitlines()[:LINES]
    page_lines, seconds = translate_offline(browser, served, source)
    hyps = dict(page=page_lines, xf=xf_int8(marian_tiny, source, tmp_path),
                xf_shortlist=xf_int8(marian_tiny, source, tmp_path, shortlist=str(shortlist)))
    bleu = {name: sacrebleu.corpus_bleu(hyp, [refs]).score for name, hyp in hyps.items()}
    same = {name: sum(a == b for a, b in zip(page_lines, hyps[name])) for name in ("xf", "xf_shortlist")}
    print(f"\nxf export bergamot page: BLEU {bleu['page']:.2f}, {LINES / seconds:.1f} sentences/s in headless "
          f"chromium; xf translate --quantize int8 {bleu['xf']:.2f}, {same['xf']} of {LINES} lines the same (with "
          f"the shortlist {bleu['xf_shortlist']:.2f}, {same['xf_shortlist']} the same)")
    assert abs(bleu["page"] - bleu["xf"]) <= 0.5
