"""A transport's own listening socket behind the engine's admission (`EngineSide.door`): the
secret proof of `Admission` in front, a bounded `Served` table behind, one thread per proven
connection running the transport's `serve(entry)`."""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable

from mooncake_cli.transfer.admission import Admission
from mooncake_cli.transfer.served import Entry, Served

log = logging.getLogger("mooncake.transfer.door")


class Door:
    def __init__(self, sock: socket.socket, magic: bytes, secret: str | None,
                 serve: Callable[[Entry], None], name: str, limit: int = 64,
                 handshake_timeout: float = 5.0) -> None:
        self._serve, self._name = serve, name
        self._served = Served(limit, limit)
        self._admission = Admission(sock, magic, secret, self._admit, max_pending=limit,
                                    per_peer_pending=limit,
                                    handshake_timeout=handshake_timeout, name=name)

    def _admit(self, conn: socket.socket, peer: str) -> None:
        self._served.serve(conn, peer, self._run, f"{self._name}-conn")

    def _run(self, entry: Entry) -> None:
        try:
            self._serve(entry)
        except Exception:  # one connection must not take the door down
            log.exception("%s: serving a connection failed", self._name)
        finally:
            self._served.remove(entry)
            entry.conn.close()

    def claim(self, entry: Entry) -> bool:
        return self._served.claim(entry)

    def release(self, entry: Entry) -> None:
        self._served.release(entry)

    def close(self) -> None:
        self._admission.close()
        self._served.shutdown_all()
