"""The store lane's framing: a header of two u32 (body length, MAC length), the body, the MAC.
Bodies are read as they arrive: a header announcing a large body allocates nothing by itself."""

from __future__ import annotations

import os
import socket
import struct
import time
from collections.abc import Callable

from mooncake_cli.store.wire import protocol

HEADER = struct.Struct("<II")
MAGIC = b"MCS"
MAX_LANES = 256  # served lane connections (one per client process, usually)
IDLE_TIMEOUT = 120.0
IO_TIMEOUT = 10.0  # seconds a request's frames may stall
CHUNK = 1 << 20  # a body is read (and its buffer grown) this much at a time


_CPUS = len(os.sched_getaffinity(0))


def _spin_env(name: str, default: float) -> float:
    """Seconds from the microseconds in environment variable `name` (bad or absent: default);
    0 where this process may run on one CPU only (a poll there only delays its peer)."""
    if _CPUS < 2:
        return 0.0
    try:
        return max(0.0, float(os.environ.get(name, default))) / 1e6
    except ValueError:
        return default / 1e6


CLIENT_SPIN = _spin_env("MOONCAKE_STORE_SPIN_US", 250)
MASTER_SPIN = _spin_env("MOONCAKE_STORE_MASTER_SPIN_US", 100)
_PEEK = socket.MSG_PEEK | socket.MSG_DONTWAIT
try:
    _LOADAVG: int | None = os.open("/proc/loadavg", os.O_RDONLY | os.O_CLOEXEC)
except OSError:
    _LOADAVG = None


def cpu_to_spare() -> bool:
    """Whether no task waits for a CPU now: the kernel's count of runnable tasks (ours
    included) is at most the CPUs we may run on (/proc/loadavg; unknown: no)."""
    if _LOADAVG is None:
        return False
    try:
        running = os.pread(_LOADAVG, 128, 0).split(b" ")[3].split(b"/")[0]
        return int(running) <= _CPUS
    except (OSError, IndexError, ValueError):
        return False


def spin(sock: socket.socket, seconds: float,
         spare: Callable[[], bool] = cpu_to_spare) -> bool:
    """Poll `sock` without sleeping for up to `seconds` until it is readable (or closed):
    whether it is. A blocking read wakes a sleeping thread ~10 µs after the data lands here;
    polling for the answer a master gives within that time saves both wakeups. It stops once
    a task waits for a CPU (`spare()` says no): polling would then take the CPU someone's
    answer needs."""
    if seconds <= 0:
        return False
    clock = time.perf_counter
    end = clock() + seconds
    recv = sock.recv
    while spare():
        try:
            recv(1, _PEEK)
            return True
        except BlockingIOError:
            pass
        except OSError:
            return True  # the read that follows meets it
        if clock() >= end:
            break
    return False


def lane_name(address: str) -> str:
    return f"\0mooncake-store/{address}"


def recv(sock: socket.socket, n: int) -> bytes:
    """`n` bytes; the buffer grows with what arrives, never ahead of it by more than CHUNK."""
    if n <= CHUNK:
        data = sock.recv(n, socket.MSG_WAITALL) if n else b""
        if len(data) == n:
            return data
        parts, got = [data], len(data)
    else:
        parts, got = [], 0
    while got < n:
        chunk = sock.recv(min(n - got, CHUNK))
        if not chunk:
            raise ConnectionError("closed")
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


def read_frames(sock: socket.socket, idle_ok: bool = False) -> list[bytes] | None:
    """The frames of one message; None when `idle_ok` and the receive timeout passed before
    its first byte."""
    try:
        head = sock.recv(HEADER.size, socket.MSG_WAITALL)
    except BlockingIOError:
        if idle_ok:
            return None
        raise
    if len(head) < HEADER.size:
        if not head:
            raise ConnectionError("closed")
        head += recv(sock, HEADER.size - len(head))
    n, m = HEADER.unpack(head)
    if n > protocol.MAX_MESSAGE or m > 64:
        raise ConnectionError(f"a {n}-byte message is over the limit")
    body = recv(sock, n)
    return [body] if not m else [body, recv(sock, m)]


def frame(body: bytes, mac: bytes = b"") -> bytes:
    return HEADER.pack(len(body), len(mac)) + body + mac


def send_frames(sock: socket.socket, body: bytes, mac: bytes = b"") -> None:
    sock.sendall(frame(body, mac))


