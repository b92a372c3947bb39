"""The store master: the operations its RPC service exposes, a thin facade over one state
(state.py) and the parts composed on it: eviction (eviction.py, with the policy from
mooncake_cli.store.eviction), tiering (tiering.py: offloads and promotions), replication
(replication.py: replica adds), membership (membership.py: mounts, liveness, the tick, stats)
and rebuild (rebuild.py: re-registration after a failover).

Pure and network-free: time comes from the injected clock `now` (seconds, monotonic), so tests
drive expiry without sleeping. Every public method is thread-safe (one lock) and either does
its whole job or raises a StoreError and changes nothing (one exception: a put_start that
finds no room evicts, then may still give up). Batch forms return one result per key: the
value, or the StoreError that key met.

Lifecycle of a key: put_start allocates pending replicas -> the client writes them -> put_end
marks them complete (or put_revoke frees them; a put not ended within `put_timeout` is
discarded). Complete objects are served by get_replica_list / exists, each granting a lease of
`lease_ttl`; a leased object is neither removed (without force) nor evicted. Above the DRAM
high watermark, objects are evicted in the order of the eviction policy, or offloaded to their
client's SSD segment when it has one (tiering.py). A complete object gains replicas through
add_replica_start / add_replica_end (replication.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, TypeAlias, TypeVar

from mooncake_cli.store.errors import (
    InvalidParams,
    InvalidWrite,
    NoAvailableHandle,
    ObjectAlreadyExists,
    ObjectHasLease,
    ObjectNotFound,
    ReplicaNotReady,
    StoreError,
)
from mooncake_cli.store.master.eviction import Eviction
from mooncake_cli.store.master.membership import Membership
from mooncake_cli.store.master.rebuild import Rebuild
from mooncake_cli.store.master.replication import Replication
from mooncake_cli.store.master.state import MasterState
from mooncake_cli.store.master.tiering import Tiering
from mooncake_cli.store.records import (
    MAX_KEY_BYTES,
    ObjectMeta,
    Replica,
    ReplicaStatus,
    ReplicateConfig,
    StoreStats,
    TickReport,
    Tier,
    check_key,
    check_size,
    check_tier,
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
        self.now, self.policy = st.now, st.policy
        self.lease_ttl, self.put_timeout, self.client_ttl = st.lease_ttl, st.put_timeout, \
            st.client_ttl
        self.high_watermark, self.eviction_ratio = st.high_watermark, st.eviction_ratio
        self._lock = st.lock
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

    # -- puts ------------------------------------------------------------------------------------
    def put_start(self, key: str, size: int, config: ReplicateConfig | None = None, *,
                  tier: Tier = "dram") -> tuple[Replica, ...]:
        """Allocate `config.replica_num` pending replicas of `size` bytes on distinct segments
        (distinct hosts first, the preferred segment first); the client then writes them."""
        check_key(key)
        check_size(size)
        check_tier(tier)
        config = ReplicateConfig() if config is None else config
        if not isinstance(config, ReplicateConfig):
            raise InvalidParams(f"config must be a ReplicateConfig, not {type(config).__name__}")
        n = config.replica_num
        with self._lock:
            st = self.state
            now = self.now()
            st.expire_put(key, now)
            if key in st.objects:
                raise ObjectAlreadyExists(f"object {key!r} already exists or is being put")
            have = st.segments.fitting(size, tier)
            if have < n:
                raise NoAvailableHandle(f"{n} replica(s) of {size} bytes need {n} distinct "
                                        f"{tier} segments that large; {have} mounted")
            replicas = st.segments.allocate(size, n, tier, config.preferred_segment)
            if not replicas and tier == "dram":
                self.eviction.evict(now, n * st.segments.aligned(size), "room")
                replicas = st.segments.allocate(size, n, tier, config.preferred_segment)
            if not replicas:
                raise NoAvailableHandle(f"no room for {n} replica(s) of {size} bytes in the "
                                        f"{tier} tier")
            st.admit(ObjectMeta(key, size, tuple(replicas), config, now, now,
                                   put_deadline=now + st.put_timeout))
            self.eviction.relieve(now)
            return tuple(replicas)

    def put_end(self, key: str, checksum: str | None = None) -> None:
        """Mark the put of `key` complete (a repeat for a complete object does nothing)."""
        check_key(key)
        if checksum is not None and not isinstance(checksum, str):
            raise InvalidParams("checksum must be a string")
        with self._lock:
            st = self.state
            now = self.now()
            meta = st.live(key, now)
            if meta.complete:
                return
            done = tuple(replace(r, status=ReplicaStatus.COMPLETE, checksum=checksum)
                         for r in meta.replicas)
            st.keep(replace(meta, replicas=done, put_deadline=None, last_access=now))
            st.counts["puts"] += 1

    def put_revoke(self, key: str) -> None:
        """Abandon a put that has not ended: its replicas are freed and the key forgotten."""
        check_key(key)
        with self._lock:
            st = self.state
            meta = st.live(key, self.now())
            if meta.complete:
                raise InvalidWrite(f"the put of {key!r} has ended; remove it instead")
            st.drop(key)

    # -- reads -----------------------------------------------------------------------------------
    def get_replica_list(self, key: str) -> tuple[Replica, ...]:
        """The complete replicas of `key`; grants (or extends) a lease of `lease_ttl`."""
        check_key(key)
        with self._lock:
            st = self.state
            now = self.now()
            st.counts["gets"] += 1
            try:
                meta = st.live(key, now)
                if not meta.complete:
                    raise ReplicaNotReady(f"the put of {key!r} has not ended")
            except (ObjectNotFound, ReplicaNotReady):
                st.counts["misses"] += 1
                raise
            st.counts["hits"] += 1
            meta = st.lease(meta, now)
            # served from SSD this time; from DRAM once copied
            self.tiering.promote(meta, now, self.eviction.evict_on)
            return meta.replicas

    def exists(self, key: str) -> bool:
        """Whether `key` is complete; a True answer grants a lease like a get."""
        check_key(key)
        with self._lock:
            st = self.state
            now = self.now()
            st.expire_put(key, now)
            meta = st.objects.get(key)
            if meta is None or not meta.complete:
                return False
            st.lease(meta, now)
            return True

    def describe(self, key: str) -> ObjectMeta:
        """Everything known of `key`, without granting a lease or counting an access."""
        check_key(key)
        with self._lock:
            st = self.state
            return st.live(key, self.now())

    def list(self, prefix: str = "") -> Keys:
        """Complete keys starting with `prefix`, sorted."""
        if not isinstance(prefix, str) or len(prefix.encode("utf-8", "replace")) > MAX_KEY_BYTES:
            raise InvalidParams(f"prefix must be a string of at most {MAX_KEY_BYTES} bytes")
        with self._lock:
            st = self.state
            return sorted(k for k, m in st.objects.items()
                          if m.complete and k.startswith(prefix))

    # -- removal ---------------------------------------------------------------------------------
    def remove(self, key: str, force: bool = False) -> None:
        """Forget `key` and free its replicas; refused while leased or being put unless `force`."""
        check_key(key)
        with self._lock:
            st = self.state
            now = self.now()
            meta = st.live(key, now)
            if not force and meta.leased(now):
                raise ObjectHasLease(f"object {key!r} is leased for another "
                                     f"{meta.lease_until - now:.3f} s")
            if not force and not meta.complete:
                raise ReplicaNotReady(f"the put of {key!r} has not ended")
            st.drop(key)

    def remove_all(self, force: bool = False) -> int:
        """Remove every complete unleased object (every object with `force`); how many."""
        with self._lock:
            st = self.state
            now = self.now()
            keys = [k for k, m in st.objects.items()
                    if force or (m.complete and not m.leased(now))]
            for k in keys:
                st.drop(k)
            return len(keys)

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

    def batch_put_start(self, keys: Sequence[str], sizes: Sequence[int],
                        config: ReplicateConfig | None = None, *,
                        tier: Tier = "dram") -> Results[tuple[Replica, ...]]:
        if len(keys) != len(sizes):
            raise InvalidParams(f"{len(keys)} keys but {len(sizes)} sizes")
        return self._each([*zip(keys, sizes, strict=True)],
                          lambda ks: self.put_start(ks[0], ks[1], config, tier=tier))

    def batch_put_end(self, keys: Sequence[str],
                      checksums: Sequence[str | None] | None = None) -> Results[None]:
        sums: Sequence[str | None] = [None] * len(keys) if checksums is None else checksums
        if len(sums) != len(keys):
            raise InvalidParams(f"{len(keys)} keys but {len(sums)} checksums")
        with self._lock:
            st = self.state
            out = self._each([*zip(keys, sums, strict=True)],
                             lambda ks: self.put_end(ks[0], ks[1]))
            st.chain(keys)
            return out

    def batch_put_revoke(self, keys: Sequence[str]) -> Results[None]:
        return self._each(keys, self.put_revoke)

    def batch_get_replica_list(self, keys: Sequence[str]) -> Results[tuple[Replica, ...]]:
        with self._lock:
            st = self.state
            out = self._each(keys, self.get_replica_list)
            st.chain(keys)
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
