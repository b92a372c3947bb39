"""The record every benchmark row produces, and the helpers that time loops and talk to the
child processes that run the other side of a measurement.

Kept free of engine imports: the upstream and baseline child processes import only this.
"""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import IO, Any

from mooncake_cli.interfaces import TransferError

# progress(elapsed_seconds, total_seconds, label): called a few times a second while measuring
Progress = Callable[[float, float, str], None]
READY = "MOONCAKE-BENCH "  # prefix of the one JSON line a helper child prints when ready/done


@dataclass(frozen=True)
class Result:
    """One row: what ran (name: ours, upstream, socket, memcpy) and what it measured."""

    name: str
    transport: str
    op: str
    block_size: int
    batch_size: int
    threads: int
    bytes: int
    transfers: int
    seconds: float
    gbps: float  # 10^9 bytes per second
    transfers_per_s: float
    p50_us: float | None  # per-batch submit-to-complete latency (per block for references)
    p99_us: float | None
    verified: bool | None = None  # a block written and read back matched (None: not checked)
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarize(name: str, transport: str, op: str, block: int, batch: int, threads: int,
              nbytes: int, transfers: int, seconds: float, latencies: Sequence[float],
              verified: bool | None = None, note: str = "") -> Result:
    """A Result from totals and per-batch latencies in seconds."""
    lat = sorted(latencies)

    def pct(q: float) -> float | None:
        if not lat:
            return None
        return round(lat[min(len(lat) - 1, int(q * (len(lat) - 1) + 0.5))] * 1e6, 2)

    seconds = max(seconds, 1e-9)
    return Result(name, transport, op, block, batch, threads, nbytes, transfers,
                  round(seconds, 4), round(nbytes / seconds / 1e9, 4),
                  round(transfers / seconds, 1), pct(0.50), pct(0.99), verified, note)


def timed_loop(call: Callable[[int], None], duration: float, iterations: int, label: str,
               progress: Progress | None,
               between: Callable[[int], None] | None = None) -> tuple[list[float], float]:
    """Call `call(i)` until `duration` timed seconds or `iterations` calls, running the untimed
    `between(i)` first; the per-call latencies and the timed seconds."""
    clock = time.perf_counter
    lats: list[float] = []
    shown = clock()
    timed = 0.0
    i = 0
    while i < iterations and timed < duration:
        if between is not None:
            between(i)
        start = clock()
        call(i)
        end = clock()
        lats.append(end - start)
        timed += end - start
        i += 1
        if progress is not None and end - shown > 0.1:
            progress(min(timed, duration), duration, label)
            shown = end
    if progress is not None:
        progress(duration, duration, label)
    return lats, timed


def pump(stop: Callable[[], bool], duration: float, label: str,
         progress: Progress | None, tick: float = 0.1) -> None:
    """Report progress until `stop()` is true, sleeping `tick` between checks."""
    t0 = time.perf_counter()
    while not stop():
        if progress is not None:
            progress(min(time.perf_counter() - t0, duration), duration, label)
        time.sleep(tick)
    if progress is not None:
        progress(duration, duration, label)


def await_line(read: Callable[[], dict[str, Any]], duration: float, label: str,
               progress: Progress | None) -> dict[str, Any]:
    """`read()` (a child's next report line) on a thread while progress is pumped for
    `duration` seconds; its result, or its exception raised here."""
    box: list[dict[str, Any]] = []
    errs: list[BaseException] = []

    def wait() -> None:
        try:
            box.append(read())
        except BaseException as e:
            errs.append(e)

    th = threading.Thread(target=wait, daemon=True)
    th.start()
    pump(lambda: not th.is_alive(), duration, label, progress)
    if errs:
        raise errs[0]
    return box[0]


def emit(data: dict[str, Any]) -> None:
    """Print the one line a helper child reports with (see `Child.line`)."""
    sys.stdout.write(READY + json.dumps(data) + "\n")
    sys.stdout.flush()


def _die_with_parent() -> None:
    """In the child before exec: get SIGTERM when the parent dies, so a killed benchmark
    leaves no target behind (Linux; elsewhere children are only ended by `Child.close`)."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes
            import signal

            ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass


class Child:
    """A helper process whose stdout carries `READY {json}` lines and whose stderr goes to a
    temporary file (quoted when it fails). Terminated on close."""

    def __init__(self, argv: list[str], what: str, env: dict[str, str] | None = None) -> None:
        self.what = what
        self._err: IO[bytes] = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=self._err, env={**os.environ, **(env or {})},
                                     preexec_fn=_die_with_parent)
        assert self.proc.stdout is not None
        self._sel = selectors.DefaultSelector()
        self._sel.register(self.proc.stdout, selectors.EVENT_READ)
        self._buf = b""

    def stderr_tail(self, n: int = 600) -> str:
        self._err.seek(0)
        text = self._err.read().decode(errors="replace").strip()
        return text[-n:]

    def line(self, timeout: float) -> dict[str, Any]:
        """The next `READY {json}` line (or a JSON line) within `timeout` seconds."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while True:
            while b"\n" in self._buf:
                raw, self._buf = self._buf.split(b"\n", 1)
                text = raw.decode(errors="replace").strip()
                if text.startswith(READY):
                    text = text[len(READY):]
                if text.startswith("{"):
                    return dict(json.loads(text))
            left = deadline - time.monotonic()
            if left <= 0:
                raise TransferError(f"{self.what} gave no answer within {timeout:g} s"
                                    + self._why())
            if self._sel.select(left):
                chunk = os.read(self.proc.stdout.fileno(), 65536)
                if not chunk:
                    self.proc.wait(timeout=5)
                    raise TransferError(f"{self.what} exited with code {self.proc.returncode}"
                                        + self._why())
                self._buf += chunk

    def _why(self) -> str:
        tail = self.stderr_tail()
        return f": {tail.splitlines()[-1]}" if tail else ""

    def running(self) -> bool:
        return self.proc.poll() is None

    def close(self, grace: float = 5.0) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=grace)
        self._sel.close()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._err.close()

    def __enter__(self) -> Child:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
