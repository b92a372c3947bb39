"""The store master: the operations its RPC service exposes, a thin facade over one state
(state.py) and the parts composed on it: objects (objects.py: puts, reads), removal
(removal.py), eviction (eviction.py, with the policy from mooncake_cli.store.eviction), tiering
(tiering.py: offloads and promotions), replication (replication.py: replica adds), membership
(membership.py: mounts, liveness, the tick, stats) and rebuild (rebuild.py: re-registration
after a failover).

Pure and network-free: time comes from the injected clock `now` (seconds, monotonic), so tests
drive expiry without sleeping. Every public method is thread-safe (one lock). Batch forms return
one result per key: the value, or the StoreError that key met; a batch's keys in order are a
prefix chain to the eviction policy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeAlias, TypeVar

from mooncake_cli.store.errors import (
    InvalidParams,
    StoreError,
)
from mooncake_cli.store.master.eviction import Eviction
from mooncake_cli.store.master.membership import Membership
from mooncake_cli.store.master.objects import Objects
from mooncake_cli.store.master.rebuild import Rebuild
from mooncake_cli.store.master.removal import Removal
from mooncake_cli.store.master.replication import Replication
from mooncake_cli.store.master.state import MasterState
from mooncake_cli.store.master.tiering import Tiering
from mooncake_cli.store.records import (
    ObjectMeta,
    Replica,
    ReplicateConfig,
    StoreStats,
    TickReport,
    Tier,
)

T = TypeVar("T")
A = TypeVar("A")
# module-level aliases: inside StoreMaster the name `list` is the method
Results: TypeAlias = list[T | StoreError]  # one result per key of a batch: the value or its error
Keys: TypeAlias = list[str]


class StoreMaster:
    """Metadata, allocation, leases, eviction and client liveness of one store.

    Keyword settings: `now` (clock), `lease_ttl` 5 s, `put_timeout` 30 s, `client_ttl` 10 s,
    `high_watermark` 0.90 and `eviction_ratio` 0.05 (of DRAM capacity), `alignment` 64 bytes,
    `eviction` "lru" (a policy name, or an EvictionPolicy).
    """

    def __init__(self, **settings: Any) -> None:
        self.state = st = MasterState(**settings)
        self.tiering = Tiering(st)
        self.eviction = Eviction(st, self.tiering)
        self.replication = Replication(st, self.eviction)
        self.membership = Membership(st, self.eviction)
        self.rebuild = Rebuild(st)
        self.objects = o = Objects(st, self.eviction, self.tiering)
        self.now, self.policy = st.now, st.policy
        self.lease_ttl, self.put_timeout, self.client_ttl = st.lease_ttl, st.put_timeout, \
            st.client_ttl
        self.high_watermark, self.eviction_ratio = st.high_watermark, st.eviction_ratio
        self._lock = st.lock
        self.put_start, self.put_end, self.put_revoke = o.put_start, o.put_end, o.put_revoke
        self.get_replica_list, self.exists, self.describe = o.get_replica_list, o.exists, \
            o.describe
        self.removal = rm = Removal(st)
        self.list, self.remove, self.remove_all = o.list, rm.remove, rm.remove_all
        m, t, r, b = self.membership, self.tiering, self.replication, self.rebuild
        self.mount_segment, self.unmount_segment = m.mount_segment, m.unmount_segment
        self.unmount_client, self.heartbeat = m.unmount_client, m.heartbeat
        self.segment_usage = m.segment_usage
        self.poll_moves, self.moves_done = t.poll_moves, t.moves_done
        self.add_replica_start, self.add_replica_end = r.add_replica_start, r.add_replica_end
        self.add_replica_revoke, self.adds_pending = r.add_replica_revoke, r.adds_pending
        self.batch_add_replica_start = r.batch_add_replica_start
        self.batch_add_replica_end = r.batch_add_replica_end
        self.batch_add_replica_revoke = r.batch_add_replica_revoke
        self.poll_holdings, self.register_held = b.poll_holdings, b.register_held
        self.register_existing = b.register_existing

    def stats(self) -> StoreStats:
        with self._lock:
            return self.membership.stats(moves=len(self.tiering.moves))

    def tick(self) -> TickReport:
        """Periodic housekeeping: drop silent clients, discard timed-out puts and replica adds,
        evict above the high watermark. Call it every second or so."""
        with self._lock:
            report = self.membership.tick()
            self.replication.expire(self.now())
            return report

    def evict(self, need: int = 0) -> list[str]:
        """Evict DRAM replicas in the policy's order until max(`need`, eviction_ratio x
        capacity) bytes are freed or nothing evictable is left; the keys evicted."""
        with self._lock:
            return self.eviction.evict(self.now(), need, "request")

    # -- batch forms -----------------------------------------------------------------------------
    def _each(self, items: Sequence[A], fn: Callable[[A], T]) -> Results[T]:
        if not isinstance(items, (list, tuple)):
            raise InvalidParams(f"a batch takes a list, not {type(items).__name__}")
        out: Results[T] = []
        with self._lock:
            for item in items:
                try:
                    out.append(fn(item))
                except StoreError as e:
                    out.append(e)
        return out

    def _chain(self, keys: Sequence[str]) -> None:
        """The batch `keys` as a chain, after the batch's deferred work (MasterState.defer)."""
        st = self.state
        st.defer(lambda: st.chain(keys))

    def batch_put_start(self, keys: Sequence[str], sizes: Sequence[int],
                        config: ReplicateConfig | None = None, *,
                        tier: Tier = "dram", upsert: bool = False) -> Results[tuple[Replica, ...]]:
        if not isinstance(keys, (list, tuple)) or len(keys) != len(sizes):
            raise InvalidParams("a batch takes a list of keys and as many sizes")
        return self.objects.batch_put_start(keys, sizes, config, tier=tier, upsert=upsert)

    def batch_replica_clear(self, keys: Sequence[str], segment: str = "") -> Keys:
        """Drop the replicas of `keys` (those on transfer segment `segment` only, when given)
        whose objects are complete and not leased; an object left with none is removed. The
        keys that lost a replica (upstream's batch_replica_clear)."""
        if not isinstance(keys, (list, tuple)) or not isinstance(segment, str):
            raise InvalidParams("batch_replica_clear takes a list of keys and a segment name")
        with self._lock:
            return [k for k in keys if self.removal.replica_clear(k, segment)]

    def batch_put_end(self, keys: Sequence[str], checksums: Sequence[str | None] | None = None,
                      own: str = "") -> Results[None]:
        """`own`: the writer's transfer segment, whose replicas the writer records itself."""
        sums: Sequence[str | None] = [None] * len(keys) if checksums is None else checksums
        if len(sums) != len(keys):
            raise InvalidParams(f"{len(keys)} keys but {len(sums)} checksums")
        if not isinstance(keys, (list, tuple)):
            raise InvalidParams(f"a batch takes a list, not {type(keys).__name__}")
        with self._lock:
            out = self.objects.batch_put_end(keys, sums, own if isinstance(own, str) else "")
            self._chain(keys)
            return out

    def batch_put_revoke(self, keys: Sequence[str]) -> Results[None]:
        return self._each(keys, self.put_revoke)

    def batch_get_replica_list(self, keys: Sequence[str]) -> Results[tuple[Replica, ...]]:
        if not isinstance(keys, (list, tuple)):
            raise InvalidParams(f"a batch takes a list, not {type(keys).__name__}")
        with self._lock:
            out = self.objects.batch_get_replica_list(keys)
            self._chain(keys)
            return out

    def batch_exists(self, keys: Sequence[str]) -> Results[bool]:
        with self._lock:
            st = self.state
            out = self._each(keys, self.exists)
            st.chain(keys)
            return out

    def batch_describe(self, keys: Sequence[str]) -> Results[ObjectMeta]:
        return self._each(keys, self.describe)

    def batch_remove(self, keys: Sequence[str], force: bool = False) -> Results[None]:
        return self._each(keys, lambda k: self.remove(k, force))

    def batch_register_existing(self, items: Sequence[tuple[str, Sequence[Replica]]]
                                ) -> Results[ObjectMeta]:
        return self._each(items, lambda kr: self.register_existing(kr[0], kr[1]))
