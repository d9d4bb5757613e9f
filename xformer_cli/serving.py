"""xf serve's HTTP side: LibreTranslate's API over the batching queue, on Starlette (ASGI).

Endpoints (the shape LibreTranslate's clients already speak):

- ``POST /translate`` ``{"q": "text" or ["t1", "t2"], "source": "en", "target": "de",
  "format": "text", "alternatives": 2, "api_key": "..."}`` (JSON, or the same fields
  form-encoded) -> ``{"translatedText": ..., "alternatives": [...]}`` (alternatives only when
  asked for). A text of several lines is
  translated line by line, as ``xf translate`` reads a file, and its lines come back joined by LF.
- ``GET /languages`` -> ``[{"code": "en", "name": "English", "targets": ["de"]}]``
- ``GET /health`` (ready: the models are loaded), ``GET /metrics`` (Prometheus), ``GET /`` (a page).

Bad input and overload are answers with ``{"error": "..."}``: 400 (malformed JSON, wrong types,
empty q, a direction not served, format html), 403 (API key), 413 (body, lines or characters over
the limits; the body's size is checked before it is parsed), 503 with Retry-After (queue full),
504 (waited longer than --timeout). Every request is one access-log line on stderr; no
traceback reaches a response or the log.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import socket
import sys
import time
from importlib import resources
from pathlib import Path
from typing import Optional

from .errors import XfError
from .options import ServeOptions, direction_and_path
from .serve_queue import BatchQueue, Direction, Job, QueueFull
from .translation import Stats, decode_input_line, encode_lines, open_engine

# ISO 639-1 names for /languages; a code not listed is shown as itself.
LANGUAGE_NAMES = {
    "ar": "Arabic", "cs": "Czech", "de": "German", "en": "English", "es": "Spanish", "fi": "Finnish",
    "fr": "French", "hi": "Hindi", "it": "Italian", "ja": "Japanese", "ko": "Korean", "nl": "Dutch",
    "pl": "Polish", "pt": "Portuguese", "ro": "Romanian", "ru": "Russian", "tr": "Turkish", "uk": "Ukrainian",
    "zh": "Chinese",
}
KNOWN_PATHS = ("/", "/translate", "/languages", "/health", "/metrics")


class HttpError(Exception):
    """An answer other than 200: its status, its one-line message and extra headers."""

    def __init__(self, status: int, message: str, headers: Optional[dict[str, str]] = None):
        super().__init__(message)
        self.status, self.headers = status, headers or {}


# -- start-up ------------------------------------------------------------------------------------
def load_directions(options: ServeOptions) -> list[Direction]:
    """One engine per --model, each loaded once (errors name the --model value)."""
    directions = []
    for spec in options.model:
        source, target, path = direction_and_path(spec)
        if not Path(path).exists():
            raise XfError(f"--model {spec}: {path} does not exist")
        translate_options = options.translate_options(path)
        engine, sp, _device = open_engine(translate_options)
        directions.append(Direction(source, target, engine, sp, translate_options))
    return directions


def read_api_keys(path: Optional[str]) -> list[str]:
    """The keys of --api-keys FILE (one a line; blank lines and '#' comments skipped), or [] without it."""
    if path is None:
        return []
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise XfError(f"--api-keys {path}: file not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise XfError(f"--api-keys {path}: cannot read it: {e}") from None
    keys = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    if not keys:
        raise XfError(f"--api-keys {path}: holds no key (one key a line)")
    return keys


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (port 0: a free one); a one-line error when it is taken."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as e:
        raise XfError(f"--host {host} --port {port}: cannot listen there: {e.strerror or e}") from None
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


# -- requests ------------------------------------------------------------------------------------
async def read_body(request, limit: int) -> bytes:
    """The request body, refused (413) as soon as it is known to be over ``limit`` bytes."""
    length = request.headers.get("content-length")
    if length is not None:
        if not length.strip().isdigit():
            raise HttpError(400, f"Content-Length {length!r} is not a number")
        if int(length) > limit:
            raise HttpError(413, f"request body of {int(length):,} bytes is over the limit of {limit:,} (--max-body-bytes)")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise HttpError(413, f"request body is over the limit of {limit:,} bytes (--max-body-bytes)")
        chunks.append(chunk)
    return b"".join(chunks)


def text_lines(text: str, stats: Stats) -> list[str]:
    """A text's lines as ``xf translate`` reads a file's: split at LF, a CR before it dropped,
    invalid UTF-8 (and lone surrogates) replaced by U+FFFD and counted."""
    raw = text.encode("utf-8", "surrogatepass")  # a lone surrogate becomes invalid UTF-8, then U+FFFD
    return [decode_input_line(line, i + 1, stats, "request") for i, line in enumerate(raw.split(b"\n"))]


def form_fields(text: str) -> dict:
    """A form-encoded body as LibreTranslate reads one: a repeated q is a list, alternatives a number."""
    from urllib.parse import parse_qs

    fields = {k: v if k == "q" and len(v) > 1 else v[0] for k, v in parse_qs(text, keep_blank_values=True).items()}
    if isinstance(fields.get("alternatives"), str) and fields["alternatives"].isdigit():
        fields["alternatives"] = int(fields["alternatives"])
    return fields


class Translation:
    """One POST /translate: its checked fields (``parse``), then its lines translated (``run``)."""

    def __init__(self, server: "Server", payload, info: dict):
        self.server, self.info = server, info
        if not isinstance(payload, dict):
            raise HttpError(400, "the body must be a JSON object with q, source and target")
        if server.api_keys:
            key = payload.get("api_key")
            if not isinstance(key, str) or not any(hmac.compare_digest(key.encode(), k.encode()) for k in server.api_keys):
                raise HttpError(403, "Invalid API key" if key else "an API key is needed: send it as 'api_key'")
        q = payload.get("q")
        self.as_list = isinstance(q, list)
        texts = q if self.as_list else [q]
        if q is None or q == "" or q == []:
            raise HttpError(400, "'q' is empty: send the text to translate (a string or a list of strings)")
        if not all(isinstance(t, str) for t in texts):
            raise HttpError(400, "'q' must be a string or a list of strings")
        self.direction = self._direction(payload.get("source"), payload.get("target"))
        info["direction"] = self.direction.code
        fmt = payload.get("format", "text")
        if fmt == "html":
            raise HttpError(400, "format 'html' is not supported yet: send plain text with format 'text'")
        if fmt != "text":
            raise HttpError(400, f"'format' must be 'text', got {json.dumps(fmt)}")
        alternatives = payload.get("alternatives", 0)
        most = self.direction.options.nbest - 1
        if not isinstance(alternatives, int) or isinstance(alternatives, bool) or alternatives < 0:
            raise HttpError(400, f"'alternatives' must be a number from 0 to {most}, got {json.dumps(alternatives)}")
        if alternatives > most:
            raise HttpError(400, f"'alternatives' {alternatives}: this server gives at most {most} "
                            f"(it runs with --nbest {most + 1})")
        self.alternatives = alternatives
        self.stats = Stats()
        self.lines = [text_lines(t, self.stats) for t in texts]  # per text, its lines
        count, chars = sum(map(len, self.lines)), sum(map(len, texts))
        info.update(lines=count, characters=chars)
        options = server.options
        if count > options.max_lines:
            raise HttpError(413, f"{count} lines are over the limit of {options.max_lines} a request (--max-lines)")
        if chars > options.max_chars:
            raise HttpError(413, f"{chars:,} characters are over the limit of {options.max_chars:,} a request (--max-chars)")

    def _direction(self, source, target) -> Direction:
        served = ", ".join(self.server.directions)
        if not isinstance(source, str) or not isinstance(target, str):
            raise HttpError(400, f"'source' and 'target' must be language codes; served: {served}")
        if source == "auto":
            raise HttpError(400, f"source 'auto' (language detection) is not supported; served: {served}")
        direction = self.server.directions.get(f"{source}-{target}")
        if direction is None:
            raise HttpError(400, f"{source}-{target} is not served; served: {served}")
        return direction

    async def run(self, arrived: float) -> dict:
        flat = [line for lines in self.lines for line in lines]
        pieces = encode_lines(self.direction.sp, flat, self.direction.engine.max_source, self.stats)
        job = Job(self.direction, pieces)
        try:
            self.server.queue.submit(job)
        except QueueFull as e:
            raise HttpError(503, f"busy: {e}", {"Retry-After": str(e.retry_after)}) from None
        timeout = self.server.options.timeout
        try:
            found = await asyncio.wait_for(asyncio.wrap_future(job.future), timeout - (time.perf_counter() - arrived))
        except asyncio.TimeoutError:
            job.future.cancel()  # not decoded if its batch has not started
            raise HttpError(504, f"no translation within {timeout:g} s (--timeout)") from None
        finally:
            self.info.update(queue_ms=job.queue_wait * 1000, decode_ms=job.decode_time * 1000)
        self.server.metrics.lines.labels(self.direction.code).inc(len(flat))
        return self._answer(found)

    def _answer(self, found: list[list[str]]) -> dict:
        per_text, at = [], 0
        for lines in self.lines:
            per_text.append(found[at:at + len(lines)])
            at += len(lines)

        def text(hyps_per_line, k):  # the k-th hypothesis of each line (its last where it has fewer)
            return "\n".join(hyps[min(k, len(hyps) - 1)] for hyps in hyps_per_line)

        def alternatives(hyps_per_line):
            most = max(len(hyps) for hyps in hyps_per_line) - 1
            return [text(hyps_per_line, k) for k in range(1, 1 + min(self.alternatives, most))]

        translated = [text(t, 0) for t in per_text]
        answer: dict = {"translatedText": translated if self.as_list else translated[0]}
        if self.alternatives:
            alts = [alternatives(t) for t in per_text]
            answer["alternatives"] = alts if self.as_list else alts[0]
        if self.stats.invalid_utf8 or self.stats.truncated:
            self.info.update(invalid_utf8=self.stats.invalid_utf8, truncated=self.stats.truncated)
        return answer


class Server:
    """What the handlers share: the directions, the queue, the options, the keys and the metrics."""

    def __init__(self, directions: list[Direction], options: ServeOptions, api_keys: list[str]):
        self.directions = {d.code: d for d in directions}
        self.options, self.api_keys = options, api_keys
        self.metrics = Metrics()
        self.queue = BatchQueue(options.max_batch_tokens, options.max_wait_ms, options.max_queue_lines,
                                on_batch=lambda n, _s: self.metrics.batch.observe(n), on_depth=self.metrics.queue.set)
        self.statuses: dict[int, int] = {}  # for the summary at exit
        self.page = resources.files("xformer_cli").joinpath("serve_page.html").read_bytes()

    def app(self):
        """The ASGI application: the routes inside the access log."""
        from starlette.applications import Starlette
        from starlette.routing import Route

        routes = [
            Route("/", self.index, methods=["GET"]),
            Route("/translate", self.translate, methods=["POST"]),
            Route("/languages", self.languages, methods=["GET"]),
            Route("/health", self.health, methods=["GET"]),
            Route("/metrics", self.metrics_page, methods=["GET"]),
        ]
        return AccessLog(Starlette(routes=routes), self)

    async def translate(self, request):
        from starlette.responses import JSONResponse

        info = request.scope.setdefault("xf", {})
        arrived = time.perf_counter()
        try:
            body = await read_body(request, self.options.max_body_bytes)
            try:
                text = body.decode("utf-8")
            except UnicodeDecodeError:  # as xf translate reads a line: the bad bytes become U+FFFD
                text = body.decode("utf-8", errors="replace")
                info["invalid_utf8_body"] = True
            if request.headers.get("content-type", "").startswith("application/x-www-form-urlencoded"):
                payload = form_fields(text)
            else:
                try:
                    payload = json.loads(text)
                except json.JSONDecodeError as e:
                    raise HttpError(400, f"the body is not JSON: {e.msg} (line {e.lineno}, column {e.colno})") from None
            answer = await Translation(self, payload, info).run(arrived)
        except HttpError as e:
            info["error"] = str(e)
            return JSONResponse({"error": str(e)}, status_code=e.status, headers=e.headers)
        finally:
            self.metrics.latency.observe(time.perf_counter() - arrived)
        return JSONResponse(answer)

    async def languages(self, request):
        from starlette.responses import JSONResponse

        targets: dict[str, list[str]] = {}
        for d in self.directions.values():
            targets.setdefault(d.source, []).append(d.target)
        return JSONResponse([{"code": code, "name": LANGUAGE_NAMES.get(code, code), "targets": sorted(t)}
                             for code, t in sorted(targets.items())])

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


class AccessLog:
    """ASGI middleware: one line on stderr per request, the metrics by status, and a 500 (its
    one-line cause in the log, never a traceback) for anything a handler did not answer."""

    def __init__(self, app, server: Server):
        self.app, self.server = app, server

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start, status = time.perf_counter(), [0]

        async def send_status(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        info = scope.setdefault("xf", {})
        try:
            await self.app(scope, receive, send_status)
        except Exception as e:  # noqa: BLE001 - a request must never take the server down
            info["error"] = f"internal error: {type(e).__name__}: {e}"
            if not status[0]:
                from starlette.responses import JSONResponse

                await JSONResponse({"error": "internal error"}, status_code=500)(scope, receive, send_status)
        path = scope["path"]
        self.server.metrics.requests.labels(path if path in KNOWN_PATHS else "other", str(status[0])).inc()
        self.server.statuses[status[0]] = self.server.statuses.get(status[0], 0) + 1
        print(access_line(scope["method"], path, status[0], info, time.perf_counter() - start), file=sys.stderr, flush=True)


def access_line(method: str, path: str, status: int, info: dict, seconds: float) -> str:
    """``xf serve | POST /translate 200 | direction en-de | lines 2 | ...``: one line, as xf's tables
    are one line each in a log (console.table_line)."""
    parts = [f"xf serve | {method} {path} {status}"]
    for key, name in (("direction", "direction"), ("lines", "lines"), ("characters", "characters")):
        if key in info:
            parts.append(f"{name} {info[key]}")
    for key, name in (("queue_ms", "queue wait"), ("decode_ms", "decode")):
        if key in info:
            parts.append(f"{name} {info[key]:.1f} ms")
    parts.append(f"total {seconds * 1000:.1f} ms")
    for key, name in (("invalid_utf8", "invalid UTF-8 lines"), ("truncated", "truncated lines")):
        if info.get(key):
            parts.append(f"{name} {info[key]}")
    if info.get("invalid_utf8_body"):
        parts.append("invalid UTF-8 in the body replaced")
    if "error" in info:
        parts.append(f"error {' '.join(str(info['error']).split())}")
    return " | ".join(parts)
