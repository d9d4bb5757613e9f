"""xf serve under load: sentences/s and latency p50/p95/p99 at concurrency 1, 8 and 32.

The requests are Multi30k test2016 lines in groups of 1 to 5 (seeded), sent by that many client
threads of this process over keep-alive HTTP connections to a real ``xf serve`` process on
127.0.0.1. Each concurrency's throughput is given as a ratio to two references measured in the
same run: ``xf translate`` on the same lines as one file (the ceiling: one process, batches of 64
sorted by length; its own summary's sentences/s, model loading excluded) and the same requests
served one at a time without batching (concurrency 1 with --max-wait-ms 0: what batching buys).
The one-line latency row compares a one-line request at concurrency 1 with translate_buffer on
that line in this process, line after line (median over XF_BENCH_SERVE_SINGLE lines, default 30).
The paragraph rows send each request's lines as one paragraph (one ``q``, its lines joined by a
space; the server splits it into sentences) against the same lines one sentence per ``q`` to a
server with --no-split-sentences, both at concurrency XF_BENCH_SERVE_PARAGRAPHS (default 8): what
sentence splitting costs (the aim: under 10%), and how many paragraphs' translations differ from
their sentences' translations joined.
The cases alternate, XF_BENCH_ROUNDS rounds (default 2), each figure the best round. "lines unlike
xf translate's" counts the served translations that differ from the file's (every round). The clients
share the CPU with the server: on a 2-core machine their HTTP work is part of the cost.

XF_BENCH_CHECKPOINT=PATH serves a trained checkpoint; without it bench/decode.py's random `small`
model stands in (outputs capped at the source length). XF_BENCH_SENTENCES=N (default 200) lines;
XF_BENCH_THREADS=N (default 1) torch threads for the server and both references.
"""

from __future__ import annotations

import http.client
import importlib.util
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
MULTI30K = Path(os.environ.get("MULTI30K_DIR", REPO.parent / "shared" / "data" / "multi30k"))
SOURCE = Path(os.environ.get("XF_BENCH_SOURCE", MULTI30K / "test2016.en"))
CHECKPOINT = os.environ.get("XF_BENCH_CHECKPOINT")
SENTENCES = int(os.environ.get("XF_BENCH_SENTENCES", "200"))
# torch threads of the server, of xf translate and of the in-process reference alike; 1 by default,
# so that on a small machine the client threads have a core of their own
THREADS = int(os.environ.get("XF_BENCH_THREADS", "1"))
SINGLE = int(os.environ.get("XF_BENCH_SERVE_SINGLE", "30"))
ROUNDS = int(os.environ.get("XF_BENCH_ROUNDS", "2"))
CONCURRENCY = (1, 8, 32)
PARAGRAPHS = int(os.environ.get("XF_BENCH_SERVE_PARAGRAPHS", "8"))


