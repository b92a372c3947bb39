"""Reading a child process's ready output, the one way the tests do it: from the pipe, one byte
at a time (nothing is read past what was asked for, so later reads see the rest), under a
deadline, so a child that never gets ready fails the test instead of hanging it."""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

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


def kill(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL `proc` (if it runs), reap it and remove the shm buffers it left."""
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    remove_shm_of(proc.pid)


def stop(proc: subprocess.Popen[bytes], timeout: float = 10.0, term: bool = True) -> int | None:
    """Close `proc`'s stdin (and with `term` send SIGTERM), wait up to `timeout` seconds for
    its exit code; past that it is killed (`kill`) and None returned. Either way the shm
    buffers it left are removed."""
    if proc.poll() is None:
        if proc.stdin is not None:
            proc.stdin.close()
        if term:
            proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        kill(proc)
        return None
    finally:
        if proc.stdout is not None:
            proc.stdout.close()
        if proc.poll() is not None:  # what a child that failed to clean up left
            remove_shm_of(proc.pid)
