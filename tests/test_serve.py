"""xf serve: a real server process on an ephemeral 127.0.0.1 port, spoken to by a real HTTP client
(http.client). Every endpoint; translations equal to xf translate's for each line under 200
concurrent requests from 32 clients; every bad input an answer (hostile JSON, 404 and 405 included);
overload (503, 504); API keys; SIGTERM drain, SIGTERM under load (503 past the grace period), a gone
client's lines dropped; start-up errors before the models load; both engines (the page, in a headless
chromium: tests/test_serve_page.py). The batching queue, bind and the options also have fast unit tests over a fake engine.
Every request loop is bounded in count and time; every address is loopback."""

from __future__ import annotations

import asyncio
import json
import random
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from urllib.parse import urlencode

import pytest

pytest.importorskip("starlette", reason="the serve extra is not installed")
pytest.importorskip("uvicorn", reason="the serve extra is not installed")

from xformer_cli.base.errors import ConfigError, XfError  # noqa: E402
from xformer_cli.settings.config import build_options  # noqa: E402
from xformer_cli.frame import load_command_options
from xformer_cli.text.language_id import LanguageId  # noqa: E402
from xformer_cli.settings.options import ServeOptions, TranslateOptions  # noqa: E402
from xformer_cli.serve.batch_queue import BatchQueue, Direction, Job, QueueFull  # noqa: E402
from xformer_cli.serve.server import Server, bind  # noqa: E402

from helpers import DECODING, FakeEngine, FakeSp, REPO, Served, call, until, xf_translate

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py: torch on one thread (the in-process references)
def target_flag() -> dict:
    """xf translate's options for serve's wrong_language flag (serve's where py3langid knows German)."""
    return {"target_lang": "de"} if LanguageId.load(["de"]) is not None else {}


def confidences(tmp_path) -> list[float]:
    """The best hypothesis's confidence of each line of the last ``xf_translate``."""
    return [json.loads(line)["hypotheses"][0]["confidence"]
            for line in (tmp_path / "ref.jsonl").read_text(encoding="utf-8").splitlines()]


@pytest.fixture(scope="module")
def lines(multi30k_dir) -> list[str]:
    return (multi30k_dir / "test2016.en").read_text(encoding="utf-8").splitlines()[:600]


@pytest.fixture(scope="module")
def server(ckpt):
    # each line one sentence, as xf translate reads a file: its answers are compared line by line with
    # xf translate's (sentence splitting, the default, has its own tests in test_serve_text.py)
    served = Served("--model", f"en-de={ckpt}", *DECODING, "--max-lines", "8", "--max-chars", "2000",
                    "--max-body-bytes", "20000", "--no-split-sentences")
    yield served
    served.stop()


