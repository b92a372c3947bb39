"""A client's connection to the master: one zmq DEALER, one request at a time, each with a
timeout. A request left unanswered closes the socket and opens a fresh one, so a late reply can
never be taken for the answer to a later request (the "lazy pirate" pattern)."""

from __future__ import annotations

import threading
from typing import Any

import zmq

from mooncake_cli.store import protocol
from mooncake_cli.store.errors import RpcFailed


class MasterConnection:
    """Requests to the master at HOST:PORT; thread-safe (requests are serialised)."""

    def __init__(self, ctx: zmq.Context[Any], address: str, secret: str | None,
                 timeout: float) -> None:
        if not isinstance(address, str) or ":" not in address:
            raise RpcFailed(f"master address must be HOST:PORT, not {address!r}")
        self.address = address
        self._ctx = ctx
        self._secret = secret.encode() if secret else None
        self.timeout = timeout
        self._lock = threading.Lock()
        self._sock: zmq.Socket[Any] | None = None

    def _socket(self) -> zmq.Socket[Any]:
        if self._sock is None:
            sock = self._ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
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
        with self._lock:
            sock = self._socket()
            try:
                sock.send_multipart(frames, zmq.NOBLOCK)
                ready = sock.poll(int(self.timeout * 1000))
                reply = sock.recv_multipart(zmq.NOBLOCK) if ready else None
            except zmq.ZMQError as e:
                self._reset()
                raise RpcFailed(f"master {self.address}: {e}") from e
            if reply is None:
                self._reset()
                raise RpcFailed(f"the master at {self.address} did not answer within "
                                f"{self.timeout:g} s")
        if self._secret is not None and (
                len(reply) != 2 or not protocol.mac_ok(self._secret, reply[0], reply[1])):
            if len(reply) == 1:  # an unsigned answer: the master refused us, say why
                protocol.result(protocol.decode_reply(reply[0]), None)
            raise RpcFailed(f"the reply from {self.address} has a bad MAC (wrong secret?)")
        return protocol.result(protocol.decode_reply(reply[0]), kind)

    def close(self) -> None:
        with self._lock:
            self._reset()
