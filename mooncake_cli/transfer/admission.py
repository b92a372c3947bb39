"""Admission to every listener of the engine: a bounded accept and the secret handshake, then
a bounded table of served connections.

`Admission` accepts on a listening socket and runs the HMAC challenge of `wire` (HELLO with a
nonce; the peer answers HMAC-SHA256(secret, nonce); one status byte back) for every newcomer
in one selector thread: a connection that has not proved the secret holds no thread and no
buffer beyond its 32-byte proof. At most `max_pending` connections (and `per_peer_pending` of
one peer) wait for their proof, each for at most `handshake_timeout` seconds; when either limit
is reached the oldest waiter is closed to make room, so a flood of silent sockets delays a real
client by at most one handshake and never locks it out. Proven connections go to `admit`.
What `admit` keeps is bounded by `transfer.served.Served`.
"""

from __future__ import annotations

import collections
import hmac
import logging
import selectors
import socket
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from mooncake_cli.interfaces import TransferError
from mooncake_cli.transfer import tls, wire

log = logging.getLogger("mooncake.transfer.admission")

Admit = Callable[[socket.socket, str], None]


def peer_of(conn: socket.socket) -> str:
    """Who a connection is from: the IP of a TCP peer, the uid of a Unix one."""
    if conn.family == socket.AF_UNIX:
        try:
            cred = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
            return f"uid:{int.from_bytes(cred[4:8], 'little')}"
        except OSError:
            return "unix"
    try:
        return str(conn.getpeername()[0])
    except OSError:
        return "?"


@dataclass
class _Waiter:
    conn: socket.socket
    peer: str
    nonce: bytes
    deadline: float
    proof: bytearray = field(default_factory=bytearray)
    shaken: bool = True  # False until its TLS handshake is done (with `tls`)


