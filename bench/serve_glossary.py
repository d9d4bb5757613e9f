"""xf serve's glossaries: what they change (the served translations against xf translate --glossary's)
and what they cost (matching, and served throughput with and without), as one command.

    python bench/serve_glossary.py [--path CKPT] [--data ../shared/data] [--sentences 200] [--rounds 2]

The Wiktionary set's sentences (newstest2017 EN, ``terminology/``) and its 884 term pairs as one
glossary file (``terminology.glossary_text``). Four runs, each a real ``xf serve
--no-split-sentences`` process (so a line is a sentence, as in a file) sent the sentences as
requests of 1-5 lines from ``--concurrency`` clients, and alternated for ``--rounds`` rounds, each
figure its best round:
- no glossary;
- the server's (``--glossary en-de=FILE``);
- the request's: the same 884 pairs in every request's ``glossary`` (the worst case of a request
  glossary: parsed, checked and compiled per request; ``--max-glossary-terms 1000``);
- the reference: ``xf translate --glossary FILE`` on the same lines as one file.
The served outputs of the two glossary runs are compared line by line with the reference's (the
same constraints on the same sentences: they should be the same lines), and the term-hit rate
(``terminology.term_hits``) of each. Also: microseconds a sentence of finding the terms
(``glossary.find_terms`` over the direction's glossary, and over a request's and the direction's
together) against ``Glossary.constraints`` (xf translate's).
Without --path, bench_translate's random ``small`` model (outputs capped at the source length):
the comparisons and the costs hold for any model; the hit rates mean something with a trained one.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))


def bench_module(name: str):
    """A sibling bench script as a module (one home for what it defines)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def served(checkpoint: str, requests: list[list[str]], args: list[str], concurrency: int, threads: int,
           glossary: list | None = None) -> tuple[float, list[str]]:
    """(sentences/s, outputs in order) of one xf serve process answering ``requests``."""
    import http.client
    import threading
    from concurrent.futures import ThreadPoolExecutor

    flags = ["--no-split-sentences", "--threads", str(threads), "--max-len-a", "1", "--max-len-b", "0",
             "--timeout", "3600", *args]  # a loaded machine's queue waits past the default 30 s
    server = bench_module("bench_serve").Server(checkpoint, flags)
    local = threading.local()

    def ask(lines):
        if not hasattr(local, "conn"):
            local.conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=600)
        body = {"q": lines, "source": "en", "target": "de", **({"glossary": glossary} if glossary else {})}
        local.conn.request("POST", "/translate", body=json.dumps(body), headers={"Content-Type": "application/json"})
        response = local.conn.getresponse()
        answer = json.loads(response.read())
        if response.status != 200:
            raise RuntimeError(f"xf serve answered {response.status}: {answer}")
        return answer["translatedText"]

    try:
        start = time.perf_counter()
        with ThreadPoolExecutor(concurrency) as pool:
            answers = list(pool.map(ask, requests))
        elapsed = time.perf_counter() - start
    finally:
        server.stop()
    return sum(map(len, requests)) / elapsed, [text for texts in answers for text in texts]