# -- endpoints -----------------------------------------------------------------------------------
@pytest.mark.slow
def test_every_endpoint(server, ckpt, lines, tmp_path):
    reference = xf_translate(ckpt, lines[:3], tmp_path, **target_flag())
    status, _, health = server.request("GET", "/health")
    assert status == 200 and health["status"] == "ready" and health["directions"] == ["en-de"]
    status, _, languages = server.request("GET", "/languages")
    assert status == 200 and languages == [{"code": "en", "name": "English", "targets": ["de"]}]

    status, _, answer = server.translate(lines[0])
    assert 0 <= answer.pop("confidence") <= 1  # an extra field: LibreTranslate's clients ignore it
    assert status == 200 and answer == {"translatedText": reference[0][0]}
    status, _, answer = server.translate(lines[0], alternatives=1)
    assert status == 200 and answer.pop("confidence") >= 0
    assert answer == {"translatedText": reference[0][0], "alternatives": reference[0][1:2]}
    status, _, answer = server.translate([lines[1], lines[2]])
    assert status == 200 and answer.pop("confidence") == pytest.approx(confidences(tmp_path)[1:], abs=2e-6)
    assert answer == {"translatedText": [reference[1][0], reference[2][0]]}
    # the same fields form-encoded, as LibreTranslate also takes them
    form = urlencode([("q", lines[1]), ("q", lines[2]), ("source", "en"), ("target", "de"), ("alternatives", "1")])
    status, _, answer = server.request("POST", "/translate", raw=form.encode(),
                                       headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert status == 200 and len(answer.pop("confidence")) == 2
    assert answer == {"translatedText": [reference[1][0], reference[2][0]],
                                        "alternatives": [reference[1][1:2], reference[2][1:2]]}
    # a text of several lines: each line translated as xf translate reads a file's lines
    status, _, answer = server.translate(f"{lines[0]}\r\n\n{lines[2]}")
    assert status == 200 and answer["translatedText"] == f"{reference[0][0]}\n\n{reference[2][0]}"

    status, headers, metrics = server.request("GET", "/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain")
    assert 'xf_serve_requests_total{path="/translate",status="200"} 5.0' in metrics
    assert "xf_serve_translate_seconds_bucket" in metrics and "xf_serve_batch_sentences_count" in metrics
    assert "xf_serve_queue_lines 0.0" in metrics
    status, headers, page = server.request("GET", "/")
    assert status == 200 and headers["content-type"].startswith("text/html") and 'id="translate"' in page
    status, _, answer = server.request("GET", "/nothing-here")
    assert status == 404 and answer == {"error": "Not Found"}  # JSON like every other answer

    access = [line for line in server.log.splitlines() if line.startswith("xf serve | POST /translate 200")]
    assert len(access) >= 4
    last = access[-1]  # the three-line text
    assert "direction en-de" in last and "lines 3" in last and "queue wait" in last and "decode" in last
    assert "Traceback" not in server.log


@pytest.mark.slow
def test_200_concurrent_requests_from_32_clients_equal_xf_translate(server, ckpt, lines, tmp_path):
    rng = random.Random(0)
    requests, at = [], 0
    while len(requests) < 200:  # test2016 lines as requests of 1 to 5 lines
        n = rng.randint(1, 5)
        requests.append(list(range(at, at + n)))
        at = (at + n) % (len(lines) - 5)
    used = sorted({i for r in requests for i in r})
    reference = dict(zip(used, xf_translate(ckpt, [lines[i] for i in used], tmp_path)))

    def ask(idx):
        status, _, answer = server.translate([lines[i] for i in idx], alternatives=1)
        return status, answer

    with ThreadPoolExecutor(32) as pool:
        answers = list(pool.map(ask, requests))
    for idx, (status, answer) in zip(requests, answers):
        assert status == 200, answer
        assert answer["translatedText"] == [reference[i][0] for i in idx]
        assert answer["alternatives"] == [reference[i][1:2] for i in idx]
    _, _, metrics = server.request("GET", "/metrics")
    batches = float(metrics.split("xf_serve_batch_sentences_count ")[1].split()[0])
    sentences = float(metrics.split("xf_serve_batch_sentences_sum ")[1].split()[0])
    assert sentences / batches > 1.5  # requests were decoded together


@pytest.mark.slow
def test_bad_input_is_an_answer(server, ckpt, lines, tmp_path):
    def refused(status, message, **kw):
        got, _, answer = server.request("POST", "/translate", **kw)
        assert got == status and message in answer["error"], (got, answer)

    refused(400, "not JSON: Expecting", raw=b'{"q": "a", ')
    refused(400, "JSON object", body=["a"])
    # JSON sent as a form (curl -d without -H): said "'q' is empty"
    refused(400, "the body is JSON, but its Content-Type is application/x-www-form-urlencoded",
            raw=b'{"q": "a", "source": "en", "target": "de"}', headers={"Content-Type": "application/x-www-form-urlencoded"})
    refused(400, "'q' is empty", body={"q": "", "source": "en", "target": "de"})
    refused(400, "'q' is empty", body={"q": [], "source": "en", "target": "de"})
    refused(400, "'q' is empty", body={"source": "en", "target": "de"})
    refused(400, "a string or a list of strings", body={"q": ["a", 3], "source": "en", "target": "de"})
    refused(400, "en-fr is not served; served: en-de", body={"q": "a", "source": "en", "target": "fr"})
    refused(400, "source 'auto': the text has no letters", body={"q": "12 345 !", "source": "auto", "target": "de"})
    refused(400, "language codes", body={"q": "a", "source": 1, "target": "de"})
    refused(400, "'format' must be 'text' or 'html'", body={"q": "a", "source": "en", "target": "de", "format": "xml"})
    refused(400, "at most 1 (it runs with --nbest 2)", body={"q": "a", "source": "en", "target": "de", "alternatives": 2})
    refused(400, "'alternatives' must be a number", body={"q": "a", "source": "en", "target": "de", "alternatives": "2"})
    refused(413, "9 lines are over the limit of 8", body={"q": ["a"] * 9, "source": "en", "target": "de"})
    refused(413, "9 lines are over the limit of 8", body={"q": "a\n" * 9, "source": "en", "target": "de"})
    # a final newline ends the last line: 8 lines, within --max-lines 8 (it was "9 lines are over")
    assert server.request("POST", "/translate", body={"q": "a\n" * 8, "source": "en", "target": "de"})[0] == 200
    refused(413, "over the limit of 2,000 a request", body={"q": "a" * 2001, "source": "en", "target": "de"})
    refused(413, "over the limit of 20,000", raw=b" " * 20001)  # refused before it is parsed
    refused(400, "nests arrays or objects deeper than 64 levels", raw=b"[" * 10_000 + b"]" * 10_000)
    refused(400, "nests arrays or objects deeper than 64 levels", raw=b'{"q": ' + b"[" * 9_000 + b"]" * 9_000 + b"}")
    refused(400, "not JSON xf reads", raw=b'{"q": "a", "alternatives": ' + b"9" * 5000 + b"}")  # int digits limit
    refused(400, "got an array", body={"q": "a", "source": "en", "target": "de", "format": [[["x"]]]})
    status, headers, answer = server.request("GET", "/translate")
    assert status == 405 and answer == {"error": "Method Not Allowed"} and headers["allow"] == "POST"

    # invalid UTF-8, lone surrogates and control characters: one output per input, as xf translate
    bad = lines[3].encode() + b" \xff\xfe"
    status, _, answer = server.request("POST", "/translate", raw=b'{"q": "' + bad + b'", "source": "en", "target": "de"}')
    controls = [f"{lines[4]} \x00\x1b[31m", "\ud800 " + lines[5], "\t\x0c\x7f"]
    status2, _, answer2 = server.translate(controls)
    reference = xf_translate(ckpt, [bad.decode("utf-8", "replace"), controls[0], "\ufffd " + lines[5], controls[2]], tmp_path)
    assert status == 200 and answer["translatedText"] == reference[0][0]
    assert status2 == 200 and answer2["translatedText"] == [r[0] for r in reference[1:]]
    assert "invalid UTF-8 in the body replaced" in server.log and "invalid UTF-8 lines 1" in server.log
    assert "Traceback" not in server.log


@pytest.mark.slow
def test_api_keys(ckpt, tmp_path):
    (tmp_path / "keys").write_text("# the keys of the tests\nsecret-1\n\nsecret-2\n")
    served = Served("--model", f"en-de={ckpt}", *DECODING, "--api-keys", str(tmp_path / "keys"))
    try:
        assert served.translate("A dog .")[0] == 403
        status, _, answer = served.translate("A dog .", api_key="wrong")
        assert status == 403 and answer == {"error": "Invalid API key"}
        assert served.translate("A dog .", api_key="secret-2")[0] == 200
        assert served.request("GET", "/languages")[0] == 200  # only /translate needs a key
    finally:
        assert served.stop() == 0


def wait_for_queued(served: Served, lines: int, seconds: float = 10) -> None:
    """Until /health counts ``lines`` queued lines (at most ``seconds``)."""
    deadline = time.time() + seconds
    while served.request("GET", "/health")[2]["queue_lines"] < lines and time.time() < deadline:
        time.sleep(0.02)


@pytest.mark.slow
def test_a_full_queue_is_503_and_a_long_wait_504(ckpt):
    # the first request waits 5 s for others to join its batch: it holds the 2 queued lines
    served = Served("--model", f"en-de={ckpt}", *DECODING, "--max-queue-lines", "2", "--max-wait-ms", "5000",
                    "--timeout", "1.5")
    try:
        with ThreadPoolExecutor(1) as pool:
            first = pool.submit(served.translate, ["A dog .", "A cat ."])
            wait_for_queued(served, 2)
            status, headers, answer = served.translate("A man .")
            assert status == 503 and int(headers["retry-after"]) >= 1 and "queue is full" in answer["error"]
            status, _, answer = first.result()
            assert status == 504 and "no translation within 1.5 s" in answer["error"]
    finally:
        assert served.stop() == 0
    assert "Traceback" not in served.log


@pytest.mark.slow
def test_sigterm_drains_the_requests_in_flight(ckpt, lines, tmp_path):
    reference = xf_translate(ckpt, lines[:6], tmp_path)
    served = Served("--model", f"en-de={ckpt}", *DECODING, "--max-wait-ms", "1500", "--grace-seconds", "5")
    with ThreadPoolExecutor(6) as pool:
        answers = [pool.submit(served.translate, line) for line in lines[:6]]
        wait_for_queued(served, 6, seconds=1.2)  # all six queued, their batch not yet started
        start = time.perf_counter()
        code = served.stop()
        took = time.perf_counter() - start
        results = [a.result() for a in answers]
    assert code == 0 and took < 5
    assert [(status, answer["translatedText"]) for status, _, answer in results] == [(200, r[0]) for r in reference]
    with pytest.raises(OSError):
        served.request("GET", "/health")
    assert "xf serve (en-de) | requests " in served.log and "| how they ended answered: " in served.log
    assert "| requests by status 200: " in served.log and "| lines decoded 6 |" in served.log
    assert "503 at shutdown" not in served.log and "Traceback" not in served.log


def clean(log: str) -> bool:
    """No traceback, nor the lines uvicorn writes when a request's task is cancelled under it."""
    return not any(s in log for s in ("Traceback", "CancelledError", "Exception in ASGI", "Internal Server Error"))


def ended(log: str) -> dict[str, int]:
    """The summary's 'how they ended' counts: {'answered': 3, '503 at shutdown': 2, ...}."""
    row = log.split("| how they ended ")[1].split(" | ")[0]
    return {name: int(n.replace(",", "")) for name, n in (part.rsplit(": ", 1) for part in row.split(", "))}


@pytest.mark.slow
def test_sigterm_under_load_answers_every_request_json_and_exits_0(ckpt, lines):
    # 20 requests of 100 lines at the default decoding options: some 20 batches of 2,048 subwords,
    # a second or more each, against a grace period of 1 s
    served = Served("--model", f"en-de={ckpt}", "--threads", "1", "--grace-seconds", "1", "--max-chars", "20000")
    requests = [[lines[(30 * i + j) % len(lines)] for j in range(100)] for i in range(20)]
    with ThreadPoolExecutor(len(requests)) as pool:
        answers = [pool.submit(served.translate, q) for q in requests]
        wait_for_queued(served, 1500, seconds=30)  # most of the 2,000 lines queued
        start = time.perf_counter()
        code = served.stop()
        took = time.perf_counter() - start
        results = [a.result() for a in answers]
    assert code == 0 and took < 20  # the grace period, the batch being decoded, the 503s written
    statuses = [status for status, _, _ in results]
    assert set(statuses) <= {200, 503} and 503 in statuses, statuses
    for status, headers, answer in results:
        assert headers["content-type"] == "application/json"
        if status == 503:
            assert "shutting down: not answered within 1 s (--grace-seconds)" in answer["error"]
        else:
            assert len(answer["translatedText"]) == 100
    assert clean(served.log), served.log
    access = [line for line in served.log.splitlines() if line.startswith("xf serve | ") and " | total " in line]
    counts = ended(served.log)
    assert counts["503 at shutdown"] == statuses.count(503) and sum(counts.values()) == len(access)
    assert f"| requests {len(access)} |" in served.log
    assert "lines dropped undecoded 0 |" not in served.log  # the lines of the 503s were not decoded


def queued_lines(served: Served) -> int:
    return served.request("GET", "/health")[2]["queue_lines"]


def sentences_decoded(served: Served) -> float:
    metrics = served.request("GET", "/metrics")[2]
    return float(metrics.split("xf_serve_batch_sentences_sum ")[1].split()[0])


@pytest.mark.slow
def test_a_gone_clients_lines_are_dropped_and_sigterm_mid_batch_exits_0(ckpt, lines):
    # batches of 64 subwords: 100 lines are some 70 batches of about 0.1 s each, one after another
    served = Served("--model", f"en-de={ckpt}", "--threads", "1", "--max-batch-tokens", "64", "--max-chars", "20000")
    body = json.dumps({"q": lines[:100], "source": "en", "target": "de"}).encode()

    def ask_and_leave_once_decoding():
        before = sentences_decoded(served)
        with socket.create_connection(("127.0.0.1", served.port), timeout=10) as sock:
            sock.sendall(b"POST /translate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            assert until(lambda: sentences_decoded(served) > before, 20)  # its first batch is decoded

    try:
        ask_and_leave_once_decoding()
        assert until(lambda: "POST /translate 499" in served.log, 10), served.log
        time.sleep(0.5)  # the batch that was decoding when it left ends
        decoded = sentences_decoded(served)
        time.sleep(0.5)
        assert sentences_decoded(served) == decoded < 100 and queued_lines(served) == 0
        # again, and SIGTERM while its batch decodes: the worker ends it, the process exits 0 (no abort)
        ask_and_leave_once_decoding()
    finally:
        code = served.stop()
    assert code == 0, served.log
    gone = [line for line in served.log.splitlines() if "POST /translate 499" in line]
    assert len(gone) == 2 and all("lines dropped undecoded" in line for line in gone), gone
    assert ended(served.log)["client gone"] == 2 and clean(served.log), served.log


@pytest.mark.slow
def test_start_up_errors_are_one_line(ckpt, tmp_path):
    def fails(args, message):
        proc = subprocess.run([sys.executable, "-m", "xformer_cli", "serve", "--port", "0", *args], capture_output=True,
                              text=True, cwd=REPO, timeout=120)
        assert proc.returncode != 0 and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and proc.stderr.startswith("xf: error: "), proc.stderr

    fails(["--model", f"en-de={tmp_path / 'missing.pt'}"], "missing.pt does not exist")
    fails(["--model", f"en-de={ckpt}", "--model", f"en-de={ckpt}"], "direction en-de is given more than once")
    fails(["--model", f"en-de={ckpt}", "--api-keys", str(tmp_path / "nokeys")], "--api-keys")
    # the port and the host before any model loads: the missing model is not what is reported
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        fails(["--model", f"en-de={tmp_path / 'missing.pt'}", "--port", str(port)],
              f"cannot listen on 127.0.0.1:{port}: Address already in use")
    fails(["--model", f"en-de={tmp_path / 'missing.pt'}", "--host", "bad..host"], "cannot listen on bad..host:0")


@pytest.mark.slow
def test_ctranslate2_engine(ckpt, lines, tmp_path):
    pytest.importorskip("ctranslate2", reason="the ctranslate2 extra is not installed")
    from xformer_cli.model.checkpoint import load_checkpoint, model_from_checkpoint
    from xformer_cli.formats.ctranslate2 import write_model_directory

    exported = tmp_path / "ct2"
    loaded = load_checkpoint(ckpt)
    write_model_directory(exported, model_from_checkpoint(loaded, ckpt).eval(), loaded["spm_model"], source=str(ckpt))
    reference = xf_translate(str(exported), lines[:40], tmp_path, engine="ctranslate2", **target_flag())
    served = Served("--model", f"en-de={exported}", "--engine", "ctranslate2", *DECODING)
    try:
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda i: served.translate(lines[i:i + 4]), range(0, 40, 4)))
        # a whitespace-only text comes back as sent, at once (it was a 504 after --timeout)
        assert served.translate(" \n\t")[::2] == (200, {"translatedText": " \n\t", "confidence": 1.0})
    finally:
        assert served.stop() == 0
    got = [text for status, _, answer in answers for text in answer["translatedText"]]
    assert all(status == 200 for status, _, _ in answers) and got == [r[0] for r in reference]
    # the confidence is translate's (it was exp(0) = 1.0 for every line: text output had no scores)
    assert [c for _, _, answer in answers for c in answer["confidence"]] == pytest.approx(confidences(tmp_path), abs=2e-6)
    assert "engine ctranslate2" in served.log


