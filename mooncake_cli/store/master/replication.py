"""Adding a replica to an object that is already complete: how hot blocks gain copies.

Two phases, like a put: `add_replica_start` allocates a pending DRAM block for `key` on the
named transfer segment (refused when the object is missing or not complete, already has a
replica there or one being added, or there is no room even after the usual eviction); the
client writes the object's bytes into it; `add_replica_end` gives the checksum of what was
written, which must equal the object's own, and only then does the block join the object's
replicas (a mismatch frees the block and is refused: a replica never holds other bytes).
`add_replica_revoke` abandons it; an add not ended within `put_timeout` is discarded. Readers
never see a pending block: it lives in `AddBook`, not in the object's replica list.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from mooncake_cli.store.errors import (
    InvalidParams,
    InvalidReplica,
    NoAvailableHandle,
    ObjectAlreadyExists,
    ObjectNotFound,
    ReplicaNotReady,
    SegmentNotFound,
    StoreError,
)
from mooncake_cli.store.master.eviction import Eviction
from mooncake_cli.store.master.state import MasterState
from mooncake_cli.store.records import (
    Mount,
    ObjectMeta,
    Replica,
    ReplicaStatus,
    check_key,
    check_size,
    evolve,
)

T = TypeVar("T")
A = TypeVar("A")


@dataclass(frozen=True)
class PendingAdd:
    replica: Replica  # the allocated block, not yet part of the object
    checksum: str  # the object's checksum when the add started
    deadline: float


@dataclass
class AddBook:
    """Replica adds under way, by (key, segment name), oldest first (so in deadline order: one
    timeout for all). Not thread-safe: the master's lock guards it."""

    adds: dict[tuple[str, str], PendingAdd] = field(default_factory=dict)

    def expired(self, now: float) -> list[PendingAdd]:
        """The adds past their deadline, removed."""
        gone = []
        for ks, p in self.adds.items():
            if p.deadline > now:
                break
            gone.append(ks)
        return [self.adds.pop(ks) for ks in gone]

    def pop_key(self, key: str) -> list[PendingAdd]:
        gone = [ks for ks in self.adds if ks[0] == key]
        return [self.adds.pop(ks) for ks in gone]

    def pop_where(self, cond: Callable[[PendingAdd], bool]) -> list[PendingAdd]:
        gone = [ks for ks, p in self.adds.items() if cond(p)]
        return [self.adds.pop(ks) for ks in gone]


def _check_segment(segment: object) -> str:
    if not isinstance(segment, str) or not segment:
        raise InvalidParams(f"segment must be a non-empty transfer segment name, got {segment!r}")
    return segment


def object_checksum(meta: ObjectMeta) -> str:
    """The one checksum every replica of `meta` carries; InvalidReplica when there is none."""
    sums = {r.checksum for r in meta.replicas}
    if len(sums) != 1 or None in sums:
        raise InvalidReplica(f"object {meta.key!r} has no single checksum to verify a new "
                             f"replica against")
    return str(next(iter(sums)))


