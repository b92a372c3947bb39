"""Objects' lifecycle on the master: two-phase puts and reads that grant leases (removal:
removal.py).

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
)

Keys: TypeAlias = list[str]  # inside Objects the name `list` is the method


class _Plan:
    """What every put_start of one request shares (the config's derived values, the clock)."""

    __slots__ = ("config", "tier", "upsert", "now", "preferred", "deadline", "pin", "fits",
                 "started", "carved")

    def __init__(self, st: MasterState, config: ReplicateConfig, tier: Tier, upsert: bool,
                 now: float) -> None:
        self.config, self.tier, self.upsert, self.now = config, tier, upsert, now
        self.preferred = () if config is DEFAULT_CONFIG else config.preferred
        self.deadline = now + st.put_timeout
        self.pin = st.soft_pin_end(config, now)
        self.fits: dict[int, int] = {}  # size -> segments.fitting (fixed while segments are)
        self.started: dict[str, ObjectMeta] | None = None  # a batch's, not admitted yet
        self.carved: list[Replica] = []  # a batch's blocks cut at once, the next one last


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
        per key its replicas or the error it met. The objects are admitted (and the watermark
        checked) as deferred work (MasterState.defer): the answer needs only the replicas."""
        config = self._config(config, tier)
        with self._lock:
            st, now = self.state, self.now()
            plan = _Plan(st, config, tier, upsert, now)
            plan.started = {}
            plan.carved = self._carve(sizes, tier)
            out: list[tuple[Replica, ...] | StoreError] = self._fresh(keys, sizes, plan)
            try:
                for key, size in zip(keys[len(out):], sizes[len(out):], strict=True):
                    try:
                        out.append(self._start(key, size, plan))
                    except StoreError as e:
                        out.append(e)
            finally:
                for r in plan.carved:  # the blocks of keys refused (an existing key, say)
                    st.segments.release(r)
            st.defer(lambda: self._admit(plan))
            return out

    def _fresh(self, keys: Sequence[str], sizes: Sequence[int], plan: _Plan
               ) -> list[tuple[Replica, ...] | StoreError]:
        """The whole batch at once, as `_start` would place it key by key, when its blocks were
        carved and every key is a plain new one (distinct ASCII keys the index does not have):
        each its carved block. [] otherwise (then `_start` takes each key)."""
        carved, objects = plan.carved, self.state.objects
        if len(carved) != len(keys) or len(set(keys)) != len(keys) or \
                not all(type(k) is str and k.isascii() and 0 < len(k) <= MAX_KEY_BYTES
                        for k in keys) or any(k in objects for k in keys):
            return []
        size, config, now, deadline, pin = sizes[0], plan.config, plan.now, plan.deadline, \
            plan.pin
        placed: list[tuple[Replica, ...]] = [(r,) for r in reversed(carved)]  # last first
        carved.clear()
        assert plan.started is not None
        plan.started.update({k: ObjectMeta(k, size, rs, config, now, now, 0.0, deadline, pin)
                             for k, rs in zip(keys, placed, strict=True)})  # checked fields
        return list(placed)

    def _carve(self, sizes: Sequence[int], tier: Tier) -> list[Replica]:
        """A batch's blocks cut at once (SegmentTable.carve), last first, when every value has
        the same valid size; [] (each allocated by `_start`) otherwise."""
        if len(sizes) < 2 or any(s != sizes[0] for s in sizes):
            return []
        size = sizes[0]
        try:
            check_size(size)
        except StoreError:
            return []  # each key is refused by `_start`
        carved = self.state.segments.carve(size, len(sizes), tier)
        carved.reverse()
        return carved

    def _admit(self, plan: _Plan, relieve: bool = True) -> None:
        """Admit the objects of `plan`'s batch not admitted yet (then check the watermark)."""
        started, admit = plan.started or {}, self.state.admit
        for meta in started.values():
            admit(meta)
        started.clear()  # admitted: the index itself now refuses their keys again
        if relieve:
            self.eviction.relieve(plan.now)

    @staticmethod
    def _config(config: ReplicateConfig | None, tier: Tier) -> ReplicateConfig:
        check_tier(tier)
        config = DEFAULT_CONFIG if config is None else config
        if not isinstance(config, ReplicateConfig):
            raise InvalidParams(f"config must be a ReplicateConfig, not {type(config).__name__}")
        return config

    def _start(self, key: str, size: int, plan: _Plan) -> tuple[Replica, ...]:
        """One put_start of `plan`, the lock held (a batch's object kept in `plan.started`)."""
        check_key(key)
        check_size(size)
        st, tier, now, started = self.state, plan.tier, plan.now, plan.started
        old = st.objects.get(key)
        if old is not None and st.expire_put(key, now):
            old = None
        if old is not None and plan.upsert and old.complete:
            st.drop(key)
        elif old is not None or (started is not None and key in started):
            if plan.upsert:
                raise ReplicaNotReady(f"the put of {key!r} has not ended")
            raise ObjectAlreadyExists(f"object {key!r} already exists or is being put")
        fits = plan.fits.get(size)
        if fits is None:
            fits = plan.fits[size] = st.segments.fitting(size, tier)
        n = min(plan.config.replica_num, fits)
        if n < 1:
            raise NoAvailableHandle(f"no mounted {tier} segment can hold {size} bytes")
        carved = plan.carved
        replicas = [carved.pop()] if carved else st.segments.allocate(size, n, tier,
                                                                      plan.preferred, 1)
        if not replicas and tier == "dram":
            self._admit(plan, relieve=False)  # the batch's objects so far: as if one by one
            self.eviction.evict(now, n * st.segments.aligned(size), "room")
            replicas = st.segments.allocate(size, n, tier, plan.preferred, 1)
        if not replicas:
            raise NoAvailableHandle(f"no room for a replica of {size} bytes in the "
                                    f"{tier} tier")
        placed = tuple(replicas)
        meta = ObjectMeta(key, size, placed, plan.config, now, now, 0.0, plan.deadline,
                          plan.pin)  # checked fields
        if started is None:
            st.admit(meta)
        else:
            started[key] = meta
        return placed

    def put_end(self, key: str, checksum: str | None = None) -> None:
        """Mark the put of `key` complete (a repeat for a complete object does nothing)."""
        with self._lock:
            self._end(key, checksum, self.now())

    def batch_put_end(self, keys: Sequence[str], sums: Sequence[str | None], own: str = ""
                      ) -> list[None | StoreError]:
        """`put_end` of each key (one clock reading); per key None or the error it met. The
        puts are checked at once and completed as deferred work (MasterState.defer). `own`:
        the writer's segment (ReportBook.note)."""
        out: list[None | StoreError] = []
        ending: list[tuple[ObjectMeta, str | None]] = []
        with self._lock:
            now, ends = self.now(), self._ends
            for key, checksum in zip(keys, sums, strict=True):
                try:
                    meta = ends(key, checksum, now)
                except StoreError as e:
                    out.append(e)
                    continue
                if meta is not None:
                    ending.append((meta, checksum))
                out.append(None)
            if ending:
                self.state.defer(lambda: self._complete(ending, now, own))
        return out

    def _ends(self, key: str, checksum: str | None, now: float) -> ObjectMeta | None:
        """The pending object a put_end of `key` completes; None for a repeat (complete)."""
        check_key(key)
        if checksum is not None and not isinstance(checksum, str):
            raise InvalidParams("checksum must be a string")
        st = self.state
        meta = st.objects.get(key)
        if meta is None or (meta.put_deadline is not None and meta.put_deadline <= now):
            meta = st.live(key, now)  # ObjectNotFound (an expired put is dropped first)
        return None if meta.put_deadline is None else meta

    def _end(self, key: str, checksum: str | None, now: float) -> None:
        meta = self._ends(key, checksum, now)
        if meta is not None:
            self._complete([(meta, checksum)], now)

    def _complete(self, ending: list[tuple[ObjectMeta, str | None]], now: float,
                  own: str = "") -> None:
        """Mark each object's replicas complete (a key ended twice in one batch: the first)."""
        st, complete, objects = self.state, ReplicaStatus.COMPLETE, self.state.objects
        ended: list[tuple[ObjectMeta, ObjectMeta]] = []
        for meta, checksum in ending:
            key = meta.key
            if objects.get(key) is not meta:
                continue  # completed by an earlier end of the same batch
            done = tuple([replace(r, status=complete, checksum=checksum)
                          for r in meta.replicas])
            objects[key] = new = replace(meta, replicas=done, put_deadline=None, last_access=now)
            ended.append((meta, new))
        st.ended_all(ended, own)
        st.counts["puts"] += len(ended)

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
        error it met. The leases (and promotions) are deferred work (MasterState.defer)."""
        out: list[tuple[Replica, ...] | StoreError] = []
        read: list[ObjectMeta] = []
        with self._lock:
            now, found = self.now(), self._found
            for key in keys:
                try:
                    meta = found(key, now)
                except StoreError as e:
                    out.append(e)
                    continue
                read.append(meta)
                out.append(meta.replicas)
            if read:
                self.state.defer(lambda: self._leases(read, now))
        return out

    def _found(self, key: str, now: float) -> ObjectMeta:
        """The complete object a get of `key` reads (counted as a hit or a miss)."""
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
        return meta

    def _leases(self, read: list[ObjectMeta], now: float) -> None:
        """A lease for each object read; served from SSD this time, from DRAM once copied."""
        st, promote, evict_on = self.state, self.tiering.promote, self.eviction.evict_on
        leased = [st.lease(current, now) for meta in read  # a key read twice: leased again
                  if (current := st.objects.get(meta.key)) is not None]
        for meta in leased:  # every read leased before a promotion evicts to make room: no
            promote(meta, now, evict_on)  # replica answered is freed

    def _get(self, key: str, now: float) -> tuple[Replica, ...]:
        meta = self._found(key, now)
        self._leases([meta], now)
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
