"""PeerPublisher: writes one conductor's shared records to etcd from a thread of its own.

    pub = PeerPublisher(clients, Layout("default"), "c-1a2b", {"url": url}, secret, ttl=5)
    pub.start(); pub.ready.wait(10)
    pub.book("cmpl-1", "decode-0", 64); pub.release("cmpl-1")
    pub.learned(index_record("prefill-0", touched, stored))
    pub.close()

The member record and the bookings hang on the conductor's lease of `ttl` seconds, refreshed
every ttl / 3: when the process dies they expire with it; `close` revokes the lease, so they go
at once. Index records hang on a second lease of `index_ttl` seconds that outlives the process
by that long (the prefill instances still hold the blocks), in a ring of `INDEX_RECORDS` slots:
etcd keeps at most that many per conductor. Writes queue up and leave as etcd transactions of
up to `TXN_OPS` puts and deletes (one put per booking, release or prefill answer; a booking
released before it was written is never written). A lease found gone is granted again and the
member and every live booking written anew. Every `COMPACT_EVERY` seconds the conductor
compacts etcd's history up to the revision it saw `HISTORY_S` seconds earlier (as the
Kubernetes API server does): the shared records change with every request, and without
compaction etcd's store would grow with each change.
"""

from __future__ import annotations

import base64
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from etcd3gw.lease import Lease

from mooncake_cli.conductor.peer_records import Layout, seal
from mooncake_cli.etcd import EtcdClients

log = logging.getLogger(__name__)
TXN_OPS = 100  # etcd refuses transactions of more than 128 operations by default
INDEX_RECORDS = 1024  # index records kept in etcd per conductor
INDEX_TTL = 600  # seconds index records outlive their conductor
COMPACT_EVERY = 60.0
HISTORY_S = 300.0
Op = tuple[str, dict[str, Any] | None]  # (lease kind: "member" or "index", body; None deletes)


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _refresh(lease_id: int) -> Callable[[Any], int]:
    return lambda client: Lease(lease_id, client).refresh()


def _grant(ttl: int) -> Callable[[Any], Any]:
    return lambda client: client.lease(ttl=ttl)


