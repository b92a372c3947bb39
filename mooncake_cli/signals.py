"""Stopping a server on Ctrl-C or SIGTERM without a lock in the signal handler.

    with stop_signals() as stop:        # armed before the server says it is ready
        serve()
        while not stop.wait(3600): ...
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager


class StopFlag:
    """Set by Ctrl-C or SIGTERM (or by `set`). Python runs a signal handler in the main thread
    between two bytecodes, possibly while that thread holds a lock (threading.Event.set and
    wait take one: two signals at once deadlocked the handler on the lock of the one it had
    interrupted), so setting this takes no lock; `wait` polls it instead."""

    POLL_S = 0.1

    def __init__(self) -> None:
        self._set = False

    def set(self) -> None:
        self._set = True

    def wait(self, timeout: float) -> bool:
        """Whether it is set, once it is or after `timeout` seconds."""
        end = time.monotonic() + timeout
        while not self._set and (left := end - time.monotonic()) > 0:
            time.sleep(min(self.POLL_S, left))
        return self._set


@contextmanager
def stop_signals(signums: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT)
                 ) -> Iterator[StopFlag]:
    """A flag set by `signums` (Ctrl-C or SIGTERM), armed before a server announces it is
    ready, so a signal that follows the announcement at once still stops it cleanly."""
    stop = StopFlag()

    def handler(*_: object) -> None:
        stop.set()

    old = {s: signal.signal(s, handler) for s in signums}
    try:
        yield stop
    finally:
        for s, h in old.items():
            signal.signal(s, h)
