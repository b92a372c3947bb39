"""The engine's wire protocol: fixed little-endian headers, HMAC challenge, exact socket I/O.

On connect the target sends HELLO = b"MCK" | version u8 | auth u8 | nonce[32]. When auth is
1 the initiator answers HMAC-SHA256(secret, nonce) and the target replies one byte (0 = ok).
Then requests flow: REQUEST header, plus `length` payload bytes for WRITE (WRITE_CAP: a
16-byte write capability, then the payload); each gets a RESPONSE header plus `length` payload
bytes (READ data, a descriptor, or a UTF-8 error of at most MAX_ERROR bytes).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import socket
import ssl
import struct
import time

VERSION = 1
HELLO = struct.Struct("<3sBB32s")
REQUEST = struct.Struct("<BBHIQQ")  # op, flags, reserved, request id, offset, length
RESPONSE = struct.Struct("<BBHIQ")  # status, 0, reserved, request id, payload length

OP_DESCRIBE, OP_READ, OP_WRITE, OP_PING, OP_WRITE_CAP = 1, 2, 3, 4, 5
OPS = {OP_DESCRIBE, OP_READ, OP_WRITE, OP_PING, OP_WRITE_CAP}
CAP_BYTES = 16

OK, E_BOUNDS, E_BADOP, E_AUTH, E_TOOBIG, E_INTERNAL = 0, 1, 2, 3, 4, 5
MAX_REQUEST = 1 << 40  # a longer request is malformed: the connection is closed
MAX_ERROR = 64 << 10  # an error message; a longer one is a broken peer
MAX_DESCRIPTOR = 64 << 20  # a DESCRIBE answer


class PeerClosed(ConnectionError):
    """The peer closed the connection in the middle of a frame."""


def recv_into_exact(sock: socket.socket, view: memoryview) -> None:
    """Fill `view` from `sock`, straight into its memory."""
    got, n = 0, len(view)
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise PeerClosed(f"peer closed the connection after {got} of {n} bytes")
        got += k


SPIN = float(os.environ.get("MOONCAKE_SPIN_US", "50")) * 1e-6


def recv_spin(sock: socket.socket, view: memoryview, spin: float = SPIN) -> None:
    """`recv_into_exact`, polling without sleeping for up to `spin` seconds first: a reply
    that comes within that time is taken without a wake-up (a cross-CPU wake-up costs 10-20
    us on a small VM). `sock` must be in blocking mode (timeouts from SO_RCVTIMEO)."""
    if spin > 0:
        clock, end = time.perf_counter, time.perf_counter() + spin
        while True:
            try:
                k = sock.recv_into(view, len(view), socket.MSG_DONTWAIT)
            except BlockingIOError:
                if clock() > end:
                    break
                continue
            if k == 0:
                raise PeerClosed("peer closed the connection")
            if k == len(view):
                return
            view = view[k:]
            break
    recv_into_exact(sock, view)


def recv_request(sock: socket.socket, view: memoryview, spin: float = SPIN) -> bool:
    """`recv_spin` for a request header, but False (nothing read) when the socket's receive
    timeout passes before its first byte: the connection is idle, not broken."""
    if isinstance(sock, ssl.SSLSocket):  # no MSG_DONTWAIT through TLS
        try:
            k = sock.recv_into(view, len(view))
        except (BlockingIOError, ssl.SSLWantReadError):
            return False
        if k == 0:
            raise PeerClosed("peer closed the connection")
        if k < len(view):
            recv_into_exact(sock, view[k:])
        return True
    clock, end = time.perf_counter, time.perf_counter() + spin
    while True:
        try:
            k = sock.recv_into(view, len(view), socket.MSG_DONTWAIT)
            break
        except BlockingIOError:
            if clock() > end:
                try:
                    k = sock.recv_into(view, len(view))
                except BlockingIOError:  # SO_RCVTIMEO passed with nothing read
                    return False
                break
    if k == 0:
        raise PeerClosed("peer closed the connection")
    if k < len(view):
        recv_into_exact(sock, view[k:])
    return True


def blocking_with_timeout(sock: socket.socket, timeout: float) -> None:
    """Blocking mode, timeouts enforced by the kernel: Python's timeout mode polls before
    every recv and send (two syscalls each)."""
    sock.settimeout(None)
    tv = struct.pack("ll", int(timeout), int((timeout % 1) * 1e6))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)


def recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    recv_into_exact(sock, memoryview(buf))
    return bytes(buf)


def send_parts(sock: socket.socket, *parts: bytes | memoryview) -> None:
    """Send every part in order with as few syscalls as the kernel allows, no joining copy."""
    views = [memoryview(p).cast("B") for p in parts if len(p)]
    if isinstance(sock, ssl.SSLSocket):  # TLS has no sendmsg: one record stream per part
        for v in views:
            sock.sendall(v)
        return
    while views:
        sent = sock.sendmsg(views)
        while sent:
            if sent >= len(views[0]):
                sent -= len(views[0])
                views.pop(0)
            else:
                views[0] = views[0][sent:]
                sent = 0


def drain(sock: socket.socket, n: int, scratch: memoryview) -> None:
    """Read and discard `n` bytes (the payload of a refused WRITE) to keep the stream framed."""
    while n:
        k = min(n, len(scratch))
        recv_into_exact(sock, scratch[:k])
        n -= k


def make_nonce() -> bytes:
    return os.urandom(32)


def prove(secret: str, nonce: bytes) -> bytes:
    return hmac.new(secret.encode(), nonce, hashlib.sha256).digest()


def verify(secret: str, nonce: bytes, proof: bytes) -> bool:
    return hmac.compare_digest(prove(secret, nonce), proof)


def tune(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        try:
            sock.setsockopt(socket.SOL_SOCKET, opt, 4 << 20)
        except OSError:
            pass
