"""The target side: one listener per engine answering DESCRIBE, READ, WRITE and PING.

Every READ and WRITE is checked against the segment's registered regions; a refused WRITE's
payload is drained so the connection stays framed, and the region is left untouched. Malformed
frames get an error reply and the connection is closed. Binds to 127.0.0.1 unless told.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable

from mooncake_cli.interfaces import TransferError
from mooncake_cli.transfer import wire
from mooncake_cli.transfer.segment import Segment

log = logging.getLogger("mooncake.transfer.server")


MAX_CONNECTIONS = 1024
HANDSHAKE_TIMEOUT = 10.0  # seconds a new connection has to prove the secret


class TargetServer:
    def __init__(self, segment: Segment, describe: Callable[[], bytes], host: str = "127.0.0.1",
                 port: int = 0, secret: str | None = None,
                 max_connections: int = MAX_CONNECTIONS) -> None:
        self._max = max_connections
        self.segment = segment
        self._describe = describe
        self._secret = secret or None
        self._sock = socket.create_server((host, port), backlog=128, reuse_port=False)
        self.host, self.port = self._sock.getsockname()[:2]
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._accept_loop, name="mooncake-accept",
                                        daemon=True)
        self._thread.start()

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with self._lock:
                full = len(self._conns) >= self._max
                if not full:
                    self._conns.add(conn)
            if full:
                log.warning("refused a connection: %d already open", self._max)
                conn.close()
                continue
            threading.Thread(target=self._serve, args=(conn,), name="mooncake-conn",
                             daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            wire.tune(conn)
            conn.settimeout(HANDSHAKE_TIMEOUT)  # a silent newcomer must not hold a thread
            if self._handshake(conn):
                conn.settimeout(None)
                self._loop(conn)
        except (OSError, ConnectionError):
            pass  # peer went away; nothing of ours is half-written
        except Exception:  # never let one connection take the server down
            log.exception("connection handler failed")
        finally:
            with self._lock:
                self._conns.discard(conn)
            conn.close()

    def _handshake(self, conn: socket.socket) -> bool:
        nonce = wire.make_nonce()
        conn.sendall(wire.HELLO.pack(b"MCK", wire.VERSION, int(self._secret is not None), nonce))
        if self._secret is None:
            return True
        proof = wire.recv_exact(conn, 32)
        ok = wire.verify(self._secret, nonce, proof)
        conn.sendall(b"\x00" if ok else b"\x01")
        if not ok:
            log.warning("refused a connection: wrong secret")
        return ok

    def _loop(self, conn: socket.socket) -> None:
        hdr = bytearray(wire.REQUEST.size)
        hview = memoryview(hdr)
        scratch = memoryview(bytearray(1 << 20))
        seg = self.segment
        while True:
            try:
                wire.recv_spin(conn, hview)
            except wire.PeerClosed:
                return
            op, _flags, _r, rid, off, length = wire.REQUEST.unpack(hdr)
            if op not in wire.OPS or length > wire.MAX_REQUEST:
                self._error(conn, rid, wire.E_BADOP,
                            f"malformed request (op {op}, length {length})")
                return
            if op == wire.OP_READ:
                try:
                    region, start = seg.locate(off, length)
                except TransferError as e:
                    self._error(conn, rid, wire.E_BOUNDS, str(e))
                    continue
                wire.send_parts(conn, wire.RESPONSE.pack(wire.OK, 0, 0, rid, length),
                                region.load(start, length))
            elif op == wire.OP_WRITE:
                try:
                    region, start = seg.locate(off, length)
                except TransferError as e:
                    wire.drain(conn, length, scratch)
                    self._error(conn, rid, wire.E_BOUNDS, str(e))
                    continue
                view = region.sink(start, length)
                wire.recv_into_exact(conn, view)
                region.commit(start, view)
                conn.sendall(wire.RESPONSE.pack(wire.OK, 0, 0, rid, 0))
            elif op == wire.OP_DESCRIBE:
                body = self._describe()
                wire.send_parts(conn, wire.RESPONSE.pack(wire.OK, 0, 0, rid, len(body)), body)
            else:
                conn.sendall(wire.RESPONSE.pack(wire.OK, 0, 0, rid, 0))

    @staticmethod
    def _error(conn: socket.socket, rid: int, status: int, message: str) -> None:
        body = message.encode()
        wire.send_parts(conn, wire.RESPONSE.pack(status, 0, 0, rid, len(body)), body)

    def close(self) -> None:
        self._closed.set()
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            self._sock.close()
        except OSError:
            pass
        with self._lock:
            conns = list(self._conns)
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._thread.join(timeout=2)