class FakeTranslator:
    """CTranslate2's Translator as the engine calls it: every hypothesis "▁5 ▁6" and its eos, -1.5."""

    def translate_batch(self, sources, num_hypotheses, **_):
        return [SimpleNamespace(hypotheses=[["\u25815", "\u25816", "</s>"]] * num_hypotheses, scores=[-1.5] * num_hypotheses)
                for _ in sources]

    def score_batch(self, sources, targets):
        return [SimpleNamespace(log_probs=[-0.5] * (len(t) + 1)) for t in targets]


def test_ctranslate2_hypotheses_have_the_log_probabilities_serve_takes_its_confidence_from():
    """serve's decoding options give every CTranslate2 hypothesis its subwords' log-probabilities
    (it had none, as for xf translate's text output, and each answer's confidence was exp(0) = 1)."""
    from xformer_cli.decode.ctranslate2_engine import CTranslate2Engine

    sp = SimpleNamespace(id_to_piece=lambda i: ["<pad>", "<unk>", "<s>", "</s>"][i] if i < 4 else f"\u2581{i}",
                         get_piece_size=lambda: 8)
    engine = CTranslate2Engine(FakeTranslator(), sp, max_positions=64)
    options = build_options(ServeOptions, {"model": ["en-de=ct2"], "engine": "ctranslate2"}, "test")
    found = engine.search([[5, 6, 7]], options.translate_options("ct2"))
    assert found[0][0].tokens == [5, 6, 3] and found[0][0].positional_scores == [-0.5] * 3


