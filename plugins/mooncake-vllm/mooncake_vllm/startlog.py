"""vLLM's own output, kept in one log file per worker, and the one line that says why its engine
did not start.

vLLM logs to stdout, and its engine-core and worker processes print tracebacks to the stderr
they inherit: in a `mooncake` role that would mix vLLM's lines (and, on failure, tracebacks)
into the role's own output, JSON events included. So the engine starts with this process's
stdout and stderr pointed at the log (`captured`: the engine's processes keep the log as theirs),
and this process's `vllm` logger writes there too (`to_file`). When the start fails, `cause`
reads the log for the first exception vLLM reported: the root cause (a worker's error comes
before the engine core's "initialization failed").
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import re
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

# "(EngineCore pid=1) ERROR 12-07 11:56:08 [core.py:1510] " before each line vLLM logs
PREFIX = re.compile(r"^(?:\([^)]*\) )?(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) [\d-]+ [\d:.]+ "
                    r"\[[^\]]*\] ")
EXCEPTION = re.compile(r"^((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt))"
                       r"(?:: (.*))?$")
# the wrappers around a root cause: the cause is the first exception line that is not one
WRAPPERS = ("Engine core initialization failed", "EngineCore encountered an issue",
            "please check the stack trace above")
_fds = threading.Lock()  # one engine start at a time redirects this process's stdout/stderr


def new_log(name: str) -> Path:
    """A fresh log file for worker `name` in the temporary folder."""
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", name)
    fd, path = tempfile.mkstemp(prefix=f"mooncake-vllm-{safe}-", suffix=".log")
    os.close(fd)
    return Path(path)


@contextlib.contextmanager
def captured(log: Path) -> Iterator[None]:
    """This process's stdout and stderr (the file descriptors) appended to `log` meanwhile: the
    processes vLLM starts inherit them."""
    with _fds:
        sys.stdout.flush()
        sys.stderr.flush()
        saved = [os.dup(1), os.dup(2)]
        fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for f in (fd, *saved):
                os.close(f)


def to_file(log: Path) -> None:
    """This process's `vllm` logger writes to `log` instead of stdout (the first worker's log
    keeps the lines of every vLLM engine in the process: the logger is one per process)."""
    logger = logging.getLogger("vllm")
    if any(isinstance(h, logging.FileHandler) for h in logger.handlers):
        return
    streams = [h for h in logger.handlers if isinstance(h, logging.StreamHandler)]
    handler = logging.FileHandler(log, encoding="utf-8")
    if streams and streams[0].formatter is not None:
        handler.setFormatter(streams[0].formatter)
    for h in streams:
        logger.removeHandler(h)
    logger.addHandler(handler)
    logger.propagate = False


_quiet: list[Path] = []


def quiet_exit(log: Path) -> None:
    """What vLLM's libraries print while this process exits (triton's nanobind reports the
    objects it leaked, on stderr) goes to `log` too: registered once, after vLLM's own exit
    handlers, so it runs before them and before the interpreter's teardown."""
    if _quiet:
        return
    _quiet.append(log)

    def redirect() -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        fd = os.open(_quiet[0], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)

    atexit.register(redirect)


def cause(log: Path, error: BaseException) -> str:
    """The first exception vLLM's processes reported in `log`, as one line ("ValueError: ..."),
    else `error`'s own message."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        text = ""
    for raw in text.splitlines():
        line = PREFIX.sub("", raw).strip()
        m = EXCEPTION.match(line)
        if m is None or any(w in line for w in WRAPPERS):
            continue
        return line if m.group(2) is not None else m.group(1)
    return one_line(error)


def one_line(error: BaseException) -> str:
    text = " ".join(str(error).split()) or type(error).__name__
    return text if len(text) <= 400 else text[:397] + "..."
