"""The store lane's framing: a header of two u32 (body length, MAC length), the body, the MAC.
Bodies are read as they arrive: a header announcing a large body allocates nothing by itself."""

from __future__ import annotations

import socket
import struct

from mooncake_cli.store.wire import protocol

HEADER = struct.Struct("<II")
MAGIC = b"MCS"
MAX_LANES = 256  # served lane connections (one per client process, usually)
IDLE_TIMEOUT = 120.0
IO_TIMEOUT = 10.0  # seconds a request's frames may stall
CHUNK = 1 << 20  # a body is read (and its buffer grown) this much at a time


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