def _bench_decode():
    """bench/decode.py, whose random checkpoint maker is the one home for it."""
    if "decode" in sys.modules:
        return sys.modules["decode"]
    spec = importlib.util.spec_from_file_location("decode", HERE / "decode.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["decode"] = module
    spec.loader.exec_module(module)
    return module


def decoding(trained: bool) -> list[str]:
    return ["--threads", str(THREADS)] + ([] if trained else ["--max-len-a", "1", "--max-len-b", "0"])


def requests_of(lines: list[str]) -> list[list[str]]:
    rng, out, at = random.Random(0), [], 0
    while at < len(lines):
        n = rng.randint(1, 5)
        out.append(lines[at:at + n])
        at += n
    return out


class Server:
    def __init__(self, checkpoint: str, args: list[str]):
        self.proc = subprocess.Popen([sys.executable, "-m", "xformer_cli", "serve", "--model", f"en-de={checkpoint}",
                                      "--port", "0", "--max-lines", "100", "--max-queue-lines", "100000", *args],
                                     stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, cwd=REPO)
        for line in self.proc.stderr:
            if "listening on http://127.0.0.1:" in line:
                self.port = int(line.split("127.0.0.1:")[1].split()[0])
                break
        else:
            raise RuntimeError(f"xf serve exited {self.proc.wait()}")
        threading.Thread(target=lambda: [None for _ in self.proc.stderr], daemon=True).start()  # drain the log

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(60)


def post(conn: http.client.HTTPConnection, lines, paragraph: bool = False) -> tuple[float, list[str]]:
    """(seconds, translations) of one request of ``lines`` on a keep-alive connection (paragraph:
    the lines as one text, joined by a space; its one translation)."""
    body = json.dumps({"q": [" ".join(lines)] if paragraph else lines, "source": "en", "target": "de"})
    start = time.perf_counter()
    conn.request("POST", "/translate", body=body, headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    answer = response.read()
    if response.status != 200:
        raise RuntimeError(f"xf serve answered {response.status}")
    return time.perf_counter() - start, json.loads(answer)["translatedText"]


def load(port: int, requests: list[list[str]], concurrency: int, paragraphs: bool = False) -> dict:
    """Send every request from ``concurrency`` clients (paragraphs: each as one paragraph);
    sentences/s and latency percentiles."""
    local = threading.local()

    def ask(lines):
        if not hasattr(local, "conn"):
            local.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        return post(local.conn, lines, paragraphs)

    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        answers = list(pool.map(ask, requests))  # in request order
    elapsed = time.perf_counter() - start
    q = statistics.quantiles(sorted(seconds for seconds, _ in answers), n=100, method="inclusive")
    return {"sent_s": sum(map(len, requests)) / elapsed, "p50": q[49] * 1000, "p95": q[94] * 1000, "p99": q[98] * 1000,
            "outputs": [text for _, texts in answers for text in texts]}


def file_throughput(checkpoint: str, lines: list[str], directory: Path, trained: bool) -> float:
    """sentences/s of `xf translate` on the lines as one file (its summary line, loading excluded)."""
    (directory / "in.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    proc = subprocess.run([sys.executable, "-m", "xformer_cli", "translate", "--path", checkpoint, "--input",
                           str(directory / "in.txt"), "--output", str(directory / "out.txt"), *decoding(trained)],
                          capture_output=True, text=True, cwd=REPO, check=True)
    return float(re.search(r"sentences/s ([\d,.]+)", proc.stderr).group(1).replace(",", ""))


class InProcess:
    """translate_buffer on one line in this process: the reference for a one-line request."""

    def __init__(self, checkpoint: str, trained: bool):
        from xformer_cli.decode.translate import open_engine
        from xformer_cli.settings.options import TranslateOptions

        overrides = {} if trained else {"max_len_a": 1.0, "max_len_b": 0}
        self.options = TranslateOptions(path=(checkpoint,), threads=THREADS, **overrides)
        self.engine, self.sp, _ = open_engine(self.options)

    def seconds(self, line: str) -> float:
        from xformer_cli.decode.translate import Stats, translate_buffer

        start = time.perf_counter()
        translate_buffer(self.engine, self.sp, [line], 0, self.options, Stats())
        return time.perf_counter() - start


def one_line_ratio(port: int, reference: InProcess, lines: list[str]) -> tuple[float, float]:
    """Median ms of a one-line request and of the same line in-process, measured line after line."""
    served, alone = [], []
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    for line in lines:
        alone.append(reference.seconds(line))
        served.append(post(conn, [line])[0])
    conn.close()
    return statistics.median(served) * 1000, statistics.median(alone) * 1000


def best(runs: list[dict]) -> dict:
    """Per figure, the best round: the most sentences/s, the least latency."""
    return {key: (max if key == "sent_s" else min)(r[key] for r in runs) for key in runs[0] if key != "outputs"}


def rows() -> list[dict]:
    lines = SOURCE.read_text(encoding="utf-8").splitlines()[:SENTENCES]
    requests = requests_of(lines)
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        checkpoint = CHECKPOINT or _bench_decode().random_checkpoint(directory)
        trained = CHECKPOINT is not None
        reference = InProcess(checkpoint, trained)
        reference.seconds(lines[0])  # warm-up
        unbatched_server = Server(checkpoint, [*decoding(trained), "--max-wait-ms", "0"])
        server = Server(checkpoint, decoding(trained))
        lines_server = Server(checkpoint, [*decoding(trained), "--no-split-sentences"])
        files, unbatched, one_line, paragraphs, sentences = [], [], [], [], []
        results: dict[int, list[dict]] = {c: [] for c in CONCURRENCY}
        try:
            for s in (unbatched_server, server, lines_server):
                load(s.port, requests[:5], 1)  # warm-up
            # the cases alternate, ROUNDS rounds: on a busy machine each ratio compares like with like
            for _ in range(ROUNDS):
                files.append(file_throughput(checkpoint, lines, directory, trained))
                reference_outputs = (directory / "out.txt").read_text(encoding="utf-8").splitlines()
                unbatched.append(load(unbatched_server.port, requests, 1))
                for c in CONCURRENCY:
                    results[c].append(load(server.port, requests, c))
                one_line.append(one_line_ratio(server.port, reference, lines[:SINGLE]))
                sentences.append(load(lines_server.port, requests, PARAGRAPHS))
                paragraphs.append(load(server.port, requests, PARAGRAPHS, paragraphs=True))
        finally:
            lines_server.stop()
            server.stop()
            unbatched_server.stop()
    ceiling, unbatched_best = max(files), best(unbatched)
    served_ms, in_process_ms = min(one_line, key=lambda pair: pair[0] / pair[1])

    model = "trained" if trained else "random small"
    out = [
        {"bench": "serve", "case": "xf translate, one file", "metric": "sentences/s", "value": ceiling, "unit": "sent/s",
         "note": f"{model}, {len(lines)} lines, {THREADS} thread(s): the ceiling"},
        {"bench": "serve", "case": "one request at a time, unbatched", "metric": "sentences/s",
         "value": unbatched_best["sent_s"], "unit": "sent/s", "ratio": unbatched_best["sent_s"] / ceiling,
         "note": "--max-wait-ms 0, concurrency 1; ratio to the file"},
    ]
    for c in CONCURRENCY:
        r = best(results[c])
        out.append({"bench": "serve", "case": f"concurrency {c}", "metric": "sentences/s", "value": r["sent_s"],
                    "unit": "sent/s", "ratio": r["sent_s"] / ceiling,
                    "note": f"ratio to the file; {r['sent_s'] / unbatched_best['sent_s']:.2f}x unbatched"})
        differ = sum(a != b for run in results[c] for a, b in zip(run["outputs"], reference_outputs))
        out.append({"bench": "serve", "case": f"concurrency {c}", "metric": "lines unlike xf translate's",
                    "value": differ, "unit": "lines", "note": f"of {len(lines) * ROUNDS} ({ROUNDS} rounds)"})
        out.append({"bench": "serve", "case": f"concurrency {c}", "metric": "latency p50/p95/p99",
                    "value": f"{r['p50']:.0f} / {r['p95']:.0f} / {r['p99']:.0f}", "unit": "ms",
                    "note": f"{len(requests)} requests of 1-5 lines"})
    out.append({"bench": "serve", "case": "one-line request, concurrency 1", "metric": "latency p50",
                "value": served_ms, "unit": "ms", "ratio": served_ms / in_process_ms,
                "note": f"ratio to translate_buffer in-process ({in_process_ms:.1f} ms), {SINGLE} lines, line after line"})
    per_sentence, per_paragraph = best(sentences), best(paragraphs)
    out.append({"bench": "serve", "case": f"sentences one per q, concurrency {PARAGRAPHS}", "metric": "sentences/s",
                "value": per_sentence["sent_s"], "unit": "sent/s", "note": "--no-split-sentences; the paragraphs' reference"})
    out.append({"bench": "serve", "case": f"paragraphs, concurrency {PARAGRAPHS}", "metric": "sentences/s",
                "value": per_paragraph["sent_s"], "unit": "sent/s", "ratio": per_paragraph["sent_s"] / per_sentence["sent_s"],
                "note": f"{len(requests)} paragraphs of 1-5 lines split by the server; ratio to one sentence per q "
                        f"(aim >= 0.9); p50 {per_paragraph['p50']:.0f} ms"})
    differ = 0
    for run_p, run_s in zip(paragraphs, sentences):
        joined, at = [], 0
        for request in requests:
            joined.append(" ".join(run_s["outputs"][at:at + len(request)]))
            at += len(request)
        differ += sum(a != b for a, b in zip(run_p["outputs"], joined))
    out.append({"bench": "serve", "case": f"paragraphs, concurrency {PARAGRAPHS}",
                "metric": "paragraphs unlike their sentences' translations joined", "value": differ, "unit": "paragraphs",
                "note": f"of {len(requests) * ROUNDS} ({ROUNDS} rounds); a line of two sentences is split"})
    return out