class PeerPublisher:
    def __init__(self, clients: EtcdClients, layout: Layout, cid: str,
                 member: dict[str, Any], secret: str = "", ttl: int = 5,
                 index_ttl: int = INDEX_TTL) -> None:
        self.clients, self.layout, self.cid, self.secret = clients, layout, cid, secret
        self.member = {**member, "conductor": cid}
        self.ttl, self.index_ttl = ttl, index_ttl
        self.ready = threading.Event()  # the lease is granted and the member record written
        # called with the keys of the bookings each transaction wrote, and its revision
        self.on_written: Callable[[list[str], int], None] | None = None
        self.written = 0  # operations etcd took
        self._cond = threading.Condition()
        self._pending: dict[str, Op] = {}
        self._bookings: dict[str, dict[str, Any]] = {}  # live: key -> body (for a new lease)
        self._in_etcd: set[str] = set()  # booking keys written and not yet deleted
        self._slot = 0
        self._leases: dict[str, Any] = {}  # "member" / "index" -> etcd3gw Lease
        self._renewed: dict[str, float] = {}
        self._revisions: deque[tuple[float, int]] = deque()
        self._compacted = 0
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name="conductor-peer-publisher")

    # -- what the conductor calls (any thread; never blocks on etcd) ----------------------
    def book(self, rid: str, decode: str, tokens: int) -> None:
        key = self.layout.booking(self.cid, rid)
        body = {"conductor": self.cid, "decode": decode, "tokens": tokens}
        with self._cond:
            self._bookings[key] = body
            self._pending[key] = ("member", body)
            self._cond.notify()

    def release(self, rid: str) -> None:
        key = self.layout.booking(self.cid, rid)
        with self._cond:
            if self._bookings.pop(key, None) is None:
                return
            if key in self._in_etcd:
                self._pending[key] = ("member", None)
            else:  # never written: nothing to delete
                self._pending.pop(key, None)
            self._cond.notify()

    def learned(self, record: dict[str, Any]) -> None:
        with self._cond:
            key = self.layout.index(self.cid, self._slot)
            self._slot = (self._slot + 1) % INDEX_RECORDS
            self._pending[key] = ("index", {**record, "conductor": self.cid})
            self._cond.notify()

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> PeerPublisher:
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop writing and revoke the member lease: this conductor's bookings go now."""
        with self._cond:
            self._stop = True
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        lease = self._leases.get("member")
        if lease is not None:
            try:
                lease.revoke()
            except Exception as e:  # it expires anyway
                log.warning("could not revoke the conductor's etcd lease: %s", e)

    # -- the thread -----------------------------------------------------------------------
    def _run(self) -> None:
        failing = False
        while True:
            with self._cond:
                if not self._pending and not self._stop:
                    self._cond.wait(timeout=self._due())
                if self._stop:
                    return
            try:
                self._renew()
                self._flush()
                self._compact()
                failing = False
            except Exception as e:  # etcd down: keep the queue and try again
                if not failing:
                    log.warning("cannot write the conductor's records to etcd (will keep "
                                "trying): %s", e)
                failing = True
                self._renewed.clear()  # a put under a lease that is gone fails: check them
                with self._cond:
                    self._cond.wait(timeout=0.5)

    def _due(self) -> float:
        """Seconds until a lease needs its next refresh."""
        now = time.monotonic()
        waits = [self._renewed.get(kind, 0.0) + period - now for kind, period in
                 (("member", self.ttl / 3), ("index", self.index_ttl / 3))]
        return max(0.01, min(waits))

    def _renew(self) -> None:
        """Refresh each lease when due; grant a lost one again (and, for the member lease,
        write the member record and every live booking anew)."""
        now = time.monotonic()
        for kind, ttl in (("member", self.ttl), ("index", self.index_ttl)):
            lease = self._leases.get(kind)
            if lease is not None and now - self._renewed.get(kind, 0.0) < ttl / 3:
                continue
            if lease is not None and self.clients.each("keepalive", _refresh(lease.id)) > 0:
                self._renewed[kind] = now
                continue
            if lease is not None:
                log.warning("the conductor's etcd %s lease expired: granting a new one", kind)
            self._leases[kind] = self.clients.each("lease", _grant(ttl))
            self._renewed[kind] = now
            if kind == "member":
                with self._cond:
                    self._in_etcd.clear()
                    for key, body in self._bookings.items():
                        self._pending.setdefault(key, ("member", body))
                self._txn([(self.layout.member(self.cid), ("member", self.member))])
                self.ready.set()

    def _flush(self) -> None:
        while True:
            with self._cond:
                if not self._pending:
                    return
                batch = list(self._pending.items())[:TXN_OPS]
            self._txn(batch)
            with self._cond:
                for key, op in batch:
                    if self._pending.get(key) is op:
                        del self._pending[key]
                    if op[0] == "member" and key != self.layout.member(self.cid):
                        (self._in_etcd.add if op[1] is not None else self._in_etcd.discard)(key)

    def _txn(self, ops: list[tuple[str, Op]]) -> None:
        success = []
        for key, (kind, body) in ops:
            if body is None:
                success.append({"request_delete_range": {"key": _b64(key)}})
                continue
            lease = self._leases[kind].id
            value = seal(self.secret, key, lease, body)
            success.append({"request_put": {"key": _b64(key), "value": _b64(value),
                                            "lease": str(lease)}})
        got = self.clients.each("txn", lambda c: c.post(c.get_url("/kv/txn"),
                                                        json={"success": success}))
        self.written += len(ops)
        revision = int(got.get("header", {}).get("revision", 0) or 0)
        booked = [key for key, (_, body) in ops
                  if body is not None and self.layout.kind(key) == "bookings"]
        if booked and self.on_written is not None:
            self.on_written(booked, revision)
        now = time.monotonic()
        if revision and (not self._revisions or now - self._revisions[-1][0] >= COMPACT_EVERY):
            self._revisions.append((now, revision))

    def _compact(self) -> None:
        now = time.monotonic()
        target = 0
        while self._revisions and now - self._revisions[0][0] >= HISTORY_S:
            target = self._revisions.popleft()[1]
        if target > self._compacted:
            try:
                self.clients.each("compact", lambda c: c.post(c.get_url("/kv/compaction"),
                                                              json={"revision": str(target)}))
            except Exception as e:  # another conductor compacted past it: as good
                log.debug("etcd compaction to %d: %s", target, e)
            self._compacted = target
