"""The table of served connections behind an `Admission`, bounded in all and per peer.

`Served` keeps at most `max_total` connections (and `max_per_peer` of one peer); when full,
the connection idle the longest is closed to make room (its serving thread sees EOF between
requests, so nothing half-done is cut), and a newcomer is refused only when every connection
is in the middle of a request. A serving thread `claim`s its entry when a request arrives and
`release`s it after the answer.
"""

from __future__ import annotations

import collections
import socket
import threading
import time
from collections.abc import Callable


class Entry:
    """One served connection; its thread marks it `busy` while a request is in hand."""

    __slots__ = ("conn", "peer", "busy", "since", "evicted", "opened", "requests", "bytes_in",
                 "bytes_out")

    def __init__(self, conn: socket.socket, peer: str) -> None:
        self.conn, self.peer = conn, peer
        self.busy, self.since, self.evicted = False, time.monotonic(), False
        self.opened = self.since
        self.requests = self.bytes_in = self.bytes_out = 0  # for the audit log

    def idle(self) -> None:
        self.busy, self.since = False, time.monotonic()


class Served:
    def __init__(self, max_total: int = 1024, max_per_peer: int = 512) -> None:
        self._max, self._per_peer = max_total, max_per_peer
        self._lock = threading.Lock()
        self._entries: dict[int, Entry] = {}
        self._per: collections.Counter[str] = collections.Counter()
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, conn: socket.socket, peer: str) -> Entry | None:
        """An entry for `conn`, making room by closing the longest-idle connection (of `peer`
        when it is at its own limit); None when every candidate is busy."""
        with self._lock:
            if self._per[peer] >= self._per_peer and not self._evict(peer):
                return None
            if len(self._entries) >= self._max and not self._evict(None):
                return None
            e = self._entries[id(conn)] = Entry(conn, peer)
            self._per[peer] += 1
            return e

    def serve(self, conn: socket.socket, peer: str, target: Callable[[Entry], None],
              name: str) -> bool:
        """Take `conn` in and serve it on a thread of its own (`target(entry)`); False, and
        `conn` closed, when every candidate for its room is busy."""
        entry = self.add(conn, peer)
        if entry is None:
            conn.close()
            return False
        threading.Thread(target=target, args=(entry,), name=name, daemon=True).start()
        return True

    def _evict(self, peer: str | None) -> bool:
        idle = [e for e in self._entries.values()
                if not e.busy and not e.evicted and (peer is None or e.peer == peer)]
        if not idle:
            return False
        victim = min(idle, key=lambda e: e.since)
        victim.evicted = True
        self.evicted += 1
        try:
            victim.conn.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._drop(victim)
        return True

    def _drop(self, e: Entry) -> None:
        if self._entries.pop(id(e.conn), None) is not None:
            self._per[e.peer] -= 1
            if self._per[e.peer] <= 0:
                del self._per[e.peer]

    def claim(self, e: Entry) -> bool:
        """Mark `e` busy with a request; False when it was closed to make room meanwhile."""
        with self._lock:
            if e.evicted:
                return False
            e.busy = True
            return True

    @staticmethod
    def release(e: Entry) -> None:
        e.idle()

    @staticmethod
    def idle_for(e: Entry) -> float:
        return time.monotonic() - e.since

    def remove(self, e: Entry) -> None:
        with self._lock:
            self._drop(e)

    def shutdown_all(self) -> None:
        with self._lock:
            entries = list(self._entries.values())
        for e in entries:
            try:
                e.conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
