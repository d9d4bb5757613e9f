"""Signals, in one place: how a command stops when asked to.

Every command but ``xf train`` unwinds on SIGTERM as on Ctrl-C (``sigterm_unwinds``: the
signal raises ``Terminated``), so that its ``finally`` blocks remove temporary files and stop
child processes on the way out. ``xf train`` instead finishes the update under way and saves
(``StopSignal``), so that a preempted job resumes where it stopped.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Iterator


class Terminated(BaseException):
    """SIGTERM as an exception (like KeyboardInterrupt for SIGINT), so that ``finally`` blocks run."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def sigterm_unwinds() -> Iterator[None]:
    """While the command runs, SIGTERM raises ``Terminated`` (xf train handles it itself)."""
    def handle(signum, frame):
        raise Terminated(signum)

    if threading.current_thread() is not threading.main_thread():  # e.g. under a test runner
        yield
        return
    previous = signal.signal(signal.SIGTERM, handle)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class StopSignal:
    """SIGINT and SIGTERM (cluster preemption) ask training to stop after the current update.

    A second Ctrl-C aborts at once (the last checkpoint written stays intact: writes are atomic).
    """

    def __init__(self):
        self.signum = 0
        self._previous: dict = {}

    def _handle(self, signum, frame):
        if self.signum == signal.SIGINT and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signum = self.signum or signum

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for s in (signal.SIGINT, signal.SIGTERM):
                self._previous[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc):
        for s, handler in self._previous.items():
            signal.signal(s, handler)
