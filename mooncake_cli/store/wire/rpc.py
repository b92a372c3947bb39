"""A client's connection to the master: one zmq DEALER, one request at a time, each with a
timeout. A request left unanswered closes the socket and opens a fresh one, so a late reply can
never be taken for the answer to a later request (the "lazy pirate" pattern).

Given `etcd://...` (an HA store, see leader.py) it follows the leader published in etcd: it
resolves the leader before the first request, sends each request again to a new leader when
etcd names one while a reply is awaited or after a timeout, and re-resolves when a standby
answers NotLeader. `on_switch(address)` runs after each change of leader (not the first)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import zmq

from mooncake_cli.store.errors import RpcFailed, StoreError
from mooncake_cli.store.ha.leader import NOT_LEADER, LeaderResolver, is_ha
from mooncake_cli.store.wire import curve, protocol

CHECK_EVERY = 0.2  # seconds between looks at etcd while a reply is awaited (HA)
MAX_SWITCHES = 4  # leader changes one request follows before it gives up



def decode_signed(reply: list[bytes], secret: bytes | None, kind: Any, address: str) -> Any:
    """The result in a master's reply frames, its MAC checked when there is a secret; an
    unsigned refusal raises the master's own error, a bad MAC RpcFailed."""
    if secret is not None and (
            len(reply) != 2 or not protocol.mac_ok(secret, reply[0], reply[1])):
        if len(reply) == 1:  # an unsigned answer: the master refused us, say why
            protocol.result(protocol.decode_reply(reply[0]), None)
        raise RpcFailed(f"the reply from {address} has a bad MAC (wrong secret?)")
    return protocol.result(protocol.decode_reply(reply[0]), kind)

class MasterConnection:
    """Requests to the master at HOST:PORT; thread-safe (requests are serialised)."""

    def __init__(self, ctx: zmq.Context[Any], address: str, secret: str | None,
                 timeout: float, on_switch: Callable[[str], None] | None = None,
                 encrypt: bool | None = None) -> None:
        """`encrypt`: CurveZMQ keyed by the secret (curve.py; None: MOONCAKE_STORE_ENCRYPT)."""
        if not isinstance(address, str) or ":" not in address:
            raise RpcFailed(f"master address must be HOST:PORT or etcd://HOST:PORT, "
                            f"not {address!r}")
        self._leader = LeaderResolver(address, min(timeout, 2.0)) if is_ha(address) else None
        self.address = "" if self._leader else address  # HA: resolved on the first request
        self._on_switch = on_switch
        self._ctx = ctx
        self._secret = secret.encode() if secret else None
        self._curve = curve.wanted(encrypt)
        if self._curve:
            curve.require(self._secret)  # say now what is missing
        self.timeout = timeout
        self._lock = threading.Lock()
        self._sock: zmq.Socket[Any] | None = None

    def _socket(self) -> zmq.Socket[Any]:
        if self._sock is None:
            sock = self._ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            if self._curve:
                curve.secure_client(sock, self._secret)
            try:
                sock.connect(f"tcp://{self.address}")
            except zmq.ZMQError as e:  # close it, or the context's teardown waits forever
                sock.close(linger=0)
                raise RpcFailed(f"cannot connect to the master at {self.address}: {e}") from e
            self._sock = sock
        return self._sock

    def _reset(self) -> None:
        if self._sock is not None:
            self._sock.close(linger=0)
            self._sock = None

    def call(self, request: Any, kind: Any = None) -> Any:
        """Send `request`; its result decoded as `kind`, or the StoreError the master sent."""
        body = protocol.encode(request)
        frames = [body] if self._secret is None else [body, protocol.mac(self._secret, body)]
        if self._leader is None:
            with self._lock:
                reply = self._exchange(frames, time.monotonic() + self.timeout)
            assert reply is not None  # None only when following a leader
            return self._decode(reply, kind)
        with self._lock:
            deadline, switches, stale = time.monotonic() + self.timeout, 0, not self.address
            while True:
                if stale:
                    self._switch(self._leader.wait(deadline).address)
                    stale = False
                reply = self._exchange(frames, deadline)
                if reply is None:  # etcd names another leader: ask it, with a fresh timeout
                    deadline = time.monotonic() + self.timeout
                    switches += 1
                    if switches > MAX_SWITCHES:
                        raise RpcFailed(f"the store leader changed {switches} times during "
                                        f"one request")
                    continue
                try:
                    return self._decode(reply, kind)
                except StoreError as e:
                    if e.code != NOT_LEADER or time.monotonic() >= deadline:
                        raise
                    stale = True  # a standby (or a leader not yet serving): look again
                    time.sleep(0.1)

    def _switch(self, address: str) -> None:
        old, self.address = self.address, address
        if address != old:
            self._reset()
            if old and self._on_switch is not None:
                self._on_switch(address)

    def _exchange(self, frames: list[bytes], deadline: float) -> list[bytes] | None:
        """Send and wait for the reply until `deadline`; None when etcd named another leader
        meanwhile (the connection has switched to it)."""
        sock = self._socket()
        try:
            sock.send_multipart(frames, zmq.NOBLOCK)
            while True:
                left = deadline - time.monotonic()
                step = left if self._leader is None else min(left, CHECK_EVERY)
                if sock.poll(max(0, int(step * 1000))):
                    return list(sock.recv_multipart(zmq.NOBLOCK))
                if self._leader is not None and self._moved():
                    return None
                if time.monotonic() >= deadline:
                    break
        except zmq.ZMQError as e:
            self._reset()
            raise RpcFailed(f"master {self.address}: {e}") from e
        self._reset()
        raise RpcFailed(f"the master at {self.address} did not answer within "
                        f"{self.timeout:g} s")

    def _moved(self) -> bool:
        """Whether etcd names a leader other than the one asked (then switch to it)."""
        assert self._leader is not None
        try:
            info = self._leader.lookup()
        except StoreError:
            return False
        if info is None or info.address == self.address:
            return False
        self._switch(info.address)
        return True

    def _decode(self, reply: list[bytes], kind: Any) -> Any:
        return decode_signed(reply, self._secret, kind, self.address)

    def close(self) -> None:
        with self._lock:
            self._reset()