def direction(code="en-de"):
    source, target = code.split("-")
    return Direction(source, target, FakeEngine(), FakeSp(), TranslateOptions(path=("x",)))


def test_queued_jobs_are_decoded_together_in_order():
    de, fr = direction("en-de"), direction("en-fr")
    queue = BatchQueue(max_batch_tokens=12, max_wait_ms=200, max_queue_lines=100)
    jobs = [Job(de, [[5, 6], [], [7]]), Job(fr, [[8]]), Job(de, [[9, 10, 11]]), Job(de, [[12] * 5])]
    for job in jobs:
        queue.submit(job)
    queue.start()
    results = [job.future.result(5) for job in jobs]
    queue.stop()
    assert results[0] == [["6 5"], [""], ["7"]] and results[1] == [["8"]] and results[2] == [["11 10 9"]]
    assert results[3] == [["12 12 12 12 12"]]
    # jobs 1 and 3 of en-de fit 12 tokens together (3 + 2 + 4), sorted longest first; job 4 waits
    assert de.engine.batches == [[[9, 10, 11], [5, 6], [7]], [[12] * 5]] and fr.engine.batches == [[[8]]]
    assert queue.lines == 0 and queue.batches == 3 and queue.lines_done == 6


def test_a_full_queue_refuses_and_a_cancelled_job_is_not_decoded():
    de = direction()
    queue = BatchQueue(max_batch_tokens=100, max_wait_ms=0, max_queue_lines=3)
    cancelled, kept = Job(de, [[5], [6]]), Job(de, [[7]])
    queue.submit(cancelled)
    queue.submit(kept)
    with pytest.raises(QueueFull):
        queue.submit(Job(de, [[8]]))
    assert cancelled.future.cancel()
    queue.start()
    assert kept.future.result(5) == [["7"]]
    queue.stop()
    assert de.engine.batches == [[[7]]]


