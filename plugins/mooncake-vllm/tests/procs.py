"""Child processes of the tests, each in its own process group so that stopping one stops what
it started (vLLM's API server starts an engine-core process): started here, polled for
readiness (never a fixed sleep), killed by `stop` / `kill9` even when a test fails."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def port_open(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), 0.5).close()
        return True
    except OSError:
        return False


def poll(check: Callable[[], T | None], timeout: float, interval: float = 0.2) -> T | None:
    """The first result of `check()` that is not None, asked every `interval` seconds; None
    when `timeout` seconds pass first."""
    deadline = time.monotonic() + timeout
    while (got := check()) is None and time.monotonic() < deadline:
        time.sleep(interval)  # sleep: poll
    return got


class Proc:
    """`argv` started with `env`, stdout and stderr to `log` (a file, read back on failure)."""

    def __init__(self, what: str, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.what, self.log = what, log
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def tail(self, lines: int = 40) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def wait_until(self, ready: Callable[[], bool], timeout: float) -> None:
        """Poll `ready()` until true; RuntimeError with the log's tail when the process exits
        or `timeout` seconds pass first (the process is then stopped)."""
        if poll(lambda: True if ready() else (None if self.alive() else False), timeout):
            return
        why = "exited" if not self.alive() else f"not ready after {timeout:.0f} s"
        self.stop()
        raise RuntimeError(f"{self.what} {why}; log {self.log}:\n{self.tail()}")

    def _signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)  # the group this process leads (start_new_session)
        except ProcessLookupError:
            pass

    def kill9(self) -> None:
        """SIGKILL to the process and everything it started; reaped."""
        self._signal_group(signal.SIGKILL)
        self.proc.wait()

    def stop(self, grace: float = 20.0) -> None:
        """SIGTERM, then SIGKILL after `grace` seconds; the whole group either way."""
        if self.alive():
            self._signal_group(signal.SIGTERM)
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                pass
        self.kill9()
