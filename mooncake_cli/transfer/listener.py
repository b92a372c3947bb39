"""The engine's listener (the target side of transfer.wire), one per engine whatever its
transports: it proves the secret, answers DESCRIBE (p2p metadata, transports refreshing a
descriptor) and PING, and serves READ and WRITE of registered memory (the `tcp` transport's
data path, and every transport's fallback through `EngineSide.link`).

Connections come in through an `Admission` (the secret handshake, bounded, without a thread per
newcomer) and are kept in a bounded `Served` table: at most `max_connections` in all and
`max_per_peer` from one address, the longest idle closed to make room, any connection idle for
`idle_timeout` seconds closed. Every READ and WRITE is checked against the segment's regions
and a WRITE against the engine's write capabilities (`Grants`) before a byte of its payload is
taken; a refused WRITE's payload is drained so the connection stays framed. A WRITE of up to
STAGE_BYTES is received whole before any of it lands; a longer one lands as it arrives and,
when cut short, is reported as a torn write (its capability marked `torn`, never an OK).
Malformed frames get an error reply and the connection is closed. Binds to 127.0.0.1 unless told.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from mooncake_cli.interfaces import ConfigError, TransferError
from mooncake_cli.transfer import tls, wire
from mooncake_cli.transfer.admission import Admission
from mooncake_cli.transfer.capability import Grants
from mooncake_cli.transfer.segment import Region, Segment
from mooncake_cli.transfer.served import Entry, Served

log = logging.getLogger("mooncake.transfer.server")

MAX_CONNECTIONS = 1024
MAX_PER_PEER = 512
MAX_PENDING = 256  # connections still owing the secret
HANDSHAKE_TIMEOUT = 5.0  # seconds a new connection has to prove the secret
IDLE_TIMEOUT = 120.0  # seconds a served connection may sit without a request
IO_TIMEOUT = 10.0  # seconds a request's payload (or our answer) may stall
STAGE_BYTES = 1 << 20  # writes up to this size are received whole before they land


class TargetServer:
    def __init__(self, segment: Segment, describe: Callable[[], bytes], host: str = "127.0.0.1",
                 port: int = 0, secret: str | None = None,
                 max_connections: int = MAX_CONNECTIONS, grants: Grants | None = None,
                 max_per_peer: int = MAX_PER_PEER, idle_timeout: float | None = None,
                 handshake_timeout: float | None = None, encrypt: bool = False) -> None:
        """`encrypt`: TLS on every connection (transfer.tls; needs `secret`)."""
        self.segment = segment
        self.grants = grants if grants is not None else Grants()
        self._describe = describe
        self.idle_timeout = IDLE_TIMEOUT if idle_timeout is None else idle_timeout
        self.served = Served(max_connections, min(max_per_peer, max_connections))
        sock = socket.create_server((host, port), backlog=1024, reuse_port=False)
        self.host, self.port = sock.getsockname()[:2]
        self._closed = threading.Event()
        if encrypt and not secret:
            sock.close()
            raise ConfigError("encryption in transit needs the cluster secret: pass --secret "
                              "(or MOONCAKE_SECRET) with --encrypt")
        self.audit: Any = None  # an AuditLog (mooncake_cli.http.audit): refusals and transfers
        self.admission = Admission(sock, b"MCK", secret, self._admit, MAX_PENDING, MAX_PENDING // 2,
                         HANDSHAKE_TIMEOUT if handshake_timeout is None else handshake_timeout,
                         name="mooncake-accept", tls=tls.server_context() if encrypt else None)
        self.admission.on_refused = lambda peer, why: self._record("refused", peer=peer, why=why)

    def _record(self, event: str, **fields: Any) -> None:
        if self.audit is not None:
            try:
                self.audit.record(event, listener="transfer", **fields)
            except Exception:  # a broken log must not stop the data path
                log.exception("audit log")

    def _admit(self, conn: socket.socket, peer: str) -> None:
        if self._closed.is_set():
            conn.close()
        elif not self.served.serve(conn, peer, self._serve, "mooncake-conn"):
            log.warning("refused a connection from %s: %d connections open, all busy",
                        peer, len(self.served))

    def _serve(self, entry: Entry) -> None:
        conn = entry.conn
        try:
            wire.tune(conn)
            wire.blocking_with_timeout(conn, IO_TIMEOUT)
            self._loop(entry)
        except (OSError, ConnectionError):
            pass  # peer went away (or stalled): what it left half-sent was not applied
        except Exception:  # never let one connection take the server down
            log.exception("connection handler failed")
        finally:
            self.served.remove(entry)
            conn.close()
            if entry.requests:
                self._record("transfer", peer=entry.peer, requests=entry.requests,
                             bytes_in=entry.bytes_in, bytes_out=entry.bytes_out,
                             duration_s=round(time.monotonic() - entry.opened, 6),
                             status="evicted" if entry.evicted else "closed")

    def _loop(self, entry: Entry) -> None:
        conn, seg, grants = entry.conn, self.segment, self.grants
        hdr = bytearray(wire.REQUEST.size)
        hview = memoryview(hdr)
        cap = bytearray(wire.CAP_BYTES)
        stage: memoryview | None = None  # made on the first small write: idle costs nothing
        while True:
            try:
                if not wire.recv_request(conn, hview):
                    if self.served.idle_for(entry) > self.idle_timeout:
                        return
                    continue
            except wire.PeerClosed:
                return
            if not self.served.claim(entry):
                return  # closed to make room while the header came: nothing was applied
            op, _flags, _r, rid, off, length = wire.REQUEST.unpack(hdr)
            entry.requests += 1
            if op not in wire.OPS or length > wire.MAX_REQUEST:
                self._error(conn, rid, wire.E_BADOP,
                            f"malformed request (op {op}, length {length})")
                return
            if op == wire.OP_READ:
                try:
                    region, start = seg.locate(off, length)
                except TransferError as e:
                    self._error(conn, rid, wire.E_BOUNDS, str(e))
                else:
                    wire.send_parts(conn, wire.RESPONSE.pack(wire.OK, 0, 0, rid, length),
                                    region.load(start, length))
                    entry.bytes_out += length
            elif op in (wire.OP_WRITE, wire.OP_WRITE_CAP):
                token: bytes | None = None
                if op == wire.OP_WRITE_CAP:
                    wire.recv_into_exact(conn, memoryview(cap))
                    token = bytes(cap)
                try:
                    region, start = seg.locate(off, length)
                    why = grants.allows(token, off, length)
                    if why:
                        raise PermissionError(why)
                except (TransferError, PermissionError) as e:
                    wire.drain(conn, length, memoryview(bytearray(min(length, 1 << 16))))
                    code = wire.E_AUTH if isinstance(e, PermissionError) else wire.E_BOUNDS
                    log.warning("refused a write from %s: %s", entry.peer, e)
                    self._record("refused", peer=entry.peer, why=str(e), offset=off,
                                 bytes=length)
                    self._error(conn, rid, code, str(e))
                else:
                    if stage is None and length <= STAGE_BYTES and region.view is not None:
                        stage = memoryview(bytearray(STAGE_BYTES))
                    self._write(conn, region, start, length, stage, token, entry.peer)
                    entry.bytes_in += length
                    conn.sendall(wire.RESPONSE.pack(wire.OK, 0, 0, rid, 0))
            elif op == wire.OP_DESCRIBE:
                body = self._describe()
                wire.send_parts(conn, wire.RESPONSE.pack(wire.OK, 0, 0, rid, len(body)), body)
            else:
                conn.sendall(wire.RESPONSE.pack(wire.OK, 0, 0, rid, 0))
            self.served.release(entry)

    def _write(self, conn: socket.socket, region: Region, start: int, length: int,
               stage: memoryview | None, token: bytes | None, peer: str) -> None:
        """Receive a WRITE's payload into `region`: whole first (through `stage`) when it is
        small, else in place; a payload cut short raises and marks its capability torn."""
        sink = region.sink(start, length)  # device memory: a fresh host buffer, whole anyway
        direct = region.view is not None and (stage is None or length > len(stage))
        try:
            if region.view is not None and not direct:
                assert stage is not None
                wire.recv_into_exact(conn, stage[:length])
                sink[:] = stage[:length]
            else:
                wire.recv_into_exact(conn, sink)
        except (OSError, ConnectionError):
            if direct:
                log.warning("torn write from %s: %d bytes at %d of a region cut short", peer,
                            length, start)
                self.grants.wrote(token, complete=False)
            raise
        region.commit(start, sink)
        self.grants.wrote(token)

    @staticmethod
    def _error(conn: socket.socket, rid: int, status: int, message: str) -> None:
        body = message.encode()[:wire.MAX_ERROR]
        wire.send_parts(conn, wire.RESPONSE.pack(status, 0, 0, rid, len(body)), body)

    def close(self) -> None:
        self._closed.set()
        self.admission.close()
        self.served.shutdown_all()