class GatedEngine(FakeEngine):
    """A FakeEngine whose each search starts (``started``) and waits for ``go`` before it ends."""

    def __init__(self):
        super().__init__()
        self.started, self.go = threading.Semaphore(0), threading.Semaphore(0)

    def search(self, sentences, options, generator=None):
        self.started.release()
        assert self.go.acquire(timeout=10)
        return super().search(sentences, options, generator)


def gated_direction() -> Direction:
    return Direction("en", "de", GatedEngine(), FakeSp(), TranslateOptions(path=("x",)))


def test_a_long_job_goes_on_in_the_next_batches_in_order():
    de = direction()
    queue = BatchQueue(max_batch_tokens=8, max_wait_ms=0, max_queue_lines=100)
    job = Job(de, [[5, 6, 7], [8, 9, 10], [], [11], [12, 13, 14]])  # 4 + 4 + 0 + 2 + 4 subwords with eos
    queue.submit(job)
    queue.start()
    assert job.future.result(5) == [["7 6 5"], ["10 9 8"], [""], ["11"], ["14 13 12"]]
    queue.stop()
    assert de.engine.batches == [[[5, 6, 7], [8, 9, 10]], [[12, 13, 14], [11]]]  # each sorted longest first


def test_a_dropped_job_loses_its_lines_not_yet_decoded():
    de = gated_direction()
    queue = BatchQueue(max_batch_tokens=8, max_wait_ms=0, max_queue_lines=100)
    job = Job(de, [[5, 6, 7]] * 6)  # 2 lines a batch
    queue.submit(job)
    queue.start()
    assert de.engine.started.acquire(timeout=5)  # its first batch is decoding
    assert queue.lines == 4 and queue.drop(job) == 4 and queue.lines == 0
    de.engine.go.release()
    queue.stop()
    assert de.engine.batches == [[[5, 6, 7]] * 2] and not job.future.done()
    assert (queue.lines_done, queue.lines_dropped) == (2, 4)


