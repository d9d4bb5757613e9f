"""LibreTranslate beside xf: its own virtual environment, an exported package installed into a
private Argos home, and the server started on it (tests/test_export_argos.py and
bench/serve_vs_libretranslate.py share this).

LibreTranslate 1.9.6 pins rich 12.6, which xf's typer does not run with, so it lives in a venv of
its own: torch first, the version xf runs with (pip would otherwise pull a CUDA build for
LibreTranslate's torch requirement), then LibreTranslate. The venv is cached under the repository's
git-ignored ``.xf-cache/``, keyed by both versions, and reused only once complete (``complete``
is written last); a build takes about a minute and 1.5 GB here.

Started on a package of its own, LibreTranslate must not fetch anything: with fewer than two
packages installed it downloads its package index and the packages of --load-only, then MiniSBD's
models. ARGOS_PACKAGE_INDEX names an empty local index, so it finds nothing to install, says
"Cannot update models" and serves what is installed.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

LIBRETRANSLATE = "1.9.6"
ROOT = Path(__file__).resolve().parents[1]


def torch_requirement() -> str:
    """The torch xf runs with, as a pip requirement (its local tag dropped: +cpu is the index's)."""
    import torch

    return "torch==" + torch.__version__.split("+")[0]


def venv_dir() -> Path:
    return ROOT / ".xf-cache" / f"libretranslate-{LIBRETRANSLATE}-{torch_requirement().replace('==', '-')}"


def ensure_venv(log=print) -> Path:
    """The python of LibreTranslate's venv, built first if missing or left half-built (one build
    at a time: a lock beside it)."""
    venv = venv_dir()
    python = venv / "bin" / "python"
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / (venv.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (venv / "complete").exists():
            return python
        shutil.rmtree(venv, ignore_errors=True)
        start = time.monotonic()
        log(f"building {venv} (torch, then libretranslate=={LIBRETRANSLATE})")
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pip = [str(python), "-m", "pip", "install", "--quiet"]
        subprocess.run([*pip, torch_requirement()], check=True)
        subprocess.run([*pip, f"libretranslate=={LIBRETRANSLATE}"], check=True)
        (venv / "complete").write_text(f"built in {time.monotonic() - start:.0f} s\n")
        log(f"built {venv} in {time.monotonic() - start:.0f} s")
    return python


PROXIES = ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def argos_env(home: Path) -> dict:
    """The environment of an argostranslate (or LibreTranslate) whose every file lies in ``home``:
    its packages, settings, caches, and an empty package index; and which fetches nothing: its
    HTTP(S) proxy is a closed port, so a download it tries fails instead of running unseen."""
    home = home.resolve()
    home.mkdir(parents=True, exist_ok=True)
    index = home / "index"
    index.mkdir(exist_ok=True)
    (index / "index.json").write_text("[]")
    proxy = f"http://127.0.0.1:{free_port()}"  # nothing listens there: bound, then released
    return {**os.environ, "HOME": str(home), "XDG_DATA_HOME": str(home / "data"),
            "XDG_CONFIG_HOME": str(home / "config"), "XDG_CACHE_HOME": str(home / "cache"),
            "ARGOS_PACKAGES_DIR": str(home / "packages"), "ARGOS_PACKAGE_INDEX": index.as_uri() + "/",
            "ARGOS_DEVICE_TYPE": "cpu", **dict.fromkeys(PROXIES, proxy),
            "no_proxy": "127.0.0.1,localhost", "NO_PROXY": "127.0.0.1,localhost"}


def install_package(python: Path, package: Path, home: Path) -> None:
    """argostranslate.package.install_from_path of ``package`` under ``home``, by ``python``."""
    code = "import sys; from argostranslate import package; package.install_from_path(sys.argv[1])"
    subprocess.run([str(python), "-c", code, str(package)], env=argos_env(home), check=True)


class LibreTranslate:
    """``libretranslate --load-only SRC,TGT`` on a free port of 127.0.0.1, its packages in ``home``:
    ``threads`` request threads (its --threads) and CTranslate2 threads (ARGOS_INTRA_THREADS;
    argostranslate's default, 0, would take every core)."""

    def __init__(self, python: Path, home: Path, languages: tuple[str, str], threads: int = 4, timeout: float = 300):
        self.port = free_port()
        self.log = open(home / "libretranslate.log", "w")  # a pipe nobody reads would block it once full
        code = "import sys; from libretranslate.main import main; sys.argv[0] = 'libretranslate'; main()"
        self.process = subprocess.Popen(
            [str(python), "-c", code, "--host", "127.0.0.1", "--port", str(self.port),
             "--load-only", ",".join(languages), "--threads", str(threads), "--disable-web-ui"],
            env={**argos_env(home), "ARGOS_INTRA_THREADS": str(threads)}, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"LibreTranslate exited: {(home / 'libretranslate.log').read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/languages", timeout=5) as r:
                    self.languages = json.load(r)
                break
            except OSError:
                if time.monotonic() > deadline:
                    self.close()
                    raise RuntimeError(f"LibreTranslate did not answer within {timeout:.0f} s")
                time.sleep(0.5)

    def translate(self, q, source: str, target: str):
        body = json.dumps({"q": q, "source": source, "target": target, "format": "text"}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}/translate", body,
                                         {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=600) as r:
            return json.load(r)["translatedText"]

    def close(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


if __name__ == "__main__":
    # python bench/libretranslate_env.py: build the venv (once) and print its python
    print(ensure_venv(log=lambda message: print(message, file=sys.stderr)))
