"""xf serve's access log: one line per request on stderr, and the outcome of each, counted for the
summary at exit; answers that Starlette itself would give (404, 405, an unexpected error) as
JSON like every other.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time

KNOWN_PATHS = ("/", "/translate", "/translate_file", "/detect", "/languages", "/frontend/settings", "/health",
               "/metrics")
ANSWER_SECONDS = 2.0  # after the grace period: time for the 503s to be written before the loop ends
CLIENT_GONE = 499  # nginx's "client closed request": logged, never sent (there is no one to send it to)


class AccessLog:
    """ASGI middleware: one line on stderr per request, the metrics by status and outcome, a 500
    (its one-line cause in the log, never a traceback) for anything a handler did not answer, and
    a 503 for a request still unanswered when the grace period of a shutdown is over."""

    def __init__(self, app, server):
        self.app, self.server = app, server  # serving.Server, which imports this module

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start, status = time.perf_counter(), [0]

        async def send_status(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        info = scope.setdefault("xf", {})
        handler = asyncio.ensure_future(self.app(scope, receive, send_status))
        past_grace = asyncio.ensure_future(self.server.past_grace.wait())
        self.server.in_flight.add(asyncio.current_task())
        try:
            # cancelled from outside only as a last resort (uvicorn's limit, the loop's end): answered as at the grace
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait({handler, past_grace}, return_when=asyncio.FIRST_COMPLETED)
            past_grace.cancel()
            if not handler.done():  # the shutdown's grace period is over: the handler drops its lines
                handler.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.wait({handler}, timeout=ANSWER_SECONDS)
            if handler.cancelled() or not handler.done():
                info.update(shutdown=True, error=f"shutting down: not answered within {self.server.options.grace_seconds:g} s "
                                                 "(--grace-seconds)")
                if not status[0]:
                    await json_answer(503, info["error"], scope, receive, send_status)
            elif handler.exception() is not None:  # a request must never take the server down
                e = handler.exception()
                info["error"] = f"internal error: {type(e).__name__}: {e}"
                if not status[0]:
                    await json_answer(500, "internal error", scope, receive, send_status)
        finally:
            self.server.in_flight.discard(asyncio.current_task())
        path = scope["path"]
        self.server.metrics.requests.labels(path if path in KNOWN_PATHS else "other", str(status[0])).inc()
        self.server.statuses[status[0]] = self.server.statuses.get(status[0], 0) + 1
        ended = outcome(status[0], info)
        self.server.outcomes[ended] = self.server.outcomes.get(ended, 0) + 1
        print(access_line(scope["method"], path, status[0], info, time.perf_counter() - start), file=sys.stderr, flush=True)


async def json_answer(status: int, message: str, scope, receive, send) -> None:
    from starlette.responses import JSONResponse

    with contextlib.suppress(OSError):  # the client may be gone by now
        await JSONResponse({"error": message}, status_code=status)(scope, receive, send)


OUTCOMES = ("answered", "bad request", "refused (API key)", "too large", "busy (503)", "timed out (504)",
            "503 at shutdown", "client gone", "internal error")  # the summary's order


def outcome(status: int, info: dict) -> str:
    """How a request ended, one of OUTCOMES."""
    if info.get("shutdown"):
        return "503 at shutdown"
    named = {403: "refused (API key)", 413: "too large", 503: "busy (503)", 504: "timed out (504)",
             CLIENT_GONE: "client gone"}
    if status in named:
        return named[status]
    if 200 <= status < 400:
        return "answered"
    return "bad request" if 400 <= status < 500 else "internal error"


def access_line(method: str, path: str, status: int, info: dict, seconds: float) -> str:
    """``xf serve | POST /translate 200 | direction en-de | lines 2 | ...``: one line, as xf's tables
    are one line each in a log (console.table_line)."""
    parts = [f"xf serve | {method} {path} {status}"]
    for key, name in (("direction", "direction"), ("lines", "lines"), ("sentences", "sentences"),
                      ("characters", "characters")):
        if key in info:
            parts.append(f"{name} {info[key]}")
    for key, name in (("queue_ms", "queue wait"), ("decode_ms", "decode")):
        if key in info:
            parts.append(f"{name} {info[key]:.1f} ms")
    parts.append(f"total {seconds * 1000:.1f} ms")
    for key, name in (("invalid_utf8", "invalid UTF-8 lines"), ("truncated", "truncated lines"),
                      ("split_long", "sentences split to fit")):
        if info.get(key):
            parts.append(f"{name} {info[key]}")
    if info.get("invalid_utf8_body"):
        parts.append("invalid UTF-8 in the body replaced")
    if info.get("dropped_lines"):
        parts.append(f"lines dropped undecoded {info['dropped_lines']}")
    if "error" in info:
        parts.append(f"error {' '.join(str(info['error']).split())}")
    return " | ".join(parts)