def test_stop_waits_for_the_batch_being_decoded_and_drops_the_rest():
    de = gated_direction()
    queue = BatchQueue(max_batch_tokens=8, max_wait_ms=0, max_queue_lines=100)
    first, second = Job(de, [[5, 6, 7], [8, 9, 10]]), Job(de, [[11]])
    queue.submit(first)
    queue.start()
    assert de.engine.started.acquire(timeout=5)
    queue.submit(second)
    stopper = threading.Thread(target=queue.stop)
    stopper.start()
    stopper.join(0.3)
    assert stopper.is_alive()  # a search is never cut short
    de.engine.go.release()
    stopper.join(5)
    assert not stopper.is_alive() and not queue.thread.is_alive()
    assert first.future.result(0) == [["7 6 5"], ["10 9 8"]] and second.future.cancelled()
    assert de.engine.batches == [[[5, 6, 7], [8, 9, 10]]] and queue.lines_dropped == 1
    with pytest.raises(QueueFull):
        queue.submit(Job(de, [[12]]))


def test_bind_names_host_and_port_and_the_cause(monkeypatch):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(XfError, match=f"cannot listen on 127.0.0.1:{port}: Address already in use"):
            bind("127.0.0.1", port)
    sock = bind("127.0.0.1", 0)  # bound, not listening: a connection before the models load is refused
    with sock, pytest.raises(ConnectionRefusedError):
        socket.create_connection(sock.getsockname(), timeout=5).close()

    def no_such_host(*args, **kwargs):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", no_such_host)
    with pytest.raises(XfError, match="cannot listen on no-such-host:5000: Name or service not known"):
        bind("no-such-host", 5000)


