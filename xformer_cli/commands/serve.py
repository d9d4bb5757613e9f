"""xf serve: the models of --model as a translation service, LibreTranslate's API over HTTP.

Thin: the --api-keys and --glossary files are read, then the socket is bound (a bad file, a port
taken or a host that does not resolve fails before any model loads), the models are loaded once
(``serve.server.load_directions``), and ``Server.run`` serves until SIGTERM or Ctrl-C; then it stops
accepting, answers the requests in flight (those still waiting after --grace-seconds get a 503),
ends the worker between batches, and a summary table counts every request by how it ended.
Exit 0 after SIGTERM or Ctrl-C.
"""

from __future__ import annotations

import contextlib
import sys
import time

from ..base.console import print_summary, stderr_console
from ..base.errors import XfError
from ..serve.access_log import OUTCOMES
from ..serve.server import Server, bind, read_api_keys
from ..serve.directions import load_directions, load_glossaries
from ..settings.options import ServeOptions


def serve(options: ServeOptions) -> None:
    """Serve until SIGTERM or Ctrl-C (exit 0 after the shutdown)."""
    try:
        import prometheus_client  # noqa: F401 - the three of the serve extra, checked before the models load
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise XfError("xf serve needs starlette, uvicorn and prometheus_client: pip install 'xformer-cli[serve]'") from None
    if options.split_sentences:
        try:
            import sentencex  # noqa: F401
        except ImportError:
            raise XfError("xf serve splits texts into sentences with sentencex: pip install 'xformer-cli[serve]' "
                          "(or --no-split-sentences)") from None

    api_keys = read_api_keys(options.api_keys)
    glossaries = load_glossaries(options)  # a bad file fails before the port is bound
    sock = bind(options.host, options.port)
    console = stderr_console()
    with contextlib.closing(sock):
        with console.status("loading the models", spinner="dots") if console.is_terminal else contextlib.nullcontext():
            directions = load_directions(options, glossaries)
        server = Server(directions, options, api_keys)
        sock.listen(2048)
        host, port = sock.getsockname()[:2]
        shown = f"[{host}]" if ":" in host else host
        print(f"xf serve | listening on http://{shown}:{port} | directions {', '.join(server.directions)} | "
              f"engine {options.engine} | api keys {'on' if api_keys else 'off'} | "
              f"sentence splitting {'on' if options.split_sentences else 'off'} | "
              f"glossaries {', '.join(glossaries) or 'none'} | "
              f"language detection {'on' if server.language_id else 'off (no py3langid)'}", file=sys.stderr, flush=True)
        start = time.perf_counter()
        server.run(sock)
    _summary(console, server, time.perf_counter() - start)


def _summary(console, server: Server, elapsed: float) -> None:
    queue, outcomes = server.queue, server.outcomes
    ended = [f"{name}: {outcomes[name]:,}" for name in OUTCOMES if outcomes.get(name)]
    print_summary(console, f"xf serve ({', '.join(server.directions)})", [
        ("requests", f"{sum(outcomes.values()):,}"),
        ("how they ended", ", ".join(ended) or "none"),
        ("requests by status", ", ".join(f"{status}: {n:,}" for status, n in sorted(server.statuses.items())) or "none"),
        ("lines decoded", f"{queue.lines_done:,}"),
        ("lines dropped undecoded", f"{queue.lines_dropped:,}"),
        ("over the model's positions: sentences split / lines truncated", f"{server.split_long:,} / {server.truncated:,}"),
        ("batches / sentences a batch", f"{queue.batches:,} / {queue.sentences / max(queue.batches, 1):.1f}"),
        ("source / target subwords", f"{queue.stats.src_tokens:,} / {queue.stats.tgt_tokens:,}"),
        ("time served", f"{elapsed:.1f} s"),
    ], values="right")
