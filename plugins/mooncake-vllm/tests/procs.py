"""Child processes of the tests, each in its own process group so that stopping one stops what
it started (vLLM's API server starts an engine-core process): started here, polled for
readiness (never a fixed sleep), killed by `stop` / `kill9` even when a test fails."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from tests.helpers.procs import Child

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
        self.child = Child(argv, env, log=log, cwd=Path.cwd())

    @property
    def proc(self) -> subprocess.Popen[bytes]:
        return self.child.popen

    @property
    def pid(self) -> int:
        return self.child.pid

    def alive(self) -> bool:
        return self.child.alive()

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.child.tail(1 << 20).splitlines()[-lines:])

    def wait_until(self, ready: Callable[[], bool], timeout: float) -> None:
        """Poll `ready()` until true; RuntimeError with the log's tail when the process exits
        or `timeout` seconds pass first (the process is then stopped)."""
        if poll(lambda: True if ready() else (None if self.alive() else False), timeout):
            return
        why = "exited" if not self.alive() else f"not ready after {timeout:.0f} s"
        self.stop()
        raise RuntimeError(f"{self.what} {why}; log {self.log}:\n{self.tail()}")

    def kill9(self) -> None:
        """SIGKILL to the process and everything it started; reaped."""
        self.child.kill()

    def stop(self, grace: float = 20.0) -> None:
        """SIGTERM, then SIGKILL after `grace` seconds; the whole group either way."""
        self.child.stop(grace)
