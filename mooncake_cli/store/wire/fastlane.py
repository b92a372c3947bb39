"""The master's same-host fast lane: the zmq protocol's frames over a Unix stream socket.

A zmq round trip crosses two I/O threads per side (~70 µs here); a Unix socket round trip is a
few µs, which is what small gets and exists are made of. A master serving HOST:PORT also listens
on the abstract Unix socket `@mooncake-store/HOST:PORT`; a client asking HOST:PORT tries that
name first, so it only ever reaches the master the address names (on the same host and network
namespace: the name exists only where that master runs) and falls back to zmq otherwise.

Framing, both ways: a header of two u32 (body length, MAC length), the body, the MAC (the
HMAC-SHA256 of the body when the master has a secret, as on zmq). Requests are served one at a
time per connection by `handle` (MasterService.handle: it never raises).
"""

from __future__ import annotations

import logging
import socket
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

from mooncake_cli.store.errors import RpcFailed, StoreError
from mooncake_cli.store.ha.leader import NOT_LEADER
from mooncake_cli.store.wire import protocol
from mooncake_cli.store.wire.rpc import decode_signed

log = logging.getLogger("mooncake.store")
HEADER = struct.Struct("<II")


def lane_name(address: str) -> str:
    return f"\0mooncake-store/{address}"


