"""When and where the master evicts: above the DRAM high watermark, when a put finds no room,
and on one segment for a promotion or an added replica; the victims in the eviction policy's
order (mooncake_cli.store.eviction), the rules every policy shares applied by `choose_victims`.
With SSD segments mounted, an evicted object is offloaded when its client has SSD room
(tiering.py): its DRAM is freed once the copy is confirmed.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable

from mooncake_cli.store.eviction import choose_victims
from mooncake_cli.store.master.state import MasterState
from mooncake_cli.store.master.tiering import Tiering
from mooncake_cli.store.records import ObjectMeta, Replica, evolve

DRY_RETRY = 0.05  # seconds a put's eviction waits after one that found too little to evict,
DRY_SHARE = 0.05  # or longer: such fruitless walks take at most this share of the time


class Eviction:
    """Evictions; after one that took everything evictable and still fell short (every other
    object leased, pinned or being put), the puts' evictions (`relieve`, and `evict` but on
    request) wait DRY_RETRY seconds, or 1/DRY_SHARE times as long as that walk took: each
    would walk every object again to find nothing."""

    def __init__(self, state: MasterState, tiering: Tiering) -> None:
        self.state = state
        self.tiering = tiering
        self._dry_until = float("-inf")

    def _victims(self, lru: Iterable[ObjectMeta], need: int, now: float) -> list[ObjectMeta]:
        """`choose_victims` of DRAM from `lru`; when they fall short of `need`, the wait."""
        began = time.perf_counter()
        victims = choose_victims(lru, need, now, "dram", self.state.segments.aligned)
        freed = sum(sum(1 for r in m.replicas if r.tier == "dram") * self.state.segments.aligned(
            m.size) for m in victims)
        if freed < need:
            self._dry_until = now + max(DRY_RETRY, (time.perf_counter() - began) / DRY_SHARE)
        return victims

    def evict(self, now: float, need: int, cause: str) -> list[str]:
        """Room wanted now (a put found none): without SSD segments, plain eviction; with them,
        `make_room` (an offload frees its DRAM only once copied, so the put may still fail)."""
        st = self.state
        if cause != "request" and now < self._dry_until:
            return []
        if st.segments.totals("ssd")[0] > 0:
            return self.make_room(now, need, cause)
        cap = st.segments.totals("dram")[2]
        need = max(need, int(st.eviction_ratio * cap))
        victims = self._victims(st.ordered(), need, now)
        for meta in victims:
            st.shed(meta, cause)
        return [m.key for m in victims]

    def relieve(self, now: float) -> list[str]:
        """Above the DRAM high watermark (offloads under way counted as done), make room by
        `make_room`; the keys evicted."""
        st = self.state
        if now < self._dry_until:
            return []
        self.tiering.expire(now)
        _, used, cap = st.segments.totals("dram")
        over = used - st.high_watermark * cap
        if cap == 0 or over <= 0:
            return []
        over -= self.tiering.moves.freeing()
        if over <= 0:
            return []
        return self.make_room(now, int(over) + 1, "watermark")

    def make_room(self, now: float, need: int, cause: str) -> list[str]:
        """Free at least max(`need`, eviction_ratio x capacity) DRAM bytes, in the policy's
        order: an object with an SSD copy loses its DRAM replicas, one whose client has SSD
        room is offloaded, any other is evicted. The keys evicted (DRAM replicas dropped)."""
        st, moves = self.state, self.tiering.moves
        need = max(need, int(st.eviction_ratio * st.segments.totals("dram")[2]))
        idle = st.ordered(lambda m: m.key not in moves)
        evicted = []
        for chosen in self._victims(idle, need, now):
            meta = st.objects.get(chosen.key)  # an SSD eviction may have changed it
            if meta is None or not any(r.tier == "dram" for r in meta.replicas):
                continue
            if not self.tiering.offload(meta, now):
                st.shed(meta, cause)
                evicted.append(meta.key)
        return evicted

    def evict_on(self, segment: str, need: int, now: float, cause: str) -> list[str]:
        """Free >= `need` bytes of DRAM on transfer segment `segment` alone (room wanted there,
        not anywhere), in the policy's order (no object with a move under way): a replica there
        goes at once when its object keeps another in DRAM; else as `make_room` does (DRAM
        dropped when on SSD too, offloaded when there is SSD room: freed once copied, evicted
        otherwise). The keys evicted (DRAM replicas dropped)."""
        st, moves = self.state, self.tiering.moves

        def here(r: Replica) -> bool:
            return r.tier == "dram" and r.segment == segment

        def candidate(m: ObjectMeta) -> bool:
            return m.key not in moves and any(here(r) for r in m.replicas)

        freed, lost = 0, []
        for meta in choose_victims(st.ordered(candidate), sys.maxsize, now, "dram",
                                   st.segments.aligned):
            if freed >= need:
                break
            gone = [r for r in meta.replicas if here(r)]
            freed += len(gone) * st.segments.aligned(meta.size)
            keep = tuple(r for r in meta.replicas if not here(r))
            if any(r.tier == "dram" for r in keep):
                st.segments.release_all(gone)
                st.set(evolve(meta, replicas=keep))
                st.count_eviction(cause)
            elif not self.tiering.offload(meta, now):
                st.shed(meta, cause)
                lost.append(meta.key)
        return lost

