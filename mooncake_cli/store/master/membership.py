"""Segments and clients coming and going: mounts, heartbeats, the periodic tick, statistics.

A client is alive while it heartbeats (mounting counts as one). `tick` unmounts the segments of
clients silent for `client_ttl`; their replicas are dropped, and an object left with none is
gone. A heartbeat from a client the master does not know answers False: the client should mount
its segments again and re-register what it holds (rebuild.py).
"""

from __future__ import annotations

import time

from mooncake_cli.store.errors import InvalidParams
from mooncake_cli.store.master.eviction import Eviction
from mooncake_cli.store.master.state import MasterState
from mooncake_cli.store.records import TIERS, Mount, StoreStats, TickReport, TierStats


class Membership:
    """Mounts, client liveness and stats over the master's state."""

    def __init__(self, state: MasterState, eviction: Eviction) -> None:
        self.state = state
        self.eviction = eviction

    def mount_segment(self, segment: Mount) -> bool:
        """Offer `segment` for allocation; False if it was already mounted (nothing changes)."""
        if not isinstance(segment, Mount):
            raise InvalidParams(f"expected a Mount, not {type(segment).__name__}")
        with self.state.lock:
            added = self.state.segments.mount(segment)
            self.state.clients[segment.client_id] = self.state.now()
            if segment.tier == "dram":  # its owner's journal from now on (durable acks)
                self.state.reports.open(segment.client_id, self.state.objects.values())
            return added

    def unmount_segment(self, name: str, base: int | None = None) -> tuple[str, ...]:
        """Withdraw the mounts of transfer segment `name` (just the one at `base` when given);
        their replicas are dropped. The keys that lost their last replica."""
        if not isinstance(name, str) or not (base is None or isinstance(base, int)):
            raise InvalidParams("unmount_segment takes a segment name and an optional base")
        with self.state.lock:
            gone = self.state.segments.unmount(name, base)
            for cid in {s.client_id for s in gone}:
                if not self.state.segments.segments(cid):
                    self.state.reports.drop(cid)
            return tuple(self.state.lose(gone))

    def unmount_client(self, client_id: str) -> tuple[str, ...]:
        """Withdraw every segment of `client_id` and forget the client; the keys lost."""
        with self.state.lock:
            self.state.clients.pop(client_id, None)
            self.state.reports.drop(client_id)
            gone = self.state.segments.segments(client_id)
            for s in gone:
                self.state.segments.unmount(s.name, s.base)
            return tuple(self.state.lose(gone))

    def heartbeat(self, client_id: str) -> bool:
        """Note that `client_id` is alive; False if the master does not know it (remount)."""
        with self.state.lock:
            if client_id not in self.state.clients:
                return False
            self.state.clients[client_id] = self.state.now()
            return True

    def tick(self) -> TickReport:
        """Periodic housekeeping: drop silent clients, discard timed-out puts, evict above the
        high watermark. Call it every second or so."""
        with self.state.lock:
            now = self.state.now()
            ttl = self.state.client_ttl
            dead = tuple(c for c, seen in self.state.clients.items() if seen + ttl <= now)
            lost: list[str] = []
            for c in dead:
                lost.extend(self.unmount_client(c))
            stale = tuple(self.state.expired_puts(now))  # the puts under way, not every object
            for k in stale:
                self.state.drop(k)
            return TickReport(dead, stale, tuple(lost), tuple(self.eviction.relieve(now)))

    def segment_usage(self) -> list[tuple[Mount, int]]:
        """Every mount with its allocated bytes."""
        with self.state.lock:
            return self.state.segments.usage()

    def stats(self, moves: int = 0) -> StoreStats:
        """A snapshot of the counters and the tiers; `moves`: the moves under way."""
        st = self.state
        with st.lock:
            tiers = {}
            for tier in TIERS:
                n, used, cap = self.state.segments.totals(tier)
                held = [sum(r.size for r in m.replicas if r.tier == tier)
                        for m in self.state.objects.values() if m.complete]
                tiers[tier] = TierStats(n, sum(1 for b in held if b), used, cap, sum(held))
            complete = sum(1 for m in self.state.objects.values() if m.complete)
            return StoreStats(tiers, complete, len(self.state.objects) - complete,
                              len(st.clients), **st.counts, moves=moves, clock=time.time(),
                              policy=st.policy.name, evicted_by=dict(st.evicted_by),
                              copied_bytes=dict(st.copied))
