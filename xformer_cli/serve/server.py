"""xf serve's HTTP side: LibreTranslate's API over the batching queue, on Starlette (ASGI).

Endpoints (the shape LibreTranslate's clients already speak):

- ``POST /translate`` ``{"q": "text" or ["t1", "t2"], "source": "en", "target": "de",
  "format": "text", "alternatives": 2, "api_key": "..."}`` (JSON, or the same fields
  form-encoded) -> ``{"translatedText": ..., "alternatives": [...]}`` (alternatives only when
  asked for). A text is split into sentences (``segment``; a sentence too long split to fit) and
  its translation joined with its own spacing and line breaks; with --no-split-sentences it is
  translated line by line, as ``xf translate`` reads a file, a line too long truncated and counted
  in the answer's ``truncated``. The fields may also come in the query string, form-encoded or
  multipart. ``source: "auto"`` detects the language (``language_id``). ``format: "html"``: the
  text of a document translated and its markup kept as written (``html_text``), inline tags placed
  by the word alignment of the best translation. ``glossary``: the request's own terms as
  [source, target] pairs, applied with the direction's --glossary (``server_glossary: false``:
  without it; ``glossary: false``: no glossary at all); the answer's ``glossaryTerms`` says which
  terms each item's text held and whether its translation has them.
- ``POST /detect`` ``{"q": ...}`` -> ``[{"language": "en", "confidence": 0.97}]`` (served languages only)
- ``POST /translate_file`` (multipart ``file``, .txt) -> ``{"translatedFileUrl": "data:..."}``
- ``GET /languages`` -> ``[{"code": "en", "name": "English", "targets": ["de"]}]``
- ``GET /frontend/settings`` -> what a client may offer (``Server.settings``: the limits, the most
  alternatives, detection, API keys, the default direction, the languages' names), as
  LibreTranslate's own page asks its server before it shows anything
- ``GET /health`` (ready: the models are loaded), ``GET /metrics`` (Prometheus), ``GET /`` (a page).

Every answer other than 200 is ``{"error": "..."}``: 400 (malformed or too deeply nested JSON,
wrong types, empty q, a direction not served, no language for auto, a format not text or html,
a bad glossary), 403 (API key), 404 and 405 (no such path or method), 413 (body, lines,
characters or glossary pairs over the limits; the body's size is checked before it is parsed), 503 with Retry-After (queue full), 503 at shutdown (unanswered when
--grace-seconds ran out), 504 (waited longer than --timeout). A client that disconnects is
logged as 499 and its lines not yet decoded leave the queue. Every request is one access-log
line on stderr and one outcome in the summary at exit; no traceback reaches a response or the log.

Shutdown (``Server.run``): SIGTERM or Ctrl-C stops accepting, the worker stops waiting for
batches to fill, the requests in flight are answered for up to --grace-seconds (a second Ctrl-C:
at once); then each one still unanswered gets a 503, its lines are dropped, and the worker ends
once the batch it decodes is done.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import sys
import threading
import time
from importlib import resources
from pathlib import Path
from typing import Optional

from ..base.errors import XfError
from ..settings.options import ServeOptions
from ..text.language_id import LanguageId, UnknownLanguage
from .access_log import ANSWER_SECONDS, AccessLog
from .batch_queue import BatchQueue, Direction
from .directions import language_name
from .fields import HttpError, request_fields, shown
from .translation import Translation, check_api_key

BACKSTOP_SECONDS = 5.0  # uvicorn cancels what is still running this long after the grace period


def read_api_keys(path: Optional[str]) -> list[str]:
    """The keys of --api-keys FILE (one a line; blank lines and '#' comments skipped), or [] without it."""
    if path is None:
        return []
    try:
        text = Path(path).read_text(encoding="utf-8-sig")  # a BOM (Notepad) is not part of the first key
    except FileNotFoundError:
        raise XfError(f"--api-keys {path}: file not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise XfError(f"--api-keys {path}: cannot read it: {e}") from None
    keys = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    if not keys:
        raise XfError(f"--api-keys {path}: holds no key (one key a line)")
    return keys


def bind(host: str, port: int) -> socket.socket:
    """A socket bound to host:port (port 0: a free one), before any model loads, so that a host that
    does not resolve or a port taken is a one-line error at once. Not listening yet: ``listen()``
    once the models are loaded, so that a connection before is refused, not left waiting."""
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
    except OSError as e:  # socket.gaierror: the host does not resolve
        raise XfError(f"--host {host} --port {port}: cannot listen on {where}: {e.strerror or e}") from None
    except ValueError as e:  # UnicodeError (an empty label: 'a..b'), a NUL
        raise XfError(f"--host {host} --port {port}: cannot listen on {where}: not a host name ({e})") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a port in TIME_WAIT, not one in use
        sock.bind(address)
    except OSError as e:
        sock.close()
        raise XfError(f"--host {host} --port {port}: cannot listen on {where}: {e.strerror or e}") from None
    return sock


class Metrics:
    """The Prometheus series of /metrics, in a registry of their own."""

    def __init__(self):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        self.requests = Counter("xf_serve_requests", "HTTP requests by path and status", ["path", "status"],
                                registry=self.registry)
        self.latency = Histogram("xf_serve_translate_seconds", "time to answer POST /translate",
                                 buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
                                 registry=self.registry)
        self.batch = Histogram("xf_serve_batch_sentences", "sentences per decoded batch",
                               buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512), registry=self.registry)
        self.queue = Gauge("xf_serve_queue_lines", "lines waiting to be decoded", registry=self.registry)
        self.lines = Counter("xf_serve_lines", "lines translated, by direction", ["direction"], registry=self.registry)

    def render(self) -> tuple[bytes, str]:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class Server:
    """What the handlers share: the directions, the queue, the options, the keys and the metrics."""

    def __init__(self, directions: list[Direction], options: ServeOptions, api_keys: list[str]):
        self.directions = {d.code: d for d in directions}
        self.options, self.api_keys = options, api_keys
        self.metrics = Metrics()
        self.queue = BatchQueue(options.max_batch_tokens, options.max_wait_ms, options.max_queue_lines,
                                on_batch=lambda n, _s: self.metrics.batch.observe(n), on_depth=self.metrics.queue.set)
        self.statuses: dict[int, int] = {}  # for the summary at exit
        self.outcomes: dict[str, int] = {}  # how each request ended (``outcome``), for the summary
        self.past_grace = asyncio.Event()  # shutdown: --grace-seconds are over, answer 503 now
        self.in_flight: set[asyncio.Task] = set()  # the requests being handled (AccessLog)
        self.page = resources.files("xformer_cli.serve").joinpath("page.html").read_bytes()
        self.language_id = LanguageId.load(sorted({d.source for d in directions}))  # None without py3langid
        self.truncated = self.split_long = 0  # over the model's positions: lines cut, sentences split (summary)

    def count_text(self, truncated: int, split_long: int) -> None:
        self.truncated += truncated
        self.split_long += split_long

    def detect(self, text: str) -> tuple[str, float]:
        """(language, confidence) of ``text`` among the served source languages; a 400 naming why
        when there is none (a 400 too without the detect extra)."""
        if self.language_id is None:
            raise HttpError(400, "language detection needs py3langid on the server (pip install 'xformer-cli[detect]'): "
                            "name the source language")
        sources = ", ".join(self.language_id.languages) or "none"
        try:
            language = self.language_id.choose(text)
        except UnknownLanguage as e:
            raise HttpError(400, f"source 'auto': {e}; this server translates from: {sources}") from None
        served, _ = self.language_id.rank(text)
        return language, dict(served)[language]

    def app(self):
        """The ASGI application: the routes inside the access log; Starlette's own answers (404,
        405, 500) as JSON like every other."""
        from starlette.applications import Starlette
        from starlette.exceptions import HTTPException
        from starlette.responses import JSONResponse
        from starlette.routing import Route

        def http_error(request, e: HTTPException):
            return JSONResponse({"error": e.detail}, status_code=e.status_code, headers=e.headers)

        def internal_error(request, e: Exception):  # the cause goes to the log (AccessLog), not to the client
            return JSONResponse({"error": "internal error"}, status_code=500)

        routes = [
            Route("/", self.index, methods=["GET"]),
            Route("/translate", self.translate, methods=["POST"]),
            Route("/translate_file", self.translate_file, methods=["POST"]),
            Route("/detect", self.detect_page, methods=["POST"]),
            Route("/languages", self.languages, methods=["GET"]),
            Route("/frontend/settings", self.settings, methods=["GET"]),
            Route("/health", self.health, methods=["GET"]),
            Route("/metrics", self.metrics_page, methods=["GET"]),
        ]
        handlers = {HTTPException: http_error, Exception: internal_error}
        return AccessLog(Starlette(routes=routes, exception_handlers=handlers), self)

    def run(self, sock: socket.socket) -> None:
        """Serve on ``sock`` (listening) until SIGTERM or Ctrl-C, then shut down (the module's
        docstring): every request answered, the worker ended between batches."""
        import uvicorn

        config = uvicorn.Config(self.app(), log_config=None, log_level="warning", access_log=False, lifespan="off",
                                timeout_graceful_shutdown=self.options.grace_seconds + BACKSTOP_SECONDS)
        # uvicorn takes SIGTERM and SIGINT while it serves and raises them again once it has shut down.
        # Before (a signal on the way in) they are kept and passed on to it; after, they are the end of
        # a clean shutdown (exit 0, not the CLI's "stopped by SIGTERM"), ignored while the worker ends
        # its batch: a search is never cut short.
        early: list[int] = []
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGTERM, signal.SIGINT):
                signal.signal(signum, lambda signum, _frame: early.append(signum))
        self.queue.start()
        try:
            asyncio.run(self._serve(uvicorn.Server(config), sock, early))
        finally:
            self.queue.stop()

    async def _serve(self, uvi, sock: socket.socket, early: list[int]) -> None:
        grace = asyncio.ensure_future(self._grace(uvi))
        serving = asyncio.ensure_future(uvi.serve(sockets=[sock]))
        await asyncio.sleep(0)  # its first step has taken the signals over
        for signum in early:
            uvi.handle_exit(signum, None)
        try:
            await serving
        finally:
            # uvicorn returns once the connections are closed, or at once on a second Ctrl-C: the
            # requests left are answered (503) before the loop ends, which would cancel them
            self.past_grace.set()
            if self.in_flight:
                await asyncio.wait(set(self.in_flight), timeout=ANSWER_SECONDS)
            grace.cancel()

    async def _grace(self, uvi) -> None:
        """Once uvicorn is asked to exit: the queue drains, and after --grace-seconds (a second
        Ctrl-C: at once) the requests still unanswered get their 503."""
        while not uvi.should_exit:
            await asyncio.sleep(0.05)
        self.queue.drain()
        seconds = self.options.grace_seconds
        print(f"xf serve | shutting down | requests in flight {len(self.in_flight)} | "
              f"answered for at most {seconds:g} s (--grace-seconds)", file=sys.stderr, flush=True)
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline and not uvi.force_exit:
            await asyncio.sleep(0.05)
        self.past_grace.set()

    async def _translated(self, request, payload_of):
        """The answer of a translation request, or the JSON error response: the fields of the
        request, ``payload_of(fields, info)`` the translation's fields, the latency observed."""
        from starlette.responses import JSONResponse

        info = request.scope.setdefault("xf", {})
        arrived = time.perf_counter()
        try:
            fields = await request_fields(request, self.options.max_body_bytes, info)
            return await Translation(self, payload_of(fields, info), info).run(arrived, request.receive)
        except HttpError as e:
            info["error"] = str(e)
            return JSONResponse({"error": str(e)}, status_code=e.status, headers=e.headers)
        finally:
            self.metrics.latency.observe(time.perf_counter() - arrived)

    async def translate(self, request):
        from starlette.responses import JSONResponse

        answer = await self._translated(request, lambda fields, info: fields)
        return answer if not isinstance(answer, dict) else JSONResponse(answer)

    async def translate_file(self, request):
        """LibreTranslate's POST /translate_file: a multipart ``file`` (.txt, UTF-8) translated as one
        ``q``; the answer's ``translatedFileUrl`` is a data: URL holding the translated file (xf keeps
        no files to download later)."""
        import base64

        from starlette.responses import JSONResponse

        def payload_of(fields: dict, info: dict) -> dict:
            upload = fields.get("file")
            if not isinstance(upload, dict):
                raise HttpError(400, "send the file as the multipart field 'file' (a .txt file)")
            name = upload["filename"]
            if not name.lower().endswith(".txt"):
                raise HttpError(400, f"file {shown(name)}: only .txt files are translated")
            text = upload["data"].decode("utf-8", errors="replace")
            if upload["data"] and text.encode("utf-8") != upload["data"]:
                info["invalid_utf8_body"] = True
            return {**{k: v for k, v in fields.items() if k != "file"}, "q": text, "format": "text"}

        answer = await self._translated(request, payload_of)
        if not isinstance(answer, dict):
            return answer
        data = base64.b64encode(answer["translatedText"].encode("utf-8")).decode("ascii")
        result = {"translatedFileUrl": f"data:text/plain;charset=utf-8;base64,{data}"}
        return JSONResponse({**result, **{k: v for k, v in answer.items() if k in ("truncated", "detectedLanguage")}})

    async def detect_page(self, request):
        """LibreTranslate's POST /detect: ``[{"language": "en", "confidence": 0.97}, ...]``, the served
        source languages best first."""
        from starlette.responses import JSONResponse

        info = request.scope.setdefault("xf", {})
        try:
            fields = await request_fields(request, self.options.max_body_bytes, info)
            check_api_key(self, fields)
            q = fields.get("q")
            if not isinstance(q, str) or not q.strip():
                raise HttpError(400, "'q' is empty: send the text whose language to detect (a string)")
            if len(q) > self.options.max_chars:
                raise HttpError(413, f"{len(q):,} characters are over the limit of {self.options.max_chars:,} a request "
                                "(--max-chars)")
            if self.language_id is None:
                self.detect(q)  # the 400 that names the extra
            served, _ = self.language_id.rank(q)
        except HttpError as e:
            info["error"] = str(e)
            return JSONResponse({"error": str(e)}, status_code=e.status, headers=e.headers)
        return JSONResponse([{"language": code, "confidence": round(p, 4)} for code, p in served])

    async def languages(self, request):
        from starlette.responses import JSONResponse

        targets: dict[str, list[str]] = {}
        for d in self.directions.values():
            targets.setdefault(d.source, []).append(d.target)
        return JSONResponse([{"code": code, "name": language_name(code), "targets": sorted(t)}
                             for code, t in sorted(targets.items())])

    async def settings(self, request):
        """What a client may offer, in the shape of LibreTranslate's ``/frontend/settings`` where it
        fits (charLimit, apiKeys, keyRequired, language, suggestions, filesTranslation) and xf's own
        keys beside: lineLimit, alternativesLimit (the most ``alternatives`` a request may ask for),
        detection (whether source ``auto`` is taken), names (every served code's name), glossaries
        (the directions with a --glossary), glossaryLimit (the most pairs of a request's own) and
        formality (the directions that take a request's ``formality``: formal or informal)."""
        from starlette.responses import JSONResponse

        first = next(iter(self.directions.values()))
        codes = sorted({code for d in self.directions.values() for code in (d.source, d.target)})
        return JSONResponse({
            "charLimit": self.options.max_chars, "lineLimit": self.options.max_lines,
            "alternativesLimit": self.options.nbest - 1, "detection": bool(self.language_id and self.language_id.languages),
            "apiKeys": bool(self.api_keys), "keyRequired": bool(self.api_keys),
            "language": {"source": {"code": first.source, "name": language_name(first.source)},
                         "target": {"code": first.target, "name": language_name(first.target)}},
            "names": {code: language_name(code) for code in codes},
            "glossaries": [code for code, d in self.directions.items() if d.glossary is not None],
            "glossaryLimit": self.options.max_glossary_terms,
            "formality": [code for code, d in self.directions.items() if d.variants],
            "suggestions": False, "filesTranslation": True, "supportedFilesFormat": [".txt"],
        })

    async def health(self, request):
        from starlette.responses import JSONResponse

        return JSONResponse({"status": "ready", "directions": list(self.directions),
                             "queue_lines": self.queue.lines})

    async def metrics_page(self, request):
        from starlette.responses import Response

        body, content_type = self.metrics.render()
        return Response(body, media_type=content_type)

    async def index(self, request):
        from starlette.responses import Response

        return Response(self.page, media_type="text/html; charset=utf-8")
