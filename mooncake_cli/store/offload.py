"""The master's side of the SSD tier: offload on eviction, promotion on a get, move bookkeeping.

Above the DRAM high watermark, a least recently used object whose DRAM replica's client also
mounts an SSD segment is offloaded rather than dropped: the master allocates a block on that
SSD segment and hands the client a move (`poll_moves`); the client copies locally, verifies the
checksum, records the block in its manifest and confirms (`moves_done`); only then are the DRAM
replicas freed and the SSD replica added. An object with no SSD room is dropped as before.
A get of an object held only on SSD is served from SSD and starts a promotion: a DRAM block on
the same client, filled the same way; the SSD copy is kept (the object then has both, DRAM
first), so readers of the SSD replica are never cut off and evicting it again costs no copy.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from mooncake_cli.store.errors import InvalidParams
from mooncake_cli.store.eviction import choose_victims
from mooncake_cli.store.membership import Membership
from mooncake_cli.store.moves import Move, MoveBook, MoveOrders, MoveResult
from mooncake_cli.store.records import (
    ObjectMeta,
    Replica,
    ReplicaStatus,
    Segment,
    StoreStats,
)


def _same(a: Replica, b: Replica) -> bool:
    return a.segment == b.segment and a.offset == b.offset


class Offloading(Membership):
    """Moves between tiers, on top of the master's core and membership."""

    def __init__(self, **settings: Any) -> None:
        super().__init__(**settings)
        self._moves = MoveBook()
        self._counts.update(offloads=0, promotions=0)

    def stats(self) -> StoreStats:
        with self._lock:
            return replace(super().stats(), moves=len(self._moves))

    # -- the client's side of a move --------------------------------------------------------------
    def poll_moves(self, client_id: str, ack: int = 0) -> MoveOrders:
        """The moves `client_id` should make now and the SSD blocks it should forget (until it
        acknowledges them: `ack` is the `MoveOrders.ack` of the forgets it has dropped)."""
        if not isinstance(client_id, str) or not client_id:
            raise InvalidParams("poll_moves takes a client id")
        if isinstance(ack, bool) or not isinstance(ack, int) or ack < 0:
            raise InvalidParams("poll_moves takes a non-negative ack")
        with self._lock:
            if client_id not in self._clients:
                return MoveOrders(known=False)
            moves = self._moves.hand_out(client_id, self.now(), self.put_timeout)
            forget, last = self._moves.forgets(client_id, ack)
            return MoveOrders(True, moves, forget, last)

    def moves_done(self, client_id: str, results: Sequence[MoveResult]) -> int:
        """Apply the answers of `client_id` to its moves; how many changed an object."""
        if not all(isinstance(r, MoveResult) for r in results):
            raise InvalidParams("moves_done takes a list of MoveResult")
        applied = 0
        with self._lock:
            for res in results:
                p = self._moves.take(client_id, res.id)
                if p is None:
                    continue
                if res.ok and not p.cancelled and self._finish(p.move):
                    applied += 1
                    continue
                self._segments.release(p.move.dst)
                if res.ok and p.move.dst.tier == "ssd":  # the client recorded it: undo that
                    self._moves.forget(client_id, p.move.dst.offset)
        return applied

    def _finish(self, move: Move) -> bool:
        meta = self._objects.get(move.key)
        if meta is None or not meta.complete or not any(_same(r, move.src)
                                                        for r in meta.replicas):
            return False
        dst = replace(move.dst, checksum=move.checksum, status=ReplicaStatus.COMPLETE)
        if move.kind == "offload":
            gone = [r for r in meta.replicas if r.tier == "dram"]
            self._segments.release_all(gone)
            keep = tuple(r for r in meta.replicas if r.tier != "dram") + (dst,)
        else:
            keep = (dst, *meta.replicas)
        self._objects[move.key] = replace(meta, replicas=keep)
        self._counts["offloads" if move.kind == "offload" else "promotions"] += 1
        self._copied[move.kind] = self._copied.get(move.kind, 0) + meta.size
        return True

    # -- scheduling (lock held) -------------------------------------------------------------------
    def _relieve(self, now: float) -> list[str]:
        """Above the DRAM high watermark (offloads under way counted as done), make room by
        `_make_room`; the keys evicted."""
        for p in self._moves.stale(now, self.put_timeout):
            self._segments.release(p.move.dst)
        _, used, cap = self._segments.totals("dram")
        over = used - self._moves.freeing() - self.high_watermark * cap
        if cap == 0 or over <= 0:
            return []
        return self._make_room(now, int(over) + 1, "watermark")

    def _evict(self, now: float, need: int, cause: str) -> list[str]:
        """Room wanted now (a put found none): without SSD segments, plain eviction; with them,
        `_make_room` (an offload frees its DRAM only once copied, so the put may still fail)."""
        if self._segments.totals("ssd")[0] == 0:
            return super()._evict(now, need, cause)
        return self._make_room(now, need, cause)

    def _make_room(self, now: float, need: int, cause: str) -> list[str]:
        """Free at least max(`need`, eviction_ratio x capacity) DRAM bytes, in the policy's
        order: an object with an SSD copy loses its DRAM replicas, one whose client has SSD
        room is offloaded, any other is evicted. The keys evicted (DRAM replicas dropped)."""
        need = max(need, int(self.eviction_ratio * self._segments.totals("dram")[2]))
        idle = self._ordered(lambda m: m.key not in self._moves)
        evicted = []
        for chosen in choose_victims(idle, need, now, "dram", self._segments.aligned):
            meta = self._objects.get(chosen.key)  # an SSD eviction may have changed it
            if meta is None or not any(r.tier == "dram" for r in meta.replicas):
                continue
            if not self._offload(meta, now):
                self._shed(meta, cause)
                evicted.append(meta.key)
        return evicted

    def _offload(self, meta: ObjectMeta, now: float) -> bool:
        """Start moving `meta` to SSD; False when it has an SSD copy already or no room."""
        if any(r.tier == "ssd" for r in meta.replicas):
            return False
        drams = [r for r in meta.replicas if r.tier == "dram"]
        for r in drams:
            seg = self._segments.locate(r)
            dst = self._segments.allocate_on(r.segment, meta.size, "ssd") if seg else None
            if seg is not None and dst is None and self._evict_ssd(r.segment, meta, now):
                dst = self._segments.allocate_on(r.segment, meta.size, "ssd")
            if seg is not None and dst is not None:
                self._moves.add("offload", meta.key, r, dst, r.checksum, seg.client_id,
                                len(drams) * self._segments.aligned(meta.size), now)
                return True
        return False

    def _evict_ssd(self, segment: str, incoming: ObjectMeta, now: float) -> bool:
        """Make room for `incoming` on the SSD mounts of `segment` by evicting the SSD replicas
        there of objects in the policy's order (never leased or hard-pinned ones); whether any
        went. The SSD tier is a cache too: newer evictions displace older ones."""
        def here(m: ObjectMeta) -> bool:
            return m.key not in self._moves and m is not incoming and any(
                r.tier == "ssd" and r.segment == segment for r in m.replicas)

        victims = choose_victims(self._ordered(here),
                                 self._segments.aligned(incoming.size), now, "ssd",
                                 self._segments.aligned)
        for meta in victims:
            gone = [r for r in meta.replicas if r.tier == "ssd" and r.segment == segment]
            for r in gone:
                seg = self._segments.locate(r)
                if seg is not None:
                    self._moves.forget(seg.client_id, r.offset)
            self._segments.release_all(gone)
            keep = tuple(r for r in meta.replicas if r not in gone)
            if keep:
                self._objects[meta.key] = replace(meta, replicas=keep)
            else:
                self._forget(meta.key, evicted=True)
            self._count_eviction("ssd")
        return bool(victims)

    def _promote(self, meta: ObjectMeta, now: float) -> None:
        """After a get of an object held only on SSD, start copying it into DRAM on the same
        client (making room there first when it has none: see `_make_room`)."""
        if meta.key in self._moves or any(r.tier == "dram" for r in meta.replicas):
            return
        for attempt in range(2):
            for r in meta.replicas:
                seg = self._segments.locate(r)
                dst = self._segments.allocate_on(r.segment, meta.size, "dram") if seg else None
                if seg is not None and dst is not None:
                    self._moves.add("promote", meta.key, r, dst, r.checksum, seg.client_id, 0,
                                    now)
                    return
            if attempt == 0:
                for seg_name in {r.segment for r in meta.replicas}:
                    self._evict_on(seg_name, self._segments.aligned(meta.size), now,
                                   "promotion")

    def _evict_on(self, segment: str, need: int, now: float, cause: str) -> list[str]:
        """Free >= `need` bytes of DRAM on transfer segment `segment` alone (room wanted there,
        not anywhere), in the policy's order (no object with a move under way): a
        replica there goes at once when its object keeps another in DRAM; else as `_make_room`
        does (DRAM dropped when on SSD too, offloaded when there is SSD room: freed once copied,
        evicted otherwise). The keys evicted (DRAM replicas dropped)."""
        def here(r: Replica) -> bool:
            return r.tier == "dram" and r.segment == segment

        candidates = self._ordered(lambda m: m.key not in self._moves and
                                   any(here(r) for r in m.replicas))
        freed, lost = 0, []
        for meta in choose_victims(candidates, sys.maxsize, now, "dram", self._segments.aligned):
            if freed >= need:
                break
            gone = [r for r in meta.replicas if here(r)]
            freed += len(gone) * self._segments.aligned(meta.size)
            keep = tuple(r for r in meta.replicas if not here(r))
            if any(r.tier == "dram" for r in keep):
                self._segments.release_all(gone)
                self._objects[meta.key] = replace(meta, replicas=keep)
                self._count_eviction(cause)
            elif not self._offload(meta, now):
                self._shed(meta, cause)
                lost.append(meta.key)
        return lost

    # -- keeping the book right when objects and segments go --------------------------------------
    def _cancel(self, key: str) -> None:
        p = self._moves.cancel(key)
        if p is not None:
            self._segments.release(p.move.dst)

    def _drop(self, key: str) -> None:
        meta = self._objects.get(key)
        self._cancel(key)
        for r in meta.replicas if meta is not None else ():
            seg = self._segments.locate(r) if r.tier == "ssd" else None
            if seg is not None:
                self._moves.forget(seg.client_id, r.offset)
        super()._drop(key)

    def _lose(self, segments: list[Segment]) -> list[str]:
        lost = super()._lose(segments)
        for p in self._moves:
            if self._segments.locate(p.move.dst) is None:
                self._moves.pop(p)
            elif self._segments.locate(p.move.src) is None and \
                    (q := self._moves.call_off(p)) is not None:
                self._segments.release(q.move.dst)
        for cid in {s.client_id for s in segments}:
            if not self._segments.segments(cid):
                self._moves.drop_client(cid)
        return lost