def test_serve_options(tmp_path):
    (tmp_path / "xf.yaml").write_text("translate: {beam: 6}\nserve: {model: [en-de=a.pt], beam: 5, nbest: 3}\n")
    options = load_command_options(ServeOptions, tmp_path / "xf.yaml", {"port": 8080}, section="serve")
    assert (options.beam_size, options.nbest, options.port) == (5, 3, 8080)
    translate_options = options.translate_options("a.pt")
    assert (translate_options.path, translate_options.beam_size, translate_options.nbest) == (("a.pt",), 5, 3)
    assert options.host == "127.0.0.1"
    for values, message in (({"model": ["de=a.pt"]}, "SOURCE-TARGET=CHECKPOINT"),
                            ({"model": ["en-de=a.pt"], "sampling": True}, "does not sample"),
                            ({"model": ["en-de=a.pt"], "max_len_a": 0, "max_len_b": 0}, "allow no output"),
                            ({"model": ["en-de=a.pt"], "nbest": 5}, "larger than --beam-size"),
                            ({"model": ["en-de=a.pt"], "max_btach_tokens": 5}, "did you mean 'max_batch_tokens'")):
        with pytest.raises(ConfigError, match=message):
            build_options(ServeOptions, values, "test")


# -- the application in-process, over the ASGI interface ------------------------------------------
class FailingEngine(FakeEngine):
    def search(self, sentences, options, generator=None):
        raise RuntimeError("index 7 is out of bounds")  # a bug, not an allocation (that one names its limits)


def in_process(engine) -> Server:
    options = build_options(ServeOptions, {"model": ["en-de=x.pt"], "max_batch_tokens": 8, "max_wait_ms": 0}, "test")
    server = Server([Direction("en", "de", engine, FakeSp(), TranslateOptions(path=("x",)))], options, [])
    server.queue.start()
    return server


def test_a_failed_search_is_a_json_500_and_one_log_line(capsys):
    server = in_process(FailingEngine())
    try:
        status, answer = asyncio.run(call(server.app(), "/translate", b'{"q": "5 6", "source": "en", "target": "de"}'))
    finally:
        server.queue.stop()
    assert (status, answer) == (500, {"error": "internal error"})
    log = capsys.readouterr().err
    assert "POST /translate 500" in log and "internal error: RuntimeError: index 7 is out of bounds" in log and clean(log)
    assert server.outcomes == {"internal error": 1}


