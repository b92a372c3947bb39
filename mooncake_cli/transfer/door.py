"""A listening socket behind the engine's admission: the secret proof of `Admission` in front,
a bounded `Served` table behind, one thread per proven connection running `serve(entry)`,
which marks each request with `claim` and `release`. A transport gets one through
`EngineSide.door`; the relay and the store's same-host lane use it too, so the secret check in
front of a socket lives here."""

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
                 handshake_timeout: float = 5.0, per_peer: int | None = None,
                 pending: int | None = None, per_peer_pending: int | None = None) -> None:
        """At most `limit` served connections (`per_peer` of one peer, default `limit`) and
        `pending` still owing the proof (`per_peer_pending` of one peer; defaults `limit`)."""
        self._serve, self._name = serve, name
        self.served = Served(limit, limit if per_peer is None else per_peer)
        pending = limit if pending is None else pending
        self._admission = Admission(
            sock, magic, secret, self._admit, max_pending=pending,
            per_peer_pending=pending if per_peer_pending is None else per_peer_pending,
            handshake_timeout=handshake_timeout, name=name)

    def _admit(self, conn: socket.socket, peer: str) -> None:
        if not self.served.serve(conn, peer, self._run, f"{self._name}-conn"):
            log.warning("%s refused a connection from %s: %d open, all busy", self._name,
                        peer, len(self.served))

    def _run(self, entry: Entry) -> None:
        try:
            self._serve(entry)
        except Exception:  # one connection must not take the door down
            log.exception("%s: serving a connection failed", self._name)
        finally:
            self.served.remove(entry)
            entry.conn.close()

    def claim(self, entry: Entry) -> bool:
        return self.served.claim(entry)

    def release(self, entry: Entry) -> None:
        self.served.release(entry)

    def idle_for(self, entry: Entry) -> float:
        """Seconds since `entry` last finished a request."""
        return self.served.idle_for(entry)

    def close(self) -> None:
        self._admission.close()
        self.served.shutdown_all()
