"""Single key presses for the live view: the terminal on stdin in cbreak mode (no echo, no
Enter needed) while a `Keys` is entered, restored on leaving."""

from __future__ import annotations

import os
import select
import sys
import time
from typing import Any

from mooncake_cli.signals import StopFlag

try:
    import termios
    import tty
except ImportError:  # pragma: no cover - not on POSIX: no keys, Ctrl-C still quits
    termios = None  # type: ignore[assignment]
    tty = None  # type: ignore[assignment]

SLICE_S = 0.1  # how often a wait looks at the stop flag


class Keys:
    """`wait(seconds, stop)` returns the first key pressed within `seconds` ("" when none, or
    when `stop` is set first); without a terminal on stdin it only waits."""

    def __init__(self) -> None:
        self._fd: int | None = None
        self._saved: Any = None

    def __enter__(self) -> Keys:
        if termios is not None and sys.stdin.isatty():
            self._fd = sys.stdin.fileno()
            self._saved = termios.tcgetattr(self._fd)
            tty.setcbreak(self._fd, termios.TCSANOW)  # keeps keys typed while starting
        return self

    def __exit__(self, *_: object) -> None:
        if self._fd is not None and termios is not None:
            termios.tcsetattr(self._fd, termios.TCSADRAIN, self._saved)
            self._fd = None

    def wait(self, seconds: float, stop: StopFlag) -> str:
        end = time.monotonic() + seconds
        while not stop.wait(0) and (left := end - time.monotonic()) > 0:
            if self._fd is None:
                stop.wait(min(SLICE_S, left))
                continue
            ready, _, _ = select.select([self._fd], [], [], min(SLICE_S, left))
            if ready:
                key = os.read(self._fd, 1)
                if not key:  # the terminal went away: go on without keys
                    self._fd = None
                    continue
                return key.decode("utf-8", "replace")
        return ""
