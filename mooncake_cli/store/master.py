"""The store master: the operations its RPC service exposes, over `MasterCore`'s state.

Pure and network-free: time comes from the injected clock `now` (seconds, monotonic), so tests
drive expiry without sleeping. Every public method is thread-safe (one lock) and either does
its whole job or raises a StoreError and changes nothing (one exception: a put_start that
finds no room evicts, then may still give up). Batch forms return one result per key: the
value, or the StoreError that key met.

Lifecycle of a key: put_start allocates pending replicas -> the client writes them -> put_end
marks them complete (or put_revoke frees them; a put not ended within `put_timeout` is
discarded). Complete objects are served by get_replica_list / exists, each granting a lease of
`lease_ttl`; a leased object is neither removed (without force) nor evicted. Above the DRAM
high watermark, objects are evicted in the order of the eviction policy (see eviction/), or
offloaded to their client's SSD segment when it has one (see offload.py). A complete object
gains replicas through add_replica_start / add_replica_end (see replicas_add.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TypeAlias, TypeVar

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
from mooncake_cli.store.records import (
    MAX_KEY_BYTES,
    ObjectMeta,
    Replica,
    ReplicaStatus,
    ReplicateConfig,
    Tier,
    check_key,
    check_size,
    check_tier,
)
from mooncake_cli.store.replicas_add import ReplicaAdding

T = TypeVar("T")
A = TypeVar("A")
# module-level aliases: inside StoreMaster the name `list` is the method
Results: TypeAlias = list[T | StoreError]  # one result per key of a batch: the value or its error
Keys: TypeAlias = list[str]


class StoreMaster(ReplicaAdding):
    """Metadata, allocation, leases, eviction and client liveness of one store.

    Keyword settings: `now` (clock), `lease_ttl` 5 s, `put_timeout` 30 s, `client_ttl` 10 s,
    `high_watermark` 0.90 and `eviction_ratio` 0.05 (of DRAM capacity), `alignment` 64 bytes.
    """

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
            now = self.now()
            self._expire_put(key, now)
            if key in self._objects:
                raise ObjectAlreadyExists(f"object {key!r} already exists or is being put")
            have = self._segments.fitting(size, tier)
            if have < n:
                raise NoAvailableHandle(f"{n} replica(s) of {size} bytes need {n} distinct "
                                        f"{tier} segments that large; {have} mounted")
            replicas = self._segments.allocate(size, n, tier, config.preferred_segment)
            if not replicas and tier == "dram":
                self._evict(now, n * self._segments.aligned(size), "room")
                replicas = self._segments.allocate(size, n, tier, config.preferred_segment)
            if not replicas:
                raise NoAvailableHandle(f"no room for {n} replica(s) of {size} bytes in the "
                                        f"{tier} tier")
            self._admit(ObjectMeta(key, size, tuple(replicas), config, now, now,
                                   put_deadline=now + self.put_timeout))
            self._relieve(now)
            return tuple(replicas)

    def put_end(self, key: str, checksum: str | None = None) -> None:
        """Mark the put of `key` complete (a repeat for a complete object does nothing)."""
        check_key(key)
        if checksum is not None and not isinstance(checksum, str):
            raise InvalidParams("checksum must be a string")
        with self._lock:
            now = self.now()
            meta = self._live(key, now)
            if meta.complete:
                return
            done = tuple(replace(r, status=ReplicaStatus.COMPLETE, checksum=checksum)
                         for r in meta.replicas)
            self._store(replace(meta, replicas=done, put_deadline=None, last_access=now))
            self._counts["puts"] += 1

    def put_revoke(self, key: str) -> None:
        """Abandon a put that has not ended: its replicas are freed and the key forgotten."""
        check_key(key)
        with self._lock:
            meta = self._live(key, self.now())
            if meta.complete:
                raise InvalidWrite(f"the put of {key!r} has ended; remove it instead")
            self._drop(key)

    # -- reads -----------------------------------------------------------------------------------
    def get_replica_list(self, key: str) -> tuple[Replica, ...]:
        """The complete replicas of `key`; grants (or extends) a lease of `lease_ttl`."""
        check_key(key)
        with self._lock:
            now = self.now()
            self._counts["gets"] += 1
            try:
                meta = self._live(key, now)
                if not meta.complete:
                    raise ReplicaNotReady(f"the put of {key!r} has not ended")
            except (ObjectNotFound, ReplicaNotReady):
                self._counts["misses"] += 1
                raise
            self._counts["hits"] += 1
            meta = self._lease(meta, now)
            self._promote(meta, now)  # served from SSD this time; from DRAM once copied
            return meta.replicas

    def exists(self, key: str) -> bool:
        """Whether `key` is complete; a True answer grants a lease like a get."""
        check_key(key)
        with self._lock:
            now = self.now()
            self._expire_put(key, now)
            meta = self._objects.get(key)
            if meta is None or not meta.complete:
                return False
            self._lease(meta, now)
            return True

    def describe(self, key: str) -> ObjectMeta:
        """Everything known of `key`, without granting a lease or counting an access."""
        check_key(key)
        with self._lock:
            return self._live(key, self.now())

    def list(self, prefix: str = "") -> Keys:
        """Complete keys starting with `prefix`, sorted."""
        if not isinstance(prefix, str) or len(prefix.encode("utf-8", "replace")) > MAX_KEY_BYTES:
            raise InvalidParams(f"prefix must be a string of at most {MAX_KEY_BYTES} bytes")
        with self._lock:
            return sorted(k for k, m in self._objects.items()
                          if m.complete and k.startswith(prefix))

    # -- removal ---------------------------------------------------------------------------------
    def remove(self, key: str, force: bool = False) -> None:
        """Forget `key` and free its replicas; refused while leased or being put unless `force`."""
        check_key(key)
        with self._lock:
            now = self.now()
            meta = self._live(key, now)
            if not force and meta.leased(now):
                raise ObjectHasLease(f"object {key!r} is leased for another "
                                     f"{meta.lease_until - now:.3f} s")
            if not force and not meta.complete:
                raise ReplicaNotReady(f"the put of {key!r} has not ended")
            self._drop(key)

    def remove_all(self, force: bool = False) -> int:
        """Remove every complete unleased object (every object with `force`); how many."""
        with self._lock:
            now = self.now()
            keys = [k for k, m in self._objects.items()
                    if force or (m.complete and not m.leased(now))]
            for k in keys:
                self._drop(k)
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
            out = self._each([*zip(keys, sums, strict=True)],
                             lambda ks: self.put_end(ks[0], ks[1]))
            self._chain(keys)
            return out

    def batch_put_revoke(self, keys: Sequence[str]) -> Results[None]:
        return self._each(keys, self.put_revoke)

    def batch_get_replica_list(self, keys: Sequence[str]) -> Results[tuple[Replica, ...]]:
        with self._lock:
            out = self._each(keys, self.get_replica_list)
            self._chain(keys)
            return out

    def batch_exists(self, keys: Sequence[str]) -> Results[bool]:
        with self._lock:
            out = self._each(keys, self.exists)
            self._chain(keys)
            return out

    def batch_describe(self, keys: Sequence[str]) -> Results[ObjectMeta]:
        return self._each(keys, self.describe)

    def batch_remove(self, keys: Sequence[str], force: bool = False) -> Results[None]:
        return self._each(keys, lambda k: self.remove(k, force))

    def batch_register_existing(self, items: Sequence[tuple[str, Sequence[Replica]]]
                                ) -> Results[ObjectMeta]:
        return self._each(items, lambda kr: self.register_existing(kr[0], kr[1]))
