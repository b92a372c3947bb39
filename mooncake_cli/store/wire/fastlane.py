"""The master's same-host fast lane: the zmq protocol's frames over a Unix stream socket.

A zmq round trip crosses two I/O threads per side (~70 µs here); a Unix socket round trip is a
few µs, which is what small gets and exists are made of. A master serving HOST:PORT also listens
on the abstract Unix socket `@mooncake-store/HOST:PORT`; a client asking HOST:PORT tries that
name first, so it only ever reaches the master the address names (on the same host and network
namespace: the name exists only where that master runs) and falls back to zmq otherwise.

A connection first meets the transfer engine's handshake (a `Gate`, magic b"MCS"): with a
secret the client proves it before it may send a single frame, so nobody else gets a byte of
the master's memory; at most MAX_LANES connections are served (the longest idle closed for a
newcomer), each closed after IDLE_TIMEOUT seconds without a request, and a body is read as it
arrives (a header announcing a large body allocates nothing by itself).

Framing, both ways: a header of two u32 (body length, MAC length), the body, the MAC (the
HMAC-SHA256 of the body when the master has a secret, as on zmq). Requests are served one at a
time per connection by `serve` (MasterService.serve: it never raises but for the send).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from mooncake_cli.store.errors import RpcFailed, StoreError
from mooncake_cli.store.ha.leader import NOT_LEADER
from mooncake_cli.store.wire import protocol
from mooncake_cli.store.wire.lane_frames import CLIENT_SPIN, HEADER, MAGIC, lane_name, spin
from mooncake_cli.store.wire.lane_frames import read_frames as _read
from mooncake_cli.store.wire.lane_frames import recv as _recv
from mooncake_cli.store.wire.lane_frames import send_frames as _send
from mooncake_cli.store.wire.lane_server import LaneServer, serve_lane
from mooncake_cli.store.wire.rpc import decode_signed
from mooncake_cli.transfer import wire

__all__ = ["HEADER", "AnswerLost", "Lane", "LaneServer", "LaneSlot", "lane_name", "serve_lane"]
log = logging.getLogger("mooncake.store")


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
            self._handshake(sock)
            wire.blocking_with_timeout(sock, timeout)  # no poll before each send and recv
        except (OSError, ConnectionError) as e:
            sock.close()
            raise RpcFailed(f"no store lane for {address}: {e}") from None
        self._sock: socket.socket | None = sock

    def _handshake(self, sock: socket.socket) -> None:
        magic, version, auth, nonce = wire.HELLO.unpack(_recv(sock, wire.HELLO.size))
        if magic != MAGIC or version != wire.VERSION:
            raise ConnectionError(f"not a store lane (magic {magic!r}, version {version})")
        if auth:
            if self._secret is None:
                raise ConnectionError("the master requires a secret")
            sock.sendall(wire.prove(self._secret.decode(), nonce))
            if _recv(sock, 1) != b"\x00":
                raise ConnectionError("the master refused our secret")

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
                spin(sock, CLIENT_SPIN)
                reply = _read(sock)
                assert reply is not None
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
