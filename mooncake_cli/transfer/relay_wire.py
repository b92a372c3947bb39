"""The relay's control protocol: the engine's HELLO and HMAC challenge (transfer.wire) under
the magic b"MCR", then JSON messages, each a little-endian u32 length and that many UTF-8
bytes. Data never crosses it: it moves through the engines' own transports."""

from __future__ import annotations

import json
import socket
import struct
from typing import Any

from mooncake_cli.interfaces import TransferError
from mooncake_cli.transfer import wire

MAGIC = b"MCR"
FRAME = struct.Struct("<I")
MAX_MESSAGE = 1 << 20


def send(sock: socket.socket, msg: dict[str, Any]) -> None:
    body = json.dumps(msg, separators=(",", ":")).encode()
    wire.send_parts(sock, FRAME.pack(len(body)), body)


def recv(sock: socket.socket) -> dict[str, Any]:
    """The next message; ConnectionError when the peer closed or sent a malformed one."""
    (n,) = FRAME.unpack(wire.recv_exact(sock, FRAME.size))
    if n > MAX_MESSAGE:
        raise ConnectionError(f"a {n}-byte relay message (at most {MAX_MESSAGE})")
    try:
        msg = json.loads(wire.recv_exact(sock, n))
    except ValueError as e:
        raise ConnectionError(f"a relay message that is not JSON: {e}") from None
    if not isinstance(msg, dict):
        raise ConnectionError("a relay message that is not a JSON object")
    return msg


def connect(address: str, secret: str | None, timeout: float) -> socket.socket:
    """A proven connection to the relay at HOST:PORT; TransferError saying why not."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise TransferError(f"bad relay address '{address}': use HOST:PORT")
    try:
        sock = socket.create_connection((host.strip("[]"), int(port)), timeout=timeout)
    except OSError as e:
        raise TransferError(f"cannot connect to the relay at {address}: "
                            f"{e.strerror or e}") from None
    try:
        magic, version, auth, nonce = wire.HELLO.unpack(wire.recv_exact(sock, wire.HELLO.size))
        if magic != MAGIC or version != wire.VERSION:
            raise TransferError(f"{address} is not a mooncake relay (magic {magic!r})")
        if auth:
            if not secret:
                raise TransferError(f"the relay at {address} requires the cluster secret: "
                                    "pass --secret or set MOONCAKE_SECRET")
            sock.sendall(wire.prove(secret, nonce))
            if wire.recv_exact(sock, 1) != b"\x00":
                raise TransferError(f"the relay at {address} refused our secret")
    except (OSError, ConnectionError) as e:
        sock.close()
        raise TransferError(f"handshake with the relay at {address} failed: {e}") from None
    except TransferError:
        sock.close()
        raise
    return sock


class RelayConnection:
    """One proven control connection; `call` sends a request and returns its answer, `post`
    and `answer` split the two for pipelining. An answer with "error" raises TransferError."""

    def __init__(self, address: str, secret: str | None, timeout: float) -> None:
        self.address = address
        self._sock = connect(address, secret, timeout)
        self._sock.settimeout(timeout)

    def post(self, msg: dict[str, Any]) -> None:
        try:
            send(self._sock, msg)
        except OSError as e:
            raise TransferError(f"relay {self.address}: {e}") from None

    def answer(self) -> dict[str, Any]:
        try:
            msg = recv(self._sock)
        except (OSError, ConnectionError) as e:
            raise TransferError(f"relay {self.address}: {e or 'closed'}") from None
        if "error" in msg:
            raise TransferError(f"relay {self.address}: {msg['error']}")
        return msg

    def call(self, msg: dict[str, Any]) -> dict[str, Any]:
        self.post(msg)
        return self.answer()

    def close(self) -> None:
        try:
            self._sock.close()
        except OSError:
            pass

    def __enter__(self) -> RelayConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
