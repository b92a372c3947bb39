"""Objects' lifecycle on the master: two-phase puts, reads that grant leases, removal.

Every public method either does its whole job or raises a StoreError and changes nothing (one
exception: a put_start that finds no room evicts, then may still give up).

Lifecycle of a key: put_start allocates pending replicas -> the client writes them -> put_end
marks them complete (or put_revoke frees them; a put not ended within `put_timeout` is
discarded). Complete objects are served by get_replica_list / exists, each granting a lease of
`lease_ttl`; a leased object is neither removed (without force) nor evicted. Above the DRAM
high watermark, objects are evicted in the order of the eviction policy, or offloaded to their
client's SSD segment when it has one (tiering.py). A complete object gains replicas through
add_replica_start / add_replica_end (replication.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeAlias

from msgspec.structs import replace

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
from mooncake_cli.store.master.state import MasterState
from mooncake_cli.store.master.tiering import Tiering
from mooncake_cli.store.records import (
    DEFAULT_CONFIG,
    MAX_KEY_BYTES,
    ObjectMeta,
    Replica,
    ReplicaStatus,
    ReplicateConfig,
    Tier,
    check_key,
    check_size,
    check_tier,
    evolve,
)

Keys: TypeAlias = list[str]  # inside Objects the name `list` is the method


class _Plan:
    """What every put_start of one request shares (the config's derived values, the clock)."""

    __slots__ = ("config", "tier", "upsert", "now", "preferred", "deadline", "pin", "fits")

    def __init__(self, st: MasterState, config: ReplicateConfig, tier: Tier, upsert: bool,
                 now: float) -> None:
        self.config, self.tier, self.upsert, self.now = config, tier, upsert, now
        self.preferred = () if config is DEFAULT_CONFIG else config.preferred
        self.deadline = now + st.put_timeout
        self.pin = st.soft_pin_end(config, now)
        self.fits: dict[int, int] = {}  # size -> segments.fitting (fixed while segments are)


class Objects:
    """Puts, reads and removal over the master's state."""

    def __init__(self, state: MasterState, eviction: Eviction, tiering: Tiering) -> None:
        self.state = state
        self.eviction = eviction
        self.tiering = tiering
        self.now = state.now
        self._lock = state.lock

    # -- puts ------------------------------------------------------------------------------------
    def put_start(self, key: str, size: int, config: ReplicateConfig | None = None, *,
                  tier: Tier = "dram", upsert: bool = False) -> tuple[Replica, ...]:
        """Allocate up to `config.replica_num` pending replicas of `size` bytes on distinct
        segments (distinct hosts first, the preferred segments first; as many as fit, at least
        one); the client then writes them. `upsert`: a complete object of that key is replaced
        (ReplicaNotReady while its put is under way)."""
        config = self._config(config, tier)
        with self._lock:
            now = self.now()
            replicas = self._start(key, size, _Plan(self.state, config, tier, upsert, now))
            self.eviction.relieve(now)
            return replicas

    def batch_put_start(self, keys: Sequence[str], sizes: Sequence[int],
                        config: ReplicateConfig | None = None, *, tier: Tier = "dram",
                        upsert: bool = False) -> list[tuple[Replica, ...] | StoreError]:
        """`put_start` of each key (one check of the config, one watermark check at the end);
        per key its replicas or the error it met."""
        config = self._config(config, tier)
        with self._lock:
            now = self.now()
            plan = _Plan(self.state, config, tier, upsert, now)
            out: list[tuple[Replica, ...] | StoreError] = []
            for key, size in zip(keys, sizes, strict=True):
                try:
                    out.append(self._start(key, size, plan))
                except StoreError as e:
                    out.append(e)
            self.eviction.relieve(now)
            return out

    @staticmethod
    def _config(config: ReplicateConfig | None, tier: Tier) -> ReplicateConfig:
        check_tier(tier)
        config = DEFAULT_CONFIG if config is None else config
        if not isinstance(config, ReplicateConfig):
            raise InvalidParams(f"config must be a ReplicateConfig, not {type(config).__name__}")
        return config

    def _start(self, key: str, size: int, plan: _Plan) -> tuple[Replica, ...]:
        """One put_start of `plan`, the lock held."""
        check_key(key)
        check_size(size)
        st, tier, now = self.state, plan.tier, plan.now
        old = st.objects.get(key)
        if old is not None and st.expire_put(key, now):
            old = None
        if old is not None and plan.upsert and old.complete:
            st.drop(key)
        elif old is not None:
            if plan.upsert:
                raise ReplicaNotReady(f"the put of {key!r} has not ended")
            raise ObjectAlreadyExists(f"object {key!r} already exists or is being put")
        fits = plan.fits.get(size)
        if fits is None:
            fits = plan.fits[size] = st.segments.fitting(size, tier)
        n = min(plan.config.replica_num, fits)
        if n < 1:
            raise NoAvailableHandle(f"no mounted {tier} segment can hold {size} bytes")
        replicas = st.segments.allocate(size, n, tier, plan.preferred, 1)
        if not replicas and tier == "dram":
            self.eviction.evict(now, n * st.segments.aligned(size), "room")
            replicas = st.segments.allocate(size, n, tier, plan.preferred, 1)
        if not replicas:
            raise NoAvailableHandle(f"no room for a replica of {size} bytes in the "
                                    f"{tier} tier")
        placed = tuple(replicas)
        st.admit(ObjectMeta(key, size, placed, plan.config, now, now, 0.0, plan.deadline,
                            plan.pin))  # checked fields
        return placed

    def put_end(self, key: str, checksum: str | None = None) -> None:
        """Mark the put of `key` complete (a repeat for a complete object does nothing)."""
        with self._lock:
            self._end(key, checksum, self.now())

    def batch_put_end(self, keys: Sequence[str], sums: Sequence[str | None]
                      ) -> list[None | StoreError]:
        """`put_end` of each key (one clock reading); per key None or the error it met."""
        out: list[None | StoreError] = []
        with self._lock:
            now, end = self.now(), self._end
            for key, checksum in zip(keys, sums, strict=True):
                try:
                    out.append(end(key, checksum, now))
                except StoreError as e:
                    out.append(e)
        return out

    def _end(self, key: str, checksum: str | None, now: float) -> None:
        check_key(key)
        if checksum is not None and not isinstance(checksum, str):
            raise InvalidParams("checksum must be a string")
        st = self.state
        meta = st.objects.get(key)
        if meta is None or (meta.put_deadline is not None and meta.put_deadline <= now):
            meta = st.live(key, now)  # ObjectNotFound (an expired put is dropped first)
        if meta.put_deadline is None:
            return  # a repeat
        done = tuple([replace(r, status=ReplicaStatus.COMPLETE, checksum=checksum)
                      for r in meta.replicas])
        st.ended(meta, replace(meta, replicas=done, put_deadline=None, last_access=now))
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
        with self._lock:
            return self._get(key, self.now())

    def batch_get_replica_list(self, keys: Sequence[str]
                               ) -> list[tuple[Replica, ...] | StoreError]:
        """`get_replica_list` of each key (one clock reading); per key its replicas or the
        error it met."""
        out: list[tuple[Replica, ...] | StoreError] = []
        with self._lock:
            now, get = self.now(), self._get
            for key in keys:
                try:
                    out.append(get(key, now))
                except StoreError as e:
                    out.append(e)
        return out

    def _get(self, key: str, now: float) -> tuple[Replica, ...]:
        check_key(key)
        st = self.state
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

    def replica_clear(self, key: str, segment: str = "") -> bool:
        """Drop the replicas of complete, unleased `key` (only those on `segment` when given;
        the object goes when none is left); whether any went. Missing keys: False."""
        with self._lock:
            st = self.state
            now = self.now()
            st.expire_put(key, now)
            meta = st.objects.get(key)
            if meta is None or not meta.complete or meta.leased(now):
                return False
            gone = [r for r in meta.replicas if not segment or r.segment == segment]
            if not gone:
                return False
            if len(gone) == len(meta.replicas):
                st.drop(key)
                return True
            st.segments.release_all(gone)
            st.set(evolve(meta, replicas=tuple(r for r in meta.replicas if r not in gone)))
            return True

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