class Admission:
    def __init__(self, sock: socket.socket, magic: bytes, secret: str | None, admit: Admit,
                 max_pending: int = 256, per_peer_pending: int = 64,
                 handshake_timeout: float = 5.0, name: str = "mooncake-admission",
                 tls: tuple[ssl.SSLContext, bytes] | None = None) -> None:
        """`tls`: (server context, SHA-256 of its certificate) to encrypt every connection
        (transfer.tls); it needs a secret."""
        self._sock, self._magic, self._secret, self._admit = sock, magic, secret or None, admit
        if tls is not None and self._secret is None:
            raise ValueError("encryption needs a secret")
        self._tls = tls
        self._max, self._per_peer, self._timeout = max_pending, per_peer_pending, handshake_timeout
        self._waiting: collections.OrderedDict[int, _Waiter] = collections.OrderedDict()
        self._per: collections.Counter[str] = collections.Counter()
        self.refused = 0  # waiters closed for lack of room, time or a right proof
        self.on_refused: Callable[[str, str], None] | None = None  # (peer, why): a wrong proof
        self._sel = selectors.DefaultSelector()
        sock.setblocking(False)
        self._sel.register(sock, selectors.EVENT_READ)
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @property
    def pending(self) -> int:
        return len(self._waiting)

    def _run(self) -> None:
        while not self._closed:
            try:
                events = self._sel.select(0.25)
            except (OSError, ValueError):
                return
            for key, _ in events:
                if key.fileobj is self._sock:
                    self._accept()
                else:
                    self._readable(key.fd)
            self._expire()

    def _accept(self) -> None:
        for _ in range(64):  # a burst at a time, then look at the waiters again
            try:
                conn, _addr = self._sock.accept()
            except BlockingIOError:
                return
            except OSError as e:
                if self._closed:
                    return
                log.warning("accept failed (%s): dropping the oldest handshake", e)
                if not self._drop_oldest(None):
                    time.sleep(0.05)  # out of descriptors and nothing of ours to give back
                return
            self._greet(conn)

    def _greet(self, conn: socket.socket) -> None:
        peer = peer_of(conn)
        nonce = wire.make_nonce()
        try:
            conn.setblocking(False)
            auth = int(self._secret is not None) | (tls.FLAG if self._tls else 0)
            hello = wire.HELLO.pack(self._magic, wire.VERSION, auth, nonce)
            if conn.send(hello) != len(hello):
                raise OSError("short HELLO")
            if self._tls:
                conn = self._tls[0].wrap_socket(conn, server_side=True,
                                                do_handshake_on_connect=False)
        except OSError:
            conn.close()
            return
        if self._secret is None:
            self._hand_over(conn, peer)
            return
        if self._per[peer] >= self._per_peer:
            self._drop_oldest(peer)
        if len(self._waiting) >= self._max:
            self._drop_oldest(None)
        self._waiting[conn.fileno()] = _Waiter(conn, peer, nonce,
                                               time.monotonic() + self._timeout,
                                               shaken=self._tls is None)
        self._per[peer] += 1
        self._sel.register(conn, selectors.EVENT_READ)

    def _forget(self, fd: int) -> _Waiter | None:
        w = self._waiting.pop(fd, None)
        if w is not None:
            self._per[w.peer] -= 1
            if self._per[w.peer] <= 0:
                del self._per[w.peer]
            try:
                self._sel.unregister(w.conn)
            except (KeyError, ValueError):
                pass
        return w

    def _drop_oldest(self, peer: str | None) -> bool:
        for fd, w in self._waiting.items():
            if peer is None or w.peer == peer:
                self._forget(fd)
                w.conn.close()
                self.refused += 1
                return True
        return False

    def _expire(self) -> None:
        now = time.monotonic()
        while self._waiting:
            fd, w = next(iter(self._waiting.items()))
            if w.deadline > now:
                return
            self._forget(fd)
            w.conn.close()
            self.refused += 1

    def _readable(self, fd: int) -> None:
        w = self._waiting.get(fd)
        if w is None:
            return
        try:
            if not w.shaken:
                assert isinstance(w.conn, ssl.SSLSocket)
                w.conn.do_handshake()
                w.shaken = True
            while len(w.proof) < 32:  # TLS may hold it already: read until it would block
                chunk = w.conn.recv(32 - len(w.proof))
                if not chunk:
                    raise ConnectionError("closed")
                w.proof += chunk
        except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
            return
        except (OSError, ConnectionError):
            self._forget(fd)
            w.conn.close()
            return
        self._forget(fd)
        assert self._secret is not None
        if self._tls is None:
            ok = wire.verify(self._secret, w.nonce, bytes(w.proof))
            reply = b"\x00" if ok else b"\x01"
        else:
            cert = self._tls[1]
            ok = hmac.compare_digest(tls.client_proof(self._secret, w.nonce, cert), w.proof)
            reply = b"\x00" + tls.target_proof(self._secret, w.nonce, cert) if ok else b"\x01"
        try:
            w.conn.send(reply)
        except OSError:
            ok = False
        if not ok:
            log.warning("refused a connection from %s: wrong secret", w.peer)
            self.refused += 1
            if self.on_refused is not None:
                self.on_refused(w.peer, "wrong secret")
            w.conn.close()
            return
        self._hand_over(w.conn, w.peer)

    def _hand_over(self, conn: socket.socket, peer: str) -> None:
        try:
            conn.setblocking(True)
            self._admit(conn, peer)
        except Exception:  # admission must outlive any admit failure
            log.exception("admitting a connection failed")
            conn.close()

    def close(self) -> None:
        self._closed = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=2)
        for w in list(self._waiting.values()):
            w.conn.close()
        self._waiting.clear()
        self._sel.close()
        self._sock.close()


def prove(sock: socket.socket, magic: bytes, secret: str | None, what: str) -> None:
    """The client side of an `Admission` without TLS: read the HELLO on the connected `sock`
    and prove `secret` when the listener asks for it. TransferError says what went wrong;
    `what` names the listener ("shm lane") in it."""
    got, version, auth, nonce = wire.HELLO.unpack(wire.recv_exact(sock, wire.HELLO.size))
    if got != magic or version != wire.VERSION:
        raise TransferError(f"this is not a {what} (magic {got!r}, version {version})")
    if not auth:
        return
    if not secret:
        raise TransferError("the peer requires a shared secret: pass --secret or set "
                            "MOONCAKE_SECRET")
    sock.sendall(wire.prove(secret, nonce))
    if wire.recv_exact(sock, 1) != b"\x00":
        raise TransferError("the peer refused our secret (wrong --secret?)")
