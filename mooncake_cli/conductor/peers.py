"""Peers: this conductor's part in a group of conductors that share one etcd (`--peers`).

    peers = Peers("etcd://127.0.0.1:2379/default", cluster, instances.lock, self_url=url)
    peers.start(wait=10)          # lease, member record, then catch up with the others
    peers.ready                   # routes only once true
    peers.booked(rid, "decode-0", 64)
    await peers.holds(rid)        # before the prefill: does the booking fit in etcd's order?
    peers.released(rid)
    peers.learned("prefill-0", touched, stored, evicted)
    peers.close()                 # its bookings go at once (the lease is revoked)

Shared, through etcd (the layout is `mooncake_cli.conductor.peer_records`): each conductor's
decode bookings (one key per request, on its lease: they expire when it dies) and what it
learned from each prefill answer (one index record per answer). Every conductor watches the
prefix (`PrefixWatch`: one list, then a watch from that revision) and adds the others' bookings
to its scheduler's view of each decode instance (`PeerBookings`) and their index records to
its own CacheIndex (`PeerIndex`). A booking is decided on that view and then checked against
etcd's order of all bookings before its request goes on (`BookingOrder`): of two conductors
that took the same room at once, the later one gives it up. Local: the wait queue, the
requests it streams, its own bookings, its load polls and its cost model. Instance
registrations are shared by the etcd registry all conductors watch (`RegistryWatch`).
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Hashable, Sequence
from typing import Any

from mooncake_cli.api.registration import parse
from mooncake_cli.conductor.etcd_watch import Entry, PrefixWatch
from mooncake_cli.conductor.peer_bookings import PeerBookings
from mooncake_cli.conductor.peer_index import PeerIndex, index_record
from mooncake_cli.conductor.peer_order import BookingOrder
from mooncake_cli.conductor.peer_publisher import PeerPublisher
from mooncake_cli.conductor.peer_records import Layout, unseal
from mooncake_cli.etcd import EtcdClients
from mooncake_cli.scheduler.state import Cluster

log = logging.getLogger(__name__)


class Peers:
    def __init__(self, url: str, cluster: Cluster, lock: threading.RLock, *,
                 self_url: str = "", secret: str = "", ttl: int = 5,
                 timeout: float = 5.0) -> None:
        endpoints, name = parse(url)
        self.cluster, self.lock, self.secret = cluster, lock, secret
        self.cid = uuid.uuid4().hex[:16]
        self.layout = Layout(name)
        self.clients = EtcdClients(endpoints, timeout)
        self.bookings = PeerBookings(cluster, lock)
        self.index = PeerIndex(cluster, lock)
        self.members: dict[str, dict[str, Any]] = {}  # etcd key -> member record
        self.ignored = 0  # records refused (unsigned, wrongly signed, malformed)
        self._bad: set[str] = set()
        self.publisher = PeerPublisher(self.clients, self.layout, self.cid,
                                       {"url": self_url}, secret, ttl)
        self.watch = PrefixWatch(self.clients, self.layout.base, self, "conductor-peers")
        self.order = BookingOrder(cluster, lock, self.bookings.before,
                                  lambda: self.watch.synced_revision, timeout=max(2.0, ttl))
        self.publisher.on_written = self.order.written

    @property
    def ready(self) -> bool:
        """The lease is held and the others' records are read: this conductor may route."""
        return self.publisher.ready.is_set() and self.watch.ready.is_set()

    def start(self, wait: float = 10.0) -> Peers:
        """Take the lease, then catch up; wait up to `wait` seconds for both (a conductor
        that is not ready yet refuses requests with 503 until it is)."""
        self.publisher.start()
        self.publisher.ready.wait(wait)
        self.watch.start()
        if not self.watch.ready.wait(wait) or not self.ready:
            log.warning("not caught up with the other conductors in etcd after %.0f s: "
                        "requests get 503 until then", wait)
        return self

    def close(self) -> None:
        self.watch.close()
        self.publisher.close()

    # -- hooks of Bookings (the request path: they only queue a write) --------------------
    def booked(self, rid: str, decode: str, tokens: int) -> None:
        self.order.booked(self.layout.booking(self.cid, rid), decode, tokens)
        self.publisher.book(rid, decode, tokens)

    def released(self, rid: str) -> None:
        self.order.released(self.layout.booking(self.cid, rid))
        self.publisher.release(rid)

    async def holds(self, rid: str) -> bool:
        """Whether request `rid`'s decode booking holds in etcd's order (`BookingOrder`):
        awaited after the booking is made, before its prefill is sent."""
        return await self.order.holds(self.layout.booking(self.cid, rid))

    def learned(self, instance: str, touched: Sequence[Hashable], stored: Sequence[Hashable],
                evicted: Sequence[Hashable] = ()) -> None:
        record = index_record(instance, touched, stored, evicted)
        if record["touched"] or record["stored"] or record["evicted"]:
            self.publisher.learned(record)

    # -- the watch's sink -----------------------------------------------------------------
    def reset(self, entries: list[Entry]) -> None:
        members: dict[str, dict[str, Any]] = {}
        bookings: dict[str, tuple[dict[str, Any], int]] = {}
        index: list[tuple[str, dict[str, Any]]] = []
        for e in sorted(entries, key=lambda e: e.revision):  # index records in their order
            kind, record = self._read(e)
            if record is None:
                continue
            if kind == "members":
                members[e.key] = record
            elif kind == "bookings" and record["conductor"] != self.cid:
                bookings[e.key] = (record, e.revision)
            elif kind == "index" and record["conductor"] != self.cid:
                index.append((e.key, record))
        self.members = members
        self.bookings.reset(bookings)
        for key, record in index:
            self._apply_index(key, record)

    def put(self, entry: Entry) -> None:
        kind, record = self._read(entry)
        if record is None:  # refused: whatever the key held before counts no more
            self._forget(entry.key)
        elif kind == "members":
            self.members[entry.key] = record
        elif record["conductor"] == self.cid:
            return
        elif kind == "bookings":
            try:
                self.bookings.put(entry.key, record, entry.revision)
            except ValueError as e:
                self._refuse(entry.key, e)
        elif kind == "index":
            self._apply_index(entry.key, record)

    def synced(self, revision: int) -> None:
        self.order.check()

    def delete(self, key: str) -> None:
        """A key gone: a member or booking goes with it; an index record's blocks stay (its
        instance still holds them: only eviction or the instance's end removes them)."""
        self._bad.discard(key)
        self._forget(key)

    def _forget(self, key: str) -> None:
        kind = self.layout.kind(key)
        if kind == "members":
            self.members.pop(key, None)
        elif kind == "bookings":
            self.bookings.delete(key)

    def _read(self, entry: Entry) -> tuple[str | None, dict[str, Any] | None]:
        kind = self.layout.kind(entry.key)
        if kind is None:
            return None, None
        try:
            return kind, unseal(self.secret, entry)
        except ValueError as e:
            self._refuse(entry.key, e)
            return kind, None

    def _apply_index(self, key: str, record: dict[str, Any]) -> None:
        try:
            self.index.apply(record)
        except ValueError as e:
            self._refuse(key, e)

    def _refuse(self, key: str, why: Exception) -> None:
        self.ignored += 1
        if key not in self._bad:
            self._bad.add(key)
            log.warning("ignoring a conductor record in etcd at %s: %s", key, why)

    # -- what /health shows ---------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            decode = {i.name: {"own_tokens": i.booked_tokens, "peer_tokens": i.peer_tokens,
                               "peer_requests": i.peer_requests} for i in self.cluster.decode}
        return {"conductor": self.cid, "ready": self.ready,
                "conductors": sorted(r["conductor"] for r in list(self.members.values())),
                "decode": decode, "index_records_applied": self.index.applied,
                "records_ignored": self.ignored, "writes": self.publisher.written,
                "bookings_held": self.order.held, "bookings_yielded": self.order.yielded,
                "bookings_unconfirmed": self.order.timeouts,
                "booking_check_ms": self.order.wait_ms()}
