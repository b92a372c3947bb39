"""The one state of a store master, and the changes to it that its parts share.

`MasterState` holds the settings, the lock, the segment table, the objects, the eviction policy
that orders them, the client heartbeats and the counters. Every change of an object goes through
it, so the policy and the holdings journals (reports.py) hear of each one explicitly: `admit`
(a new object), `keep` (used: read or renewed), `set` (replicas changed, no use), `forget`
(gone). Work the answer to a request does not depend on goes through `defer`: a service runs
it right after sending the answer, before it lets the lock go (service.py), so nobody sees the
state without it; outside a service it runs at once. The parts that keep books about objects
(tiering's moves, replication's pending adds) subscribe to the events they need: `on_drop` (an
object removed, before its replicas are freed), `on_shed` (an object's DRAM replicas evicted)
and `on_lost` (segments unmounted). `events`, when set (master/events.py), hears every change
of an object's replicas as (old, new), None for absent. Every method expects the lock to be
held.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import msgspec

from mooncake_cli.interfaces import EvictionPolicy
from mooncake_cli.store.allocator import DEFAULT_ALIGNMENT
from mooncake_cli.store.errors import InvalidParams, ObjectNotFound
from mooncake_cli.store.eviction import DEFAULT, make_policy
from mooncake_cli.store.master.placement import SegmentTable
from mooncake_cli.store.records import Mount, ObjectMeta, ReplicateConfig, evolve
from mooncake_cli.store.reports import ReportBook


def _journaled(old: ObjectMeta | None, new: ObjectMeta) -> bool:
    """Whether the change from `old` to `new` is one the holdings journals record."""
    return old is None or old.replicas is not new.replicas or \
        (old.put_deadline is None) is not (new.put_deadline is None)


class MasterState:
    """Shared state of a store master. Times are seconds from the injected clock `now`."""

    def __init__(self, *, now: Callable[[], float] = time.monotonic, lease_ttl: float = 5.0,
                 put_timeout: float = 30.0, client_ttl: float = 10.0,
                 high_watermark: float = 0.90, eviction_ratio: float = 0.05,
                 alignment: int = DEFAULT_ALIGNMENT,
                 eviction: str | EvictionPolicy = DEFAULT, soft_pin_ttl: float = 1800.0,
                 offload_on_evict: bool = True, promotion_on_hit: bool = True,
                 promotion_threshold: int = 1, fs_dir: str = "") -> None:
        """`soft_pin_ttl`: seconds a soft pin lasts after the object's last use, unless its
        config says (upstream's default_kv_soft_pin_ttl, 30 min). `offload_on_evict`: an
        evicted object goes to its client's SSD segment when there is one (else dropped);
        `promotion_on_hit`: an object held only on SSD is copied back to DRAM after
        `promotion_threshold` gets. `fs_dir`: the directory clients of the upstream API
        persist objects to (upstream's root_fs_dir/cluster_id), told to them, never read here."""
        if min(lease_ttl, put_timeout, client_ttl, soft_pin_ttl) <= 0:
            raise InvalidParams("lease_ttl, put_timeout and client_ttl must be positive")
        if not 0 < high_watermark <= 1 or not 0 < eviction_ratio <= 1:
            raise InvalidParams("high_watermark and eviction_ratio must be in (0, 1]")
        self.now = now
        self.lease_ttl = lease_ttl
        self.put_timeout = put_timeout
        self.client_ttl = client_ttl
        self.high_watermark = high_watermark
        self.eviction_ratio = eviction_ratio
        self.soft_pin_ttl = soft_pin_ttl
        self.offload_on_evict = offload_on_evict
        self.promotion_on_hit = promotion_on_hit
        self.promotion_threshold = max(1, int(promotion_threshold))
        self.fs_dir = fs_dir
        self.lock = threading.RLock()
        self.segments = SegmentTable(alignment)
        self.reports = ReportBook(self.segments)  # what each client's segment holds
        self.objects: dict[str, ObjectMeta] = {}
        self.pending: dict[str, None] = {}  # the keys whose puts have not ended, oldest first
        self.policy = make_policy(eviction) if isinstance(eviction, str) else eviction
        self.clients: dict[str, float] = {}  # client id -> last heartbeat
        self.counts = dict.fromkeys(("hits", "misses", "evictions", "puts", "gets", "offloads",
                                     "promotions"), 0)
        self.evicted_by: dict[str, int] = {}  # evictions by cause (records.EVICTION_CAUSES)
        self.copied: dict[str, int] = {}  # bytes copied on the master's orders, by kind
        self.on_drop: list[Callable[[ObjectMeta], None]] = []
        self.on_shed: list[Callable[[ObjectMeta, bool], None]] = []  # (meta, gone)
        self.on_lost: list[Callable[[list[Mount]], None]] = []
        self.later: list[Callable[[], None]] | None = None  # deferred work (a service's)
        self.events: Callable[[ObjectMeta | None, ObjectMeta | None], None] | None = None

    def defer(self, work: Callable[[], None]) -> None:
        """Run `work` once the answer under way has gone out, the lock still held (or now)."""
        if self.later is None:
            work()
        else:
            self.later.append(work)

    # -- changes of objects ----------------------------------------------------------------------
    def set(self, meta: ObjectMeta) -> ObjectMeta:
        """Record `meta` (its replicas changed, or a lease: no use told to the policy)."""
        old = self.objects.get(meta.key)
        self.objects[meta.key] = meta
        if meta.put_deadline is not None:
            self.pending[meta.key] = None
        elif old is not None and old.put_deadline is not None:
            self.pending.pop(meta.key, None)
        if _journaled(old, meta):
            self.reports.note(old, meta)
            if self.events is not None:
                self.events(old, meta)
        return meta

    def admit(self, meta: ObjectMeta) -> ObjectMeta:
        """A new object (a put started)."""
        self.set(meta)
        self.policy.admit(meta.key)
        return meta

    def keep(self, meta: ObjectMeta, hit: bool = False) -> ObjectMeta:
        """Record `meta` as used: read (`hit`) or renewed; admitted when new."""
        new = meta.key not in self.objects
        self.set(meta)
        if new:
            self.policy.admit(meta.key)
        self.policy.touch(meta.key, hit)
        return meta

    def ended(self, old: ObjectMeta, new: ObjectMeta, own: str = "") -> None:
        """The put of `old` ended as `new` (its replicas complete): `keep` of a known key.
        `own`: the writer's segment, whose replicas it records itself (ReportBook.note)."""
        self.objects[new.key] = new
        self.ended_all([(old, new)], own)

    def ended_all(self, pairs: list[tuple[ObjectMeta, ObjectMeta]], own: str = "") -> None:
        """`ended` of each (old, new) of a batch whose new records the index holds already."""
        pending, touch = self.pending, self.policy.touch
        for _, new in pairs:
            pending.pop(new.key, None)
            touch(new.key, False)
        self.reports.note_ended(pairs, own)
        if self.events is not None:
            for old, new in pairs:
                self.events(old, new)

    def lease(self, meta: ObjectMeta, now: float) -> ObjectMeta:
        until = now + self.lease_ttl
        new = msgspec.structs.replace(
            meta, last_access=now, lease_until=until if until > meta.lease_until
            else meta.lease_until, soft_pin_until=self.soft_pin_end(meta.config, now))
        if self.objects.get(meta.key) is not meta:
            return self.keep(new, hit=True)
        self.objects[meta.key] = new  # the same replicas: nothing for the journals
        self.policy.touch(meta.key, True)
        return new

    def soft_pin_end(self, config: ReplicateConfig, now: float) -> float:
        """When a soft pin of `config` taken (or renewed) at `now` ends; 0.0: not pinned."""
        return now + (config.soft_pin_ttl or self.soft_pin_ttl) if config.soft_pin else 0.0

    def forget(self, key: str, evicted: bool = False, own: str = "") -> ObjectMeta:
        """Remove `key` from the index and the policy (its replicas are the caller's)."""
        meta = self.objects.pop(key)
        if meta.put_deadline is not None:
            self.pending.pop(key, None)
        self.reports.note(meta, None, own)
        self.policy.remove(key, evicted)
        if self.events is not None:
            self.events(meta, None)
        return meta

    def drop(self, key: str, own: str = "") -> None:
        """Remove `key` and free its replicas; `on_drop` first. `own`: the remover's segment
        (ReportBook.note)."""
        meta = self.objects.get(key)
        if meta is not None:
            for listener in self.on_drop:
                listener(meta)
        self.segments.release_all(self.forget(key, own=own).replicas)

    def shed(self, meta: ObjectMeta, cause: str) -> None:
        """Evict `meta`'s DRAM replicas; the object is gone when it has no other."""
        keep = tuple(r for r in meta.replicas if r.tier != "dram")
        self.segments.release_all([r for r in meta.replicas if r.tier == "dram"])
        if keep:
            self.set(evolve(meta, replicas=keep))
        else:
            self.forget(meta.key, evicted=True)
        self.count_eviction(cause)
        for listener in self.on_shed:
            listener(meta, not keep)

    def lose(self, segments: list[Mount]) -> list[str]:
        """Forget the replicas on unmounted `segments`; the keys left with none (dropped)."""
        lost: list[str] = []
        for key, meta in list(self.objects.items()):
            keep = tuple(r for r in meta.replicas
                         if not any(r.segment == s.name and s.holds(r.offset, r.size)
                                    for s in segments))
            if len(keep) == len(meta.replicas):
                continue
            if keep:
                self.set(evolve(meta, replicas=keep))
            else:
                self.forget(key)
                lost.append(key)
        for listener in self.on_lost:
            listener(segments)
        return lost

    # -- reading ---------------------------------------------------------------------------------
    def live(self, key: str, now: float) -> ObjectMeta:
        self.expire_put(key, now)
        meta = self.objects.get(key)
        if meta is None:
            raise ObjectNotFound(f"object {key!r} not found")
        return meta

    def expired_puts(self, now: float) -> list[str]:
        """The keys whose puts ran past their deadline (not dropped here)."""
        objects = self.objects
        return [k for k in self.pending
                if (m := objects.get(k)) is not None and m.put_deadline is not None
                and m.put_deadline <= now]

    def expire_put(self, key: str, now: float) -> bool:
        meta = self.objects.get(key)
        if meta is not None and meta.put_deadline is not None and meta.put_deadline <= now:
            self.drop(key)
            return True
        return False

    def ordered(self, keep: Callable[[ObjectMeta], bool] | None = None) -> Iterator[ObjectMeta]:
        """The objects (those `keep` accepts) in the policy's order, first victim first."""
        for key in self.policy.victims():
            meta = self.objects.get(key)
            if meta is not None and (keep is None or keep(meta)):
                yield meta

    def chain(self, keys: object) -> None:
        """A batch named `keys` in this order (a prefix chain, for policies that use one)."""
        if isinstance(keys, (list, tuple)) and all(isinstance(k, str) for k in keys):
            self.policy.chain(list(keys))

    def count_eviction(self, cause: str) -> None:
        self.counts["evictions"] += 1
        self.evicted_by[cause] = self.evicted_by.get(cause, 0) + 1

    def count_copy(self, kind: str, size: int) -> None:
        self.copied[kind] = self.copied.get(kind, 0) + size
