"""xf serve against LibreTranslate on the same model: sentences/s and latency p50/p99.

    python bench/serve_vs_libretranslate.py --checkpoint avg.pt            # test2016, 1,000 lines
    python bench/serve_vs_libretranslate.py --checkpoint avg.pt --lines 20  # a quick check

``xf serve`` serves the checkpoint; LibreTranslate 1.9.6 (its own venv, bench/libretranslate_env.py)
serves the checkpoint's ``xf export argos`` package. Both decode as Argos does (beam 4,
CTranslate2's length penalty |Y|^0.2, at most 256 subwords, float32) on --threads threads each.
Multi30k test2016 lines (English to German) go from 1, 4 and 16 client threads of this process
(bench_serve.load: keep-alive connections), one sentence per request and 10 per request; the
servers run one after the other, each alone with the clients. "unlike xf" counts the lines whose
translation differs from xf serve's at concurrency 1 (LibreTranslate also gives a translation the
source's final punctuation, and xf's torch engine may rank a near tie otherwise than CTranslate2).
Each server runs as shipped: LibreTranslate logs every request's sentences and subwords (to a file
here), xf serve its own log lines.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import bench_serve  # noqa: E402  (bench/ on sys.path: the benchmarks import each other)
import libretranslate_env  # noqa: E402

from xformer_cli.formats.argos import write_package  # noqa: E402
from xformer_cli.model.checkpoint import load_checkpoint, model_from_checkpoint  # noqa: E402
from xformer_cli.base.precision import cpu_flags  # noqa: E402

CONCURRENCY = (1, 4, 16)
PER_REQUEST = (1, 10)
# argostranslate's translate_batch: beam_size 4 (settings.beam_size), length_penalty 0.2 (|Y|^0.2),
# CTranslate2's default max_decoding_length 256: xf serve decodes under the same rules and limit
ARGOS = dict(beam=4, lenpen=0.2, max_decoding_length=256)
ARGOS_SEARCH = ["--beam", str(ARGOS["beam"]), "--lenpen", str(ARGOS["lenpen"]), "--lenpen-style", "length",
                "--max-len-a", "0", "--max-len-b", str(ARGOS["max_decoding_length"]), "--precision", "fp32"]


def settings_line(threads: int) -> str:
    """The header's words for what both servers share (STYLE.md item 22)."""
    return (f"Both servers: beam {ARGOS['beam']}, length penalty |Y|^{ARGOS['lenpen']}, at most "
            f"{ARGOS['max_decoding_length']} subwords before eos (CTranslate2's default max_decoding_length; xf "
            f"--max-len-a 0 --max-len-b {ARGOS['max_decoding_length']}), float32, {threads} thread(s) each")


def export_package(checkpoint: str, path: Path) -> Path:
    ckpt = load_checkpoint(checkpoint)
    model = model_from_checkpoint(ckpt, checkpoint).eval()
    with open(path, "wb") as f:
        write_package(f, model, ckpt["spm_model"], source_lang="en", target_lang="de", source_name="English",
                      target_name="German", version="1.0", source=checkpoint)
    return path


def export_ctranslate2(checkpoint: str, path: Path) -> Path:
    from xformer_cli.formats.ctranslate2 import write_model_directory

    ckpt = load_checkpoint(checkpoint)
    path.mkdir()
    write_model_directory(path, model_from_checkpoint(ckpt, checkpoint).eval(), ckpt["spm_model"], "float32", checkpoint)
    return path


def runs(port: int, lines: list[str]) -> dict:
    """{(per request, concurrency): bench_serve.load's result} for one server (a warm-up first)."""
    bench_serve.load(port, [lines[:1]] * 2, 1)
    out = {}
    for per in PER_REQUEST:
        requests = [lines[i:i + per] for i in range(0, len(lines), per)]
        for concurrency in CONCURRENCY:
            out[per, concurrency] = bench_serve.load(port, requests, concurrency)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True, help="an xf checkpoint (English to German)")
    parser.add_argument("--lines", type=int, default=1000, help="the first N lines of test2016.en")
    parser.add_argument("--threads", type=int, default=1, help="threads of each server")
    parser.add_argument("--xf-engine", choices=("xf", "ctranslate2"), default="xf",
                        help="xf serve's engine: its own (torch, fp32) or CTranslate2 on the same float32 export that "
                             "the Argos package holds")
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args()
    lines = bench_serve.SOURCE.read_text(encoding="utf-8").splitlines()[: args.lines]
    flags = cpu_flags()
    print("CPU flags:", " ".join(sorted(f for f in flags if f.startswith(("avx", "amx", "fma", "sse4")))) or "none")
    print(settings_line(args.threads))
    python = libretranslate_env.ensure_venv()
    results = {}
    with tempfile.TemporaryDirectory(prefix="xf-bench-lt-") as tmp:
        package = export_package(args.checkpoint, Path(tmp) / "en_de.argosmodel")
        libretranslate_env.install_package(python, package, Path(tmp) / "home")
        model, search = args.checkpoint, ARGOS_SEARCH
        if args.xf_engine == "ctranslate2":  # the package's own CTranslate2 model, batched across requests by xf
            model, search = str(export_ctranslate2(args.checkpoint, Path(tmp) / "ct2")), [
                "--engine", "ctranslate2", *ARGOS_SEARCH[:-2]]
        server = bench_serve.Server(model, ["--threads", str(args.threads), *search])
        try:
            results["xf serve"] = runs(server.port, lines)
        finally:
            server.stop()
        with libretranslate_env.LibreTranslate(python, Path(tmp) / "home", ("en", "de"), args.threads) as lt:
            results["LibreTranslate"] = runs(lt.port, lines)
    reference = results["xf serve"][1, 1]["outputs"]
    rows = []
    print(f"{'server':15} {'lines/request':>13} {'clients':>7} {'sentences/s':>11} {'p50 ms':>8} {'p99 ms':>8} {'unlike xf':>9}")
    for name, by_case in results.items():
        for (per, concurrency), r in by_case.items():
            unlike = sum(a != b for a, b in zip(r["outputs"], reference))
            rows.append({"server": name, "per_request": per, "concurrency": concurrency, "sent_s": r["sent_s"],
                         "p50_ms": r["p50"], "p99_ms": r["p99"], "unlike_xf": unlike, "lines": len(lines)})
            print(f"{name:15} {per:13} {concurrency:7} {r['sent_s']:11.1f} {r['p50']:8.0f} {r['p99']:8.0f} {unlike:9}")
    if args.json:
        Path(args.json).write_text(json.dumps({"cpu_flags": sorted(flags), "threads": args.threads, "xf_engine": args.xf_engine, "rows": rows},
                                              indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
