"""Segments and clients coming and going: mounts, heartbeats, the periodic tick, re-registration
after a failover, and statistics.

A client is alive while it heartbeats (mounting counts as one). `tick` unmounts the segments of
clients silent for `client_ttl`; their replicas are dropped, and an object left with none is
gone. A heartbeat from a client the master does not know answers False: the client should mount
its segments again and `register_existing` the objects it holds (how the index of a new leader
is rebuilt after a failover). `poll_holdings` is the heartbeat of a client with a segment: it
also tells it what completed in or left its DRAM segment, whoever put it (reports.py), so it
re-registers every replica it holds, not only its own puts (`register_held`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace

from mooncake_cli.store.core import MasterCore
from mooncake_cli.store.errors import (
    InvalidParams,
    InvalidReplica,
    ObjectAlreadyExists,
    StoreError,
)
from mooncake_cli.store.records import (
    TIERS,
    ObjectMeta,
    Replica,
    ReplicateConfig,
    Segment,
    StoreStats,
    TickReport,
    TierStats,
    check_key,
)
from mooncake_cli.store.reports import Held, HoldingsReport


class Membership(MasterCore):
    """Mounts, client liveness, re-registration and stats on top of the master's core."""

    def mount_segment(self, segment: Segment) -> bool:
        """Offer `segment` for allocation; False if it was already mounted (nothing changes)."""
        if not isinstance(segment, Segment):
            raise InvalidParams(f"expected a Segment, not {type(segment).__name__}")
        with self._lock:
            added = self._segments.mount(segment)
            self._clients[segment.client_id] = self.now()
            return added

    def unmount_segment(self, name: str, base: int | None = None) -> tuple[str, ...]:
        """Withdraw the mounts of transfer segment `name` (just the one at `base` when given);
        their replicas are dropped. The keys that lost their last replica."""
        if not isinstance(name, str) or not (base is None or isinstance(base, int)):
            raise InvalidParams("unmount_segment takes a segment name and an optional base")
        with self._lock:
            gone = self._segments.unmount(name, base)
            for cid in {s.client_id for s in gone}:
                if not self._segments.segments(cid):
                    self._reports.drop(cid)
            return tuple(self._lose(gone))

    def unmount_client(self, client_id: str) -> tuple[str, ...]:
        """Withdraw every segment of `client_id` and forget the client; the keys lost."""
        with self._lock:
            self._clients.pop(client_id, None)
            self._reports.drop(client_id)
            gone = self._segments.segments(client_id)
            for s in gone:
                self._segments.unmount(s.name, s.base)
            return tuple(self._lose(gone))

    def heartbeat(self, client_id: str) -> bool:
        """Note that `client_id` is alive; False if the master does not know it (remount)."""
        with self._lock:
            if client_id not in self._clients:
                return False
            self._clients[client_id] = self.now()
            return True

    def poll_holdings(self, client_id: str, epoch: str = "", ack: int = 0) -> HoldingsReport:
        """A heartbeat that also answers what changed in the client's DRAM segments since
        `ack` of journal `epoch` (see reports.py); known=False if the master does not know it."""
        if not isinstance(client_id, str) or not client_id or not isinstance(ack, int):
            raise InvalidParams("poll_holdings takes a client id, an epoch and an ack")
        with self._lock:
            if client_id not in self._clients:
                return HoldingsReport(known=False)
            self._clients[client_id] = self.now()
            return self._reports.report(client_id, epoch, ack, self._objects.values())

    def register_held(self, held: Sequence[Held]) -> list[None | StoreError]:
        """`register_existing` of each replica a client re-announces; per item None when
        registered (or known already), else the error it met."""
        out: list[None | StoreError] = []
        with self._lock:
            for h in held:
                try:
                    if not isinstance(h, Held):
                        raise InvalidParams("register_held takes a list of Held")
                    self.register_existing(h.key, [h.replica], h.config)
                    out.append(None)
                except StoreError as e:
                    out.append(e)
        return out

    def tick(self) -> TickReport:
        """Periodic housekeeping: drop silent clients, discard timed-out puts, evict above the
        high watermark. Call it every second or so."""
        with self._lock:
            now = self.now()
            dead = tuple(c for c, seen in self._clients.items() if seen + self.client_ttl <= now)
            lost: list[str] = []
            for c in dead:
                lost.extend(self.unmount_client(c))
            stale = tuple(k for k, m in self._objects.items()
                          if m.put_deadline is not None and m.put_deadline <= now)
            for k in stale:
                self._drop(k)
            return TickReport(dead, stale, tuple(lost), tuple(self._relieve(now)))

    def register_existing(self, key: str, replicas: Sequence[Replica],
                          config: ReplicateConfig | None = None) -> ObjectMeta:
        """Re-announce complete replicas of `key` that a client still holds on its mounted
        segments; they join what the master already knows of `key`. All or nothing."""
        check_key(key)
        reps = list(replicas)
        if not reps or not all(isinstance(r, Replica) for r in reps):
            raise InvalidParams("register_existing needs at least one Replica")
        size = reps[0].size
        if any(r.size != size for r in reps):
            raise InvalidReplica(f"replicas of {key!r} disagree on its size")
        if config is not None and not isinstance(config, ReplicateConfig):
            raise InvalidParams(f"config must be a ReplicateConfig, not {type(config).__name__}")
        with self._lock:
            now = self.now()
            self._expire_put(key, now)
            meta = self._objects.get(key)
            if meta is not None and (not meta.complete or meta.size != size):
                raise ObjectAlreadyExists(f"object {key!r} exists with another size or is "
                                          f"being put")
            known = meta.replicas if meta is not None else ()
            sums = {r.checksum for r in (*known, *reps) if r.checksum is not None}
            if len(sums) > 1:
                raise InvalidReplica(f"replicas of {key!r} disagree on the checksum")
            taken = {(r.segment, r.tier): r.offset for r in known}  # one per segment and tier
            new: list[Replica] = []
            try:
                for r in reps:
                    if taken.get((r.segment, r.tier)) == r.offset:
                        continue  # already known: another owner or a repeat
                    if (r.segment, r.tier) in taken:
                        raise InvalidReplica(f"{key!r} already has a {r.tier} replica on "
                                             f"{r.segment}")
                    new.append(self._segments.claim(r))
                    taken[(r.segment, r.tier)] = r.offset
            except StoreError:
                self._segments.release_all(new)
                raise
            if meta is None:
                meta = ObjectMeta(key, size, tuple(new), config or ReplicateConfig(), now, now)
            else:
                meta = replace(meta, replicas=meta.replicas + tuple(new))
            return self._store(meta)

    def segment_usage(self) -> list[tuple[Segment, int]]:
        """Every mount with its allocated bytes."""
        with self._lock:
            return self._segments.usage()

    def stats(self) -> StoreStats:
        with self._lock:
            tiers = {}
            for tier in TIERS:
                n, used, cap = self._segments.totals(tier)
                held = [sum(r.size for r in m.replicas if r.tier == tier)
                        for m in self._objects.values() if m.complete]
                tiers[tier] = TierStats(n, sum(1 for b in held if b), used, cap, sum(held))
            complete = sum(1 for m in self._objects.values() if m.complete)
            return StoreStats(tiers, complete, len(self._objects) - complete,
                              len(self._clients), **self._counts, clock=time.time(),
                              policy=self.policy.name, evicted_by=dict(self._evicted_by),
                              copied_bytes=dict(self._copied))