def matching(sources: list[str], glossary_file: Path, pairs: list) -> list[str]:
    """Microseconds a sentence of finding the terms, three ways (best of 5 passes over the lines)."""
    from xformer_cli.glossary import Glossary, find_terms

    server = Glossary.load(str(glossary_file))
    request = Glossary.from_pairs(pairs, "glossary")
    ways = {"Glossary.constraints (xf translate)": lambda s: server.constraints(s),
            "find_terms, the direction's glossary": lambda s: find_terms(s, [server]),
            "find_terms, a request's and the direction's": lambda s: find_terms(s, [request, server])}
    out = ["| matching, 884 terms | µs a sentence |", "|---|---|"]
    for name, way in ways.items():
        best = float("inf")
        for _ in range(5):
            start = time.perf_counter()
            for s in sources:
                way(s)
            best = min(best, time.perf_counter() - start)
        out.append(f"| {name} | {best / len(sources) * 1e6:.0f} |")
    re.purge()  # a glossary not seen before: its regex compiled (re caches the last 512 patterns)
    start = time.perf_counter()
    Glossary.from_pairs(pairs, "glossary")
    compiled = time.perf_counter() - start
    start = time.perf_counter()
    Glossary.from_pairs(pairs, "glossary")
    out.append(f"| reading a request's 884 pairs (Glossary.from_pairs, once a request): new / seen before | "
               f"{compiled * 1e6:.0f} / {(time.perf_counter() - start) * 1e6:.0f} (a request) |")
    return out


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--path", default=None, help="the checkpoint (EN-DE); default: a random small model")
    ap.add_argument("--data", type=Path, default=HERE.parent.parent / "shared" / "data",
                    help="a folder with terminology/ and multi30k/ (default ../shared/data)")
    ap.add_argument("--sentences", type=int, default=200, help="the first N of the set's 727 sentences")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1, help="torch threads of the server and of xf translate")
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args(argv)
    terminology = bench_module("terminology")
    sources, _, terms = terminology.wiktionary(a.data / "terminology")
    sources, terms = sources[:a.sentences], terms[:a.sentences]
    requests = bench_module("bench_serve").requests_of(sources)
    with tempfile.TemporaryDirectory(prefix="xf-serve-glossary-") as tmp:
        work = Path(tmp)
        checkpoint = a.path or bench_module("bench_translate").random_checkpoint(work)
        glossary_file = work / "glossary.tsv"
        glossary_file.write_text(terminology.glossary_text(terms), encoding="utf-8")
        pairs = [line.split("\t") for line in glossary_file.read_text(encoding="utf-8").splitlines()]
        (work / "in.en").write_text("\n".join(sources) + "\n", encoding="utf-8")
        runs = {"no glossary": ([], None), "the server's (--glossary)": (["--glossary", f"en-de={glossary_file}"], None),
                "the request's (884 pairs in each)": (["--max-glossary-terms", "1000"], pairs)}
        best, outputs, reference_s = {name: 0.0 for name in runs}, {}, 0.0
        for _ in range(a.rounds):
            for name, (args, glossary) in runs.items():
                rate, outputs[name] = served(checkpoint, requests, args, a.concurrency, a.threads, glossary)
                best[name] = max(best[name], rate)
            start = time.perf_counter()
            subprocess.run([sys.executable, "-m", "xformer_cli", "translate", "--path", checkpoint, "--input",
                            str(work / "in.en"), "--output", str(work / "ref.de"), "--glossary", str(glossary_file),
                            "--threads", str(a.threads), "--max-len-a", "1", "--max-len-b", "0", "--quiet"],
                           check=True, cwd=HERE.parent)
            reference_s = max(reference_s, len(sources) / (time.perf_counter() - start))  # model loading included
        reference = (work / "ref.de").read_text(encoding="utf-8").splitlines()
        flags = " ".join(sorted(set(re.findall(r"\b(avx2|avx512f|avx512_vnni|avx512_bf16|amx_int8|amx_bf16)\b",
                                              Path("/proc/cpuinfo").read_text())))) if Path("/proc/cpuinfo").exists() else "?"
        hit, total = terminology.term_hits(reference, terms)
        lines = [f"# xf serve glossaries: {a.path or 'a random small model'}, {len(sources)} sentences of the "
                 f"Wiktionary set, {len(requests)} requests, concurrency {a.concurrency}, {a.threads} thread(s), "
                 f"{a.rounds} round(s); CPU flags: {flags}", "",
                 "| run | sentences/s (best round) | ratio to no glossary | lines unlike xf translate --glossary's | "
                 "term-hit rate |", "|---|---|---|---|---|"]
        for name in runs:
            same = "" if name == "no glossary" else \
                f"{sum(x != y for x, y in zip(outputs[name], reference))} of {len(reference)}"
            h, t = terminology.term_hits(outputs[name], terms)
            lines.append(f"| {name} | {best[name]:.1f} | {best[name] / best['no glossary']:.2f}x | {same} | "
                         f"{h}/{t} |")
        lines.append(f"| xf translate --glossary, one file (model loading included) | {reference_s:.1f} | "
                     f"{reference_s / best['no glossary']:.2f}x | | {hit}/{total} |")
        lines += ["", *matching(sources, glossary_file, pairs)]
    print("\n".join(lines))


if __name__ == "__main__":
    main(sys.argv[1:])