def _recv(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            raise ConnectionError("closed")
        got += k
    return bytes(buf)


def _read(sock: socket.socket) -> list[bytes]:
    head = sock.recv(HEADER.size, socket.MSG_WAITALL)
    if len(head) != HEADER.size:
        raise ConnectionError("closed")
    n, m = HEADER.unpack(head)
    if n > protocol.MAX_MESSAGE or m > 64:
        raise ConnectionError(f"a {n}-byte message is over the limit")
    body = sock.recv(n, socket.MSG_WAITALL) if n else b""
    if len(body) != n:
        body += _recv(sock, n - len(body))
    return [body] if not m else [body, _recv(sock, m)]


def _send(sock: socket.socket, body: bytes, mac: bytes = b"") -> None:
    sock.sendall(HEADER.pack(len(body), len(mac)) + body + mac)


class LaneServer:
    """Serves `handle(frames) -> reply body` on the lane of `address` (signed with `secret`)."""

    def __init__(self, address: str, handle: Callable[[list[bytes]], bytes],
                 secret: bytes | None) -> None:
        self._handle, self._secret = handle, secret
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(lane_name(address))
        self._sock.listen(64)
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._acceptor = threading.Thread(target=self._accept, name="mooncake-store-lane",
                                          daemon=True)
        self._acceptor.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return  # closed
            with self._lock:
                self._conns.add(conn)
            threading.Thread(target=self._serve, args=(conn,), name="mooncake-store-lane-conn",
                             daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            while True:
                body = self._handle(_read(conn))
                _send(conn, body, protocol.mac(self._secret, body) if self._secret else b"")
        except (OSError, ConnectionError) as e:
            log.debug("store lane connection ends: %s", e)
        finally:
            with self._lock:
                self._conns.discard(conn)
            conn.close()

    def close(self) -> None:
        try:
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes the accept: the name is free after it
        except OSError:
            pass
        self._sock.close()
        if self._acceptor is not threading.current_thread():
            self._acceptor.join(timeout=5)
        with self._lock:
            for c in list(self._conns):
                try:
                    c.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


def serve_lane(address: str, handle: Callable[[list[bytes]], bytes],
               secret: bytes | None) -> LaneServer | None:
    """A LaneServer for `address`, or None (logged) where Unix sockets or the name are not to
    be had: clients then use zmq."""
    try:
        return LaneServer(address, handle, secret)
    except (OSError, AttributeError) as e:
        log.info("no same-host store lane for %s: %s", address, e)
        return None


class AnswerLost(RpcFailed):
    """The request went out but no answer came: it may have been applied, so never resend it."""


class Lane:
    """A client's lane to the master at `address`; `call` raises RpcFailed when the lane is
    down before the request left (then use zmq), AnswerLost when it went down after, or the
    StoreError the master answered."""

    def __init__(self, address: str, secret: bytes | None, timeout: float) -> None:
        self.address, self._secret = address, secret
        self._lock = threading.Lock()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(lane_name(address))
        except OSError as e:
            sock.close()
            raise RpcFailed(f"no store lane for {address}: {e}") from None
        self._sock: socket.socket | None = sock

    def call(self, request: Any, kind: Any = None,
             meanwhile: Callable[[], None] | None = None) -> Any:
        """The request's result; `meanwhile()` runs while the master works on it."""
        body = protocol.encode(request)
        with self._lock:
            sock = self._sock
            if sock is None:
                raise RpcFailed("the store lane is closed")
            try:
                _send(sock, body, protocol.mac(self._secret, body) if self._secret else b"")
            except (OSError, ConnectionError) as e:
                self._sock = None
                sock.close()
                raise RpcFailed(f"store lane to {self.address}: {e}") from None
            if meanwhile is not None:
                meanwhile()
            try:
                reply = _read(sock)
            except (OSError, ConnectionError) as e:
                self._sock = None
                sock.close()
                raise AnswerLost(f"store lane to {self.address}: no answer: {e}") from None
        return decode_signed(reply, self._secret, kind, self.address)

    def close(self) -> None:
        with self._lock:
            if self._sock is not None:
                self._sock.close()
                self._sock = None


def _once(fn: Callable[[], None]) -> Callable[[], None]:
    done: list[bool] = []

    def run() -> None:
        if not done:
            done.append(True)
            fn()
    return run


class LaneSlot:
    """Requests of one client: by the lane of the master `rpc` talks to when there is one,
    else (or when the lane fails, or answers NotLeader) by `rpc` itself. A missing lane is
    looked for again after RETRY seconds; a leader change (rpc.address) switches lanes. A
    request whose answer was lost on the lane (AnswerLost) is not resent by zmq. Thread-safe."""

    RETRY = 5.0

    def __init__(self, rpc: Any, timeout: float) -> None:
        self._rpc, self._timeout = rpc, timeout
        self._lock = threading.Lock()
        self._lane: Lane | None = None
        self._next_try = 0.0

    def _current(self) -> Lane | None:
        with self._lock:
            address, lane = self._rpc.address, self._lane
            if lane is not None and lane.address == address:
                return lane
            if lane is not None:
                lane.close()
            self._lane = None
            now = time.monotonic()
            if address and now >= self._next_try:
                try:
                    self._lane = Lane(address, getattr(self._rpc, "_secret", None),
                                      self._timeout)
                except RpcFailed:
                    self._next_try = now + self.RETRY
            return self._lane

    def _drop(self, lane: Lane) -> None:
        """Close `lane` and look for one again after RETRY seconds (if still the current)."""
        lane.close()
        with self._lock:
            if self._lane is lane:
                self._lane = None
                self._next_try = time.monotonic() + self.RETRY

    def call(self, request: Any, kind: Any = None,
             meanwhile: Callable[[], None] | None = None) -> Any:
        """The request's result; `meanwhile()` runs once, while the master works on it when
        the lane carries it (before sending otherwise)."""
        if meanwhile is not None:
            meanwhile = _once(meanwhile)
        lane = self._current()
        if lane is not None:
            try:
                return lane.call(request, kind, meanwhile)
            except StoreError as e:
                if not isinstance(e, RpcFailed) and e.code != NOT_LEADER:
                    raise
                self._drop(lane)
                if isinstance(e, AnswerLost):
                    raise
        if meanwhile is not None:
            meanwhile()
        return self._rpc.call(request, kind)

    def close(self) -> None:
        with self._lock:
            lane, self._lane = self._lane, None
        if lane is not None:
            lane.close()