def test_a_query_string_of_invalid_utf8_is_read_as_a_body_is():
    """A byte that is not UTF-8 in the query string was a 500 (Starlette's request.url decodes it
    strictly); found by tests/test_fuzz.py."""
    server = in_process(FakeEngine())

    async def both():  # on one event loop, as a server runs
        app = server.app()
        return [await call(app, "/translate", b'{"q": "5 6", "source": "en", "target": "de"}', query=b"\x80"),
                await call(app, "/translate", query=b"q=5+6&source=en&target=de&x=\xff", headers=[])]

    try:
        assert asyncio.run(both()) == [(200, {"translatedText": "6 5", "confidence": 1.0})] * 2
    finally:
        server.queue.stop()


def test_a_superscript_digit_is_not_a_number():
    """'²' passes str.isdigit and fails int(): as a Content-Length, or a form's alternatives, it was a
    500 (found by tests/test_fuzz.py)."""
    server = in_process(FakeEngine())
    form = [(b"content-type", b"application/x-www-form-urlencoded")]

    async def both():  # on one event loop, as a server runs
        app = server.app()
        return [await call(app, "/translate", b'{"q": "5"}', headers=[(b"content-length", b"\xb2")]),
                await call(app, "/translate", "q=5&source=en&target=de&alternatives=²".encode(), headers=form)]

    try:
        length, alternatives = asyncio.run(both())
    finally:
        server.queue.stop()
    assert length == (400, {"error": "Content-Length '²' is not a number"})
    assert alternatives[0] == 400 and alternatives[1]["error"].startswith("'alternatives' must be a number from 0 to")


def test_a_direction_not_served_is_named_on_one_line():
    """A source code holding a line break was written as it was into the error (found by
    tests/test_fuzz.py)."""
    server = in_process(FakeEngine())
    body = json.dumps({"q": "5", "source": "\n", "target": "de"}).encode()
    try:
        status, answer = asyncio.run(call(server.app(), "/translate", body))
    finally:
        server.queue.stop()
    assert (status, answer) == (400, {"error": '"\\n-de" is not served; served: en-de'})


def test_past_the_grace_period_a_503_and_a_gone_client_499_both_drop_their_lines(capsys):
    engine = GatedEngine()
    server = in_process(engine)
    body = json.dumps({"q": ["5 6 7"] * 6, "source": "en", "target": "de"}).encode()  # 3 batches of 2 lines

    async def scenario():
        app, leave = server.app(), asyncio.Event()
        gone = asyncio.ensure_future(call(app, "/translate", body, leave=leave))
        await asyncio.to_thread(engine.started.acquire, timeout=5)  # its first batch is decoding
        leave.set()
        assert (await gone)[0] == 499  # uvicorn sends nothing to a client that is gone
        assert server.queue.lines == 0 and server.queue.lines_dropped == 4
        late = asyncio.ensure_future(call(app, "/translate", body))
        for _ in range(500):  # at most 5 s until it is queued behind the batch still decoding
            if server.queue.lines == 6:
                break
            await asyncio.sleep(0.01)
        server.past_grace.set()
        return await late

    try:
        status, answer = asyncio.run(scenario())
    finally:
        engine.go.release()
        server.queue.stop()
    assert status == 503 and answer["error"].startswith("shutting down: not answered within 10 s")
    assert server.queue.lines_dropped == 10 and engine.batches == [[[5, 6, 7]] * 2]
    assert server.outcomes == {"client gone": 1, "503 at shutdown": 1} and server.statuses == {499: 1, 503: 1}
    log = capsys.readouterr().err
    assert "POST /translate 499" in log and "lines dropped undecoded 4" in log and clean(log)




def test_an_api_keys_file_with_a_byte_order_mark_keeps_its_first_key(tmp_path):
    from xformer_cli.serve.server import read_api_keys

    keys = tmp_path / "keys"
    keys.write_bytes("\ufeffsecret-1\n# a comment\nsecret-2\n".encode("utf-8"))
    assert read_api_keys(str(keys)) == ["secret-1", "secret-2"]