class Replication:
    """Replica adds over the master's state; room on a segment made by `eviction`."""

    def __init__(self, state: MasterState, eviction: Eviction) -> None:
        self.state = state
        self.eviction = eviction
        self._adds = AddBook()
        state.on_drop.insert(0, self._dropped)  # before the moves' book: as before
        state.on_shed.append(self._shed)
        state.on_lost.append(self._lost)

    def add_replica_start(self, key: str, segment: str, size: int) -> Replica:
        """Allocate a pending DRAM replica of complete object `key` (`size` bytes, which must be
        its size) on transfer segment `segment`; the caller writes it, then ends the add."""
        check_key(key)
        _check_segment(segment)
        check_size(size)
        with self.state.lock:
            now = self.state.now()
            self.expire(now)
            st = self.state
            meta = st.live(key, now)
            if not meta.complete:
                raise ReplicaNotReady(f"the put of {key!r} has not ended")
            if size != meta.size:
                raise InvalidParams(f"the value is {size} bytes; object {key!r} is {meta.size}")
            csum = object_checksum(meta)
            if any(r.segment == segment for r in meta.replicas) or (key, segment) in \
                    self._adds.adds:
                raise ObjectAlreadyExists(f"object {key!r} already has a replica on {segment} "
                                          f"(or one being added)")
            mounts = [s for s in st.segments.segments()
                      if s.name == segment and s.tier == "dram"]
            if not mounts:
                raise SegmentNotFound(f"no DRAM segment {segment} is mounted")
            need = st.segments.aligned(size)
            if all(s.size < need for s in mounts):
                raise NoAvailableHandle(f"segment {segment} is smaller than {size} bytes")
            st.lease(meta, now)  # in use: not evicted to make room for its own copy
            r = st.segments.allocate_on(segment, size, "dram")
            if r is None:
                self.eviction.evict_on(segment, need, now, "replica")
                r = st.segments.allocate_on(segment, size, "dram")
            if r is None:
                raise NoAvailableHandle(f"no room for a replica of {size} bytes on {segment}")
            self._adds.adds[(key, segment)] = PendingAdd(r, csum, now + st.put_timeout)
            self.eviction.relieve(now)
            return r

    def add_replica_end(self, key: str, segment: str, checksum: str) -> None:
        """The pending replica of `key` on `segment` is written and its bytes have `checksum`:
        it joins the object's replicas. A checksum other than the object's frees the block and
        is refused (InvalidReplica)."""
        check_key(key)
        _check_segment(segment)
        if not isinstance(checksum, str):
            raise InvalidParams("checksum must be a string")
        with self.state.lock:
            now = self.state.now()
            self.expire(now)
            p = self._adds.adds.pop((key, segment), None)
            if p is None:
                raise ObjectNotFound(f"no replica of {key!r} is being added on {segment} "
                                     f"(never started, ended, revoked or timed out)")
            st = self.state
            meta = st.objects.get(key)
            try:
                if meta is None or not meta.complete or meta.size != p.replica.size \
                        or st.segments.locate(p.replica) is None:
                    raise ObjectNotFound(f"object {key!r} or segment {segment} went away while "
                                         f"the replica was written")
                if checksum != p.checksum or object_checksum(meta) != p.checksum:
                    raise InvalidReplica(f"the replica of {key!r} written on {segment} has "
                                         f"checksum {checksum}, the object {p.checksum}: "
                                         f"revoked")
                if any(r.segment == segment for r in meta.replicas):
                    raise ObjectAlreadyExists(f"object {key!r} already has a replica on "
                                              f"{segment}")
            except StoreError:
                st.segments.release(p.replica)
                raise
            done = evolve(p.replica, checksum=p.checksum, status=ReplicaStatus.COMPLETE)
            st.keep(evolve(meta, replicas=meta.replicas + (done,), last_access=now))
            st.count_copy("replica", meta.size)

    def add_replica_revoke(self, key: str, segment: str) -> None:
        """Abandon the add of a replica of `key` on `segment`; its block is freed."""
        check_key(key)
        _check_segment(segment)
        with self.state.lock:
            p = self._adds.adds.pop((key, segment), None)
            if p is None:
                raise ObjectNotFound(f"no replica of {key!r} is being added on {segment}")
            self.state.segments.release(p.replica)

    def adds_pending(self) -> int:
        """Replica adds started and not yet ended."""
        with self.state.lock:
            return len(self._adds.adds)

    # -- batch forms -----------------------------------------------------------------------------
    def _each_add(self, items: Sequence[A], fn: Callable[[A], T]) -> list[T | StoreError]:
        if not isinstance(items, (list, tuple)):
            raise InvalidParams(f"a batch takes a list, not {type(items).__name__}")
        out: list[T | StoreError] = []
        with self.state.lock:
            for item in items:
                try:
                    out.append(fn(item))
                except StoreError as e:
                    out.append(e)
        return out

    def batch_add_replica_start(self, keys: Sequence[str], segment: str,
                                sizes: Sequence[int]) -> list[Replica | StoreError]:
        if len(keys) != len(sizes):
            raise InvalidParams(f"{len(keys)} keys but {len(sizes)} sizes")
        return self._each_add([*zip(keys, sizes, strict=True)],
                               lambda ks: self.add_replica_start(ks[0], segment, ks[1]))

    def batch_add_replica_end(self, keys: Sequence[str], segment: str,
                              checksums: Sequence[str]) -> list[None | StoreError]:
        if len(keys) != len(checksums):
            raise InvalidParams(f"{len(keys)} keys but {len(checksums)} checksums")
        return self._each_add([*zip(keys, checksums, strict=True)],
                              lambda kc: self.add_replica_end(kc[0], segment, kc[1]))

    def batch_add_replica_revoke(self, keys: Sequence[str],
                                 segment: str) -> list[None | StoreError]:
        return self._each_add(keys, lambda k: self.add_replica_revoke(k, segment))

    # -- keeping the book right (lock held; events) ---------------------------------------------
    def expire(self, now: float) -> None:
        """Discard the adds not ended within the put timeout."""
        for p in self._adds.expired(now):
            self.state.segments.release(p.replica)

    def _release(self, key: str) -> None:
        for p in self._adds.pop_key(key):
            self.state.segments.release(p.replica)

    def _dropped(self, meta: ObjectMeta) -> None:
        self._release(meta.key)

    def _shed(self, meta: ObjectMeta, gone: bool) -> None:
        if gone:
            self._release(meta.key)

    def _lost(self, segments: list[Mount]) -> None:
        self._adds.pop_where(lambda p: any(p.replica.segment == s.name and
                                           s.holds(p.replica.offset, p.replica.size)
                                           for s in segments))  # their blocks went with them
