"""xf serve: the models of --model as a translation service, LibreTranslate's API over HTTP.

Thin: the models are loaded once (``serving.load_directions``), the socket is bound, and uvicorn
runs the application of ``serving.Server`` until SIGTERM or Ctrl-C; then it stops accepting,
finishes the requests in flight (at most --grace-seconds) and prints a summary table.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time

from ..console import print_summary, stderr_console
from ..errors import XfError
from ..options import ServeOptions
from ..serving import Server, bind, load_directions, read_api_keys


def serve(options: ServeOptions) -> None:
    """Serve until SIGTERM (exit 0 after the drain) or Ctrl-C."""
    try:
        import prometheus_client  # noqa: F401 - the three of the serve extra, checked before the models load
        import starlette  # noqa: F401
        import uvicorn
    except ImportError:
        raise XfError("xf serve needs starlette, uvicorn and prometheus_client: pip install 'xformer-cli[serve]'") from None

    api_keys = read_api_keys(options.api_keys)
    console = stderr_console()
    with console.status("loading the models", spinner="dots") if console.is_terminal else contextlib.nullcontext():
        directions = load_directions(options)
    server = Server(directions, options, api_keys)
    sock = bind(options.host, options.port)
    host, port = sock.getsockname()[:2]
    config = uvicorn.Config(server.app(), log_config=None, log_level="warning", access_log=False,
                            timeout_graceful_shutdown=options.grace_seconds, lifespan="off")
    uvi = uvicorn.Server(config)
    server.queue.start()
    shown = f"[{host}]" if ":" in host else host
    print(f"xf serve | listening on http://{shown}:{port} | directions {', '.join(server.directions)} | "
          f"engine {options.engine} | api keys {'on' if api_keys else 'off'}", file=sys.stderr, flush=True)
    start = time.perf_counter()
    # uvicorn takes SIGTERM and SIGINT while it runs and raises them again when it has drained;
    # a SIGTERM then is the end of a clean drain (exit 0), not the CLI's "stopped by SIGTERM".
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: None)
    try:
        uvi.run(sockets=[sock])
    finally:
        # the requests in flight are answered (or given up at --grace-seconds): the worker is idle or, after
        # a given-up batch, a daemon thread that ends with the process
        server.queue.stop(timeout=min(options.grace_seconds, 1.0))
    _summary(console, server, time.perf_counter() - start)


def _summary(console, server: Server, elapsed: float) -> None:
    queue = server.queue
    print_summary(console, f"xf serve ({', '.join(server.directions)})", [
        ("requests by status", ", ".join(f"{status}: {n:,}" for status, n in sorted(server.statuses.items())) or "none"),
        ("lines translated", f"{queue.lines_done:,}"),
        ("batches / sentences a batch", f"{queue.batches:,} / {queue.sentences / max(queue.batches, 1):.1f}"),
        ("source / target subwords", f"{queue.stats.src_tokens:,} / {queue.stats.tgt_tokens:,}"),
        ("time served", f"{elapsed:.1f} s"),
    ], values="right")
