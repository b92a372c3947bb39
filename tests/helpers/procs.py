"""Child processes of the tests, started and read the one way the tests do it.

`Child` starts a command in a process group of its own with a clean environment, reads its
ready output and stops it (the group: what it started goes with it). Ready output is read from
the pipe one byte at a time (nothing is read past what was asked for, so later reads see the
rest), under a deadline, so a child that never gets ready fails the test instead of hanging it.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import pytest

REPO = Path(__file__).resolve().parent.parent.parent
READY_TIMEOUT = 30.0  # seconds a child gets to print its ready line (2 slow cores, cold caches)


def line_done(out: bytes) -> bool:
    return out.endswith(b"\n")


def read_until(proc: subprocess.Popen[bytes], done: Callable[[bytes], bool] = line_done,
               timeout: float = READY_TIMEOUT) -> bytes:
    """What `proc` prints on stdout until `done(output)`, its stdout closes or `timeout`
    seconds pass; the caller checks `done` again to tell which."""
    assert proc.stdout is not None
    out = b""
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout
        while not done(out) and time.monotonic() < deadline:
            if sel.select(timeout=max(0.0, deadline - time.monotonic())):
                chunk = proc.stdout.read1(1)  # type: ignore[attr-defined]
                if not chunk:
                    break
                out += chunk
    return out


def read_line(proc: subprocess.Popen[bytes], timeout: float = READY_TIMEOUT) -> dict[str, Any]:
    """The next JSON line the child prints (AssertionError after `timeout` seconds)."""
    line = read_until(proc, line_done, timeout)
    assert line.endswith(b"\n"), f"no line from pid {proc.pid} in {timeout} s: {line!r}"
    return dict(json.loads(line))


def jsonl(path: str | Path) -> list[dict[str, Any]]:
    """The complete lines of a JSON-lines file that processes append to (an audit log): a
    line still being written is left for the next look."""
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.endswith("\n")]


def remove_shm_of(pid: int) -> None:
    """Unlink the /dev/shm buffers a killed child left behind (it could not clean up)."""
    try:
        names = os.listdir("/dev/shm")
    except OSError:
        return
    for name in names:
        if name.startswith(f"mooncake-{pid}-"):
            try:
                os.unlink(os.path.join("/dev/shm", name))
            except OSError:
                pass


def child_env(**extra: str) -> dict[str, str]:
    """The test's environment without any MOONCAKE_* setting that could leak in, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MOONCAKE_")}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


class Child:
    """`cmd` started at once in a process group of its own, with exactly `env` as its
    environment, in the repository. Its stdout is a pipe that `ready` reads (with `log`,
    stdout and stderr both go to that file instead); its stderr goes to a temporary file
    that failures quote and `stop` copies to the test's stderr. Its stdin is a pipe with
    `stdin`, else /dev/null."""

    def __init__(self, cmd: list[str], env: dict[str, str], *, stdin: bool = False,
                 log: Path | None = None, cwd: Path = REPO) -> None:
        self.cmd = cmd
        self.log = log
        self._err: IO[bytes] = open(log, "w+b") if log else tempfile.TemporaryFile()  # noqa: SIM115
        self.popen = subprocess.Popen(
            cmd, cwd=cwd, env=env, start_new_session=True,
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=self._err if log else subprocess.PIPE,
            stderr=subprocess.STDOUT if log else self._err)
        self.rest = b""  # what stdout still held when the child was stopped
        self._result: list[int | None] = []  # the exit code `stop` returns, once gone

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, chars: int = 3000) -> str:
        """The last `chars` characters of its stderr (its log with `log`)."""
        try:
            if self.log:
                data = self.log.read_bytes()
            else:
                fd = self._err.fileno()
                data = os.pread(fd, os.fstat(fd).st_size, 0)
        except (OSError, ValueError):  # the temporary file is closed once it is stopped
            return ""
        return data.decode(errors="replace")[-chars:]

    def ready(self, done: Callable[[bytes], bool] = line_done,
              timeout: float = READY_TIMEOUT) -> bytes:
        """What it prints on stdout until `done(output)`; when its stdout closes or `timeout`
        seconds pass first, it is stopped and the test fails quoting its output."""
        out = read_until(self.popen, done, timeout)
        if not done(out):
            self.fail(f"not ready in {timeout:g} s", out)
        return out

    def ready_line(self, event: str = "ready", timeout: float = READY_TIMEOUT) -> dict[str, Any]:
        """Its next stdout line, a JSON object whose "event" is `event` (else as `ready`)."""
        line = self.ready(line_done, timeout)
        try:
            got = dict(json.loads(line))
        except ValueError:
            got = {}
        if got.get("event") != event:
            self.fail(f"printed no {event!r} line", line)
        return got

    def fail(self, why: str, stdout: bytes = b"") -> None:
        """Stop it and fail the test with `why`, its stdout so far and its stderr's tail."""
        err = self.tail()
        self.stop(grace=5.0)
        pytest.fail(f"`{' '.join(self.cmd)}` {why} (pid {self.pid}, exit code "
                    f"{self.popen.returncode})\nstdout: {stdout!r}\nstderr: {err}")

    def stop(self, grace: float = 10.0, term: bool = True) -> int | None:
        """Close its stdin and (with `term`) SIGTERM its group, then wait up to `grace`
        seconds for its exit code; past that None is returned. Either way what is left of the
        group is then killed (`kill`). Stopping again returns the first result."""
        if not self._result:
            if self.popen.stdin is not None and not self.popen.stdin.closed:
                self.popen.stdin.close()
            if term and self.alive():
                self._signal(signal.SIGTERM)
            try:
                code: int | None = self.popen.wait(grace)
            except subprocess.TimeoutExpired:
                code = None
            self._reap()
            self._finish(code)
        return self._result[0]

    def kill(self) -> None:
        """SIGKILL to it and everything it started, reaped. Once it is gone (stopped or
        killed): the rest of its stdout is kept in `rest`, its shm buffers are removed and
        its stderr is copied to the test's (shown with a failing test, as an inherited stderr
        was)."""
        self._reap()
        self._finish(self.popen.returncode)

    def _reap(self) -> None:
        self._signal(signal.SIGKILL)
        self.popen.wait()
        remove_shm_of(self.pid)

    def _signal(self, sig: int) -> None:
        try:
            os.killpg(self.pid, sig)  # the group it leads (start_new_session)
        except ProcessLookupError:
            pass

    def _finish(self, code: int | None) -> None:
        if self._result:
            return
        self._result.append(code)
        out = self.popen.stdout
        if out is not None and not out.closed:
            self.rest = drain(out, 10.0)
            out.close()
        if not self.log:
            err = self.tail(1 << 20)
            if err:
                sys.stderr.write(err)
        self._err.close()


def drain(pipe: IO[bytes], timeout: float) -> bytes:
    """What is left to read on `pipe` until its writers are gone (or `timeout` seconds)."""
    out = b""
    with selectors.DefaultSelector() as sel:
        sel.register(pipe, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if sel.select(timeout=max(0.0, deadline - time.monotonic())):
                chunk = os.read(pipe.fileno(), 1 << 16)
                if not chunk:
                    break
                out += chunk
    return out
