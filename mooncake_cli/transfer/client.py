"""The initiator side of the wire protocol: one authenticated connection to a target's listener
(transfer/listener.py). Transports get one as `EngineSide.link` (spi.py)."""

from __future__ import annotations

import hmac
import select
import socket
import ssl
import time
from typing import Any

from mooncake_cli.interfaces import TransferError
from mooncake_cli.transfer import tls, wire

# idle seconds after which a pooled connection is looked at before reuse: targets close
# connections idle for 120 s (transfer/listener.py), and a reuse would then fail
CHECK_AFTER_IDLE = 1.0

_ERRORS = {wire.E_BOUNDS: "out of bounds", wire.E_BADOP: "malformed request",
           wire.E_AUTH: "not authorised", wire.E_TOOBIG: "too big", wire.E_INTERNAL: "internal"}


class TargetClient:
    """A connection to a target's listener. One caller at a time; `broken` after an I/O error."""

    def __init__(self, host: str, port: int, secret: str | None, timeout: float,
                 encrypt: bool = False) -> None:
        """`encrypt`: refuse a target that does not offer TLS (one that does always gets it)."""
        self.peer = f"{host}:{port}"
        self.broken = False
        self._timeout = timeout
        self._encrypt = encrypt
        self.tls = False
        try:
            self._sock = socket.create_connection((host, port), timeout=timeout)
        except OSError as e:
            raise TransferError(f"cannot connect to {self.peer}: {e.strerror or e}") from e
        try:
            wire.tune(self._sock)
            self._handshake(secret)
        except (OSError, ConnectionError) as e:
            self._sock.close()
            raise TransferError(f"handshake with {self.peer} failed: {e}") from e
        except TransferError:
            self._sock.close()
            raise
        self._hdr = bytearray(wire.RESPONSE.size)
        self._rid = 0
        self.spin = True  # busy-poll briefly for replies; the engine turns it off in workers
        self._used = time.monotonic()
        wire.blocking_with_timeout(self._sock, timeout)

    def dropped(self) -> bool:
        """Whether the target has closed this idle connection (it never sends unasked, so
        anything to read on an idle one is its end of file or an error). Looked at only after
        CHECK_AFTER_IDLE seconds without a request: a busy pool pays nothing."""
        if self.broken:
            return True
        if time.monotonic() - self._used < CHECK_AFTER_IDLE:
            return False
        try:
            readable, _, _ = select.select([self._sock], [], [], 0)
        except (OSError, ValueError):
            return True
        return bool(readable)

    def _handshake(self, secret: str | None) -> None:
        magic, version, auth, nonce = wire.HELLO.unpack(wire.recv_exact(self._sock,
                                                                        wire.HELLO.size))
        if magic != b"MCK" or version != wire.VERSION:
            raise TransferError(f"{self.peer} is not a mooncake transfer target "
                                f"(magic {magic!r}, version {version})")
        if self._encrypt and not auth & tls.FLAG:
            raise TransferError(f"{self.peer} does not encrypt: start it with --encrypt")
        if not auth:
            return
        if not secret:
            raise TransferError(f"{self.peer} requires a shared secret: pass --secret or set "
                                "MOONCAKE_SECRET")
        if auth & tls.FLAG:
            self._sock = tls.client_context().wrap_socket(self._sock)
            self.tls = True
            cert = tls.seen_certificate(self._sock)
            self._sock.sendall(tls.client_proof(secret, nonce, cert))
            if wire.recv_exact(self._sock, 1) != b"\x00":
                raise TransferError(f"{self.peer} refused our secret (wrong --secret?)")
            proof = wire.recv_exact(self._sock, tls.REPLY - 1)
            if not hmac.compare_digest(proof, tls.target_proof(secret, nonce, cert)):
                raise TransferError(f"{self.peer} did not prove the secret over TLS: someone "
                                    "is in between")
            return
        self._sock.sendall(wire.prove(secret, nonce))
        if wire.recv_exact(self._sock, 1) != b"\x00":
            raise TransferError(f"{self.peer} refused our secret (wrong --secret?)")

    def _response(self) -> int:
        wire.recv_spin(self._sock, memoryview(self._hdr),
                       wire.SPIN if self.spin and not self.tls else 0.0)
        status, _z, _r, _rid, length = wire.RESPONSE.unpack(self._hdr)
        if status != wire.OK:
            if length > wire.MAX_ERROR:
                raise ConnectionError(f"a {length}-byte error message")
            msg = wire.recv_exact(self._sock, length).decode(errors="replace")
            raise TransferError(f"{self.peer}: {_ERRORS.get(status, status)}: {msg}")
        return length

    def _io(self, fn: Any, *args: Any) -> Any:
        if self.broken:
            raise TransferError(f"connection to {self.peer} is broken")
        try:
            return fn(*args)
        except (OSError, ConnectionError) as e:
            self.broken = True
            self.close()
            if isinstance(e, (TimeoutError, BlockingIOError, ssl.SSLWantReadError,
                              ssl.SSLWantWriteError)):  # SO_RCVTIMEO/SO_SNDTIMEO hit
                raise TransferError(f"{self.peer} did not answer within {self._timeout:g} s") \
                    from e
            raise TransferError(f"connection to {self.peer} lost: {e or type(e).__name__}") from e
        finally:
            self._used = time.monotonic()

    def read(self, remote_offset: int, dst: memoryview) -> None:
        self._io(self._read, remote_offset, dst)

    def _read(self, off: int, dst: memoryview) -> None:
        self._rid = (self._rid + 1) & 0xFFFFFFFF
        self._sock.sendall(wire.REQUEST.pack(wire.OP_READ, 0, 0, self._rid, off, len(dst)))
        n = self._response()
        if n != len(dst):
            raise ConnectionError(f"short read: {n} of {len(dst)} bytes")
        wire.recv_into_exact(self._sock, dst)

    def write(self, remote_offset: int, src: memoryview, cap: bytes | None = None) -> None:
        """WRITE `src` at `remote_offset`; `cap`, a write capability the target issued, is
        needed where the target guards its memory."""
        self._io(self._write, remote_offset, src, cap)

    def _write(self, off: int, src: memoryview, cap: bytes | None) -> None:
        self._rid = (self._rid + 1) & 0xFFFFFFFF
        if cap is None:
            wire.send_parts(self._sock, wire.REQUEST.pack(wire.OP_WRITE, 0, 0, self._rid, off,
                                                          len(src)), src)
        else:
            if len(cap) != wire.CAP_BYTES:
                raise TransferError(f"a write capability is {wire.CAP_BYTES} bytes")
            wire.send_parts(self._sock, wire.REQUEST.pack(wire.OP_WRITE_CAP, 0, 0, self._rid,
                                                          off, len(src)), cap, src)
        self._response()

    def describe(self) -> bytes:
        return self._io(self._describe)

    def _describe(self) -> bytes:
        self._rid = (self._rid + 1) & 0xFFFFFFFF
        self._sock.sendall(wire.REQUEST.pack(wire.OP_DESCRIBE, 0, 0, self._rid, 0, 0))
        n = self._response()
        if n > wire.MAX_DESCRIPTOR:
            raise ConnectionError(f"a {n}-byte descriptor")
        return wire.recv_exact(self._sock, n)

    def close(self) -> None:
        try:
            self._sock.close()
        except OSError:
            pass
