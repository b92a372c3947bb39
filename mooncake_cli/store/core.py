"""The master's state and the steps its operations share: expiry, leases, drops and eviction.

`MasterCore` holds the lock, the segment table, the objects, the eviction policy that orders
them (mooncake_cli.store.eviction), the client heartbeats and the counters. Helper methods expect
the lock to be held; `StoreMaster` builds on them. Every object that arrives, is used or leaves
is told to the policy here (`_admit`, `_store`, `_forget`).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import replace

from mooncake_cli.interfaces import EvictionPolicy
from mooncake_cli.store.allocator import DEFAULT_ALIGNMENT
from mooncake_cli.store.errors import InvalidParams, ObjectNotFound
from mooncake_cli.store.eviction import DEFAULT, choose_victims, make_policy
from mooncake_cli.store.records import ObjectMeta, Segment
from mooncake_cli.store.reports import ObjectIndex, ReportBook
from mooncake_cli.store.segments import SegmentTable


class MasterCore:
    """Shared state of a store master. Times are seconds from the injected clock `now`."""

    def __init__(self, *, now: Callable[[], float] = time.monotonic, lease_ttl: float = 5.0,
                 put_timeout: float = 30.0, client_ttl: float = 10.0,
                 high_watermark: float = 0.90, eviction_ratio: float = 0.05,
                 alignment: int = DEFAULT_ALIGNMENT,
                 eviction: str | EvictionPolicy = DEFAULT) -> None:
        if min(lease_ttl, put_timeout, client_ttl) <= 0:
            raise InvalidParams("lease_ttl, put_timeout and client_ttl must be positive")
        if not 0 < high_watermark <= 1 or not 0 < eviction_ratio <= 1:
            raise InvalidParams("high_watermark and eviction_ratio must be in (0, 1]")
        self.now = now
        self.lease_ttl = lease_ttl
        self.put_timeout = put_timeout
        self.client_ttl = client_ttl
        self.high_watermark = high_watermark
        self.eviction_ratio = eviction_ratio
        self._lock = threading.RLock()
        self._segments = SegmentTable(alignment)
        self._reports = ReportBook(self._segments)  # what each client's segment holds
        self._objects: OrderedDict[str, ObjectMeta] = ObjectIndex(self._reports.note)
        self.policy = make_policy(eviction) if isinstance(eviction, str) else eviction
        self._clients: dict[str, float] = {}  # client id -> last heartbeat
        self._counts = dict.fromkeys(("hits", "misses", "evictions", "puts", "gets"), 0)
        self._evicted_by: dict[str, int] = {}  # evictions by cause (EVICTION_CAUSES)
        self._copied: dict[str, int] = {}  # bytes copied on the master's orders, by kind

    # -- eviction --------------------------------------------------------------------------------
    def evict(self, need: int = 0) -> list[str]:
        """Evict DRAM replicas in the policy's order until max(`need`, eviction_ratio x
        capacity) bytes are freed or nothing evictable is left; the keys evicted."""
        with self._lock:
            return self._evict(self.now(), need, "request")

    def _relieve(self, now: float) -> list[str]:
        """Evict when DRAM usage is above the high watermark, to below it."""
        _, used, cap = self._segments.totals("dram")
        if cap == 0 or used <= self.high_watermark * cap:
            return []
        return self._evict(now, int(used - self.high_watermark * cap) + 1, "watermark")

    def _evict(self, now: float, need: int, cause: str) -> list[str]:
        _, _, cap = self._segments.totals("dram")
        need = max(need, int(self.eviction_ratio * cap))
        victims = choose_victims(self._ordered(), need, now, "dram", self._segments.aligned)
        for meta in victims:
            self._shed(meta, cause)
        return [m.key for m in victims]

    def _ordered(self, keep: Callable[[ObjectMeta], bool] | None = None) -> Iterator[ObjectMeta]:
        """The objects (those `keep` accepts) in the policy's order, first victim first."""
        for key in self.policy.victims():
            meta = self._objects.get(key)
            if meta is not None and (keep is None or keep(meta)):
                yield meta

    def _count_eviction(self, cause: str) -> None:
        self._counts["evictions"] += 1
        self._evicted_by[cause] = self._evicted_by.get(cause, 0) + 1

    def _shed(self, meta: ObjectMeta, cause: str) -> None:
        """Evict `meta`'s DRAM replicas; the object is gone when it has no other."""
        keep = tuple(r for r in meta.replicas if r.tier != "dram")
        self._segments.release_all([r for r in meta.replicas if r.tier == "dram"])
        if keep:
            self._objects[meta.key] = replace(meta, replicas=keep)
        else:
            self._forget(meta.key, evicted=True)
        self._count_eviction(cause)

    # -- helpers (lock held) ---------------------------------------------------------------------
    def _live(self, key: str, now: float) -> ObjectMeta:
        self._expire_put(key, now)
        meta = self._objects.get(key)
        if meta is None:
            raise ObjectNotFound(f"object {key!r} not found")
        return meta

    def _expire_put(self, key: str, now: float) -> bool:
        meta = self._objects.get(key)
        if meta is not None and meta.put_deadline is not None and meta.put_deadline <= now:
            self._drop(key)
            return True
        return False

    def _lease(self, meta: ObjectMeta, now: float) -> ObjectMeta:
        return self._store(replace(meta, last_access=now,
                                   lease_until=max(meta.lease_until, now + self.lease_ttl)),
                           hit=True)

    def _admit(self, meta: ObjectMeta) -> None:
        """A new object (a put started)."""
        self._objects[meta.key] = meta
        self.policy.admit(meta.key)

    def _store(self, meta: ObjectMeta, hit: bool = False) -> ObjectMeta:
        """Keep `meta` as used: read (`hit`) or renewed; admitted when new."""
        new = meta.key not in self._objects
        self._objects[meta.key] = meta
        if new:
            self.policy.admit(meta.key)
        self.policy.touch(meta.key, hit)
        return meta

    def _forget(self, key: str, evicted: bool = False) -> ObjectMeta:
        """Remove `key` from the index and the policy (its replicas are the caller's)."""
        meta = self._objects.pop(key)
        self.policy.remove(key, evicted)
        return meta

    def _chain(self, keys: object) -> None:
        """A batch named `keys` in this order (a prefix chain, for policies that use one)."""
        if isinstance(keys, (list, tuple)) and all(isinstance(k, str) for k in keys):
            self.policy.chain(list(keys))

    def _drop(self, key: str) -> None:
        self._segments.release_all(self._forget(key).replicas)

    def _lose(self, segments: list[Segment]) -> list[str]:
        """Forget the replicas on unmounted `segments`; the keys left with none (dropped)."""
        lost: list[str] = []
        for key, meta in list(self._objects.items()):
            keep = tuple(r for r in meta.replicas
                         if not any(r.segment == s.name and s.holds(r.offset, r.size)
                                    for s in segments))
            if len(keep) == len(meta.replicas):
                continue
            if keep:
                self._objects[key] = replace(meta, replicas=keep)
            else:
                self._forget(key)
                lost.append(key)
        return lost
