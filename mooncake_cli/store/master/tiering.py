"""The master's side of the SSD tier: offloads instead of drops, promotions after a get, and the
book of moves under way.

An evicted object whose DRAM replica's client also mounts an SSD segment is offloaded rather
than dropped (eviction.py decides when): the master allocates a block on that SSD segment and
hands the client a move (`poll_moves`); the client copies locally, verifies the checksum,
records the block in its manifest and confirms (`moves_done`); only then are the DRAM replicas
freed and the SSD replica added. An object with no SSD room is dropped as before (the SSD tier
is a cache too: older SSD replicas make room for newer evictions, in the policy's order). A get
of an object held only on SSD is served from SSD and starts a promotion: a DRAM block on the
same client, filled the same way; the SSD copy is kept (the object then has both, DRAM first),
so readers of the SSD replica are never cut off and evicting it again costs no copy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from mooncake_cli.store.errors import InvalidParams
from mooncake_cli.store.eviction import choose_victims
from mooncake_cli.store.master.state import MasterState
from mooncake_cli.store.moves import Move, MoveBook, MoveOrders, MoveResult
from mooncake_cli.store.records import Mount, ObjectMeta, Replica, ReplicaStatus, evolve

EvictOn = Callable[[str, int, float, str], list[str]]  # (segment, bytes, now, cause): evicted


def _same(a: Replica, b: Replica) -> bool:
    return a.segment == b.segment and a.offset == b.offset


class Tiering:
    """Moves between tiers over the master's state."""

    def __init__(self, state: MasterState) -> None:
        self.state = state
        self.moves = MoveBook()
        self.hits: dict[str, int] = {}  # gets of SSD-only objects not promoted yet
        state.on_drop.append(self._dropped)
        state.on_lost.append(self._lost)

    # -- the client's side of a move --------------------------------------------------------------
    def poll_moves(self, client_id: str, ack: int = 0) -> MoveOrders:
        """The moves `client_id` should make now and the SSD blocks it should forget (until it
        acknowledges them: `ack` is the `MoveOrders.ack` of the forgets it has dropped)."""
        if not isinstance(client_id, str) or not client_id:
            raise InvalidParams("poll_moves takes a client id")
        if isinstance(ack, bool) or not isinstance(ack, int) or ack < 0:
            raise InvalidParams("poll_moves takes a non-negative ack")
        st = self.state
        with st.lock:
            if client_id not in st.clients:
                return MoveOrders(known=False)
            moves = self.moves.hand_out(client_id, st.now(), st.put_timeout)
            forget, last = self.moves.forgets(client_id, ack)
            return MoveOrders(True, moves, forget, last)

    def moves_done(self, client_id: str, results: Sequence[MoveResult]) -> int:
        """Apply the answers of `client_id` to its moves; how many changed an object."""
        if not all(isinstance(r, MoveResult) for r in results):
            raise InvalidParams("moves_done takes a list of MoveResult")
        applied = 0
        with self.state.lock:
            for res in results:
                p = self.moves.take(client_id, res.id)
                if p is None:
                    continue
                if res.ok and not p.cancelled and self._finish(p.move):
                    applied += 1
                    continue
                self.state.segments.release(p.move.dst)
                if res.ok and p.move.dst.tier == "ssd":  # the client recorded it: undo that
                    self.moves.forget(client_id, p.move.dst.offset)
        return applied

    def _finish(self, move: Move) -> bool:
        st = self.state
        meta = st.objects.get(move.key)
        if meta is None or not meta.complete or not any(_same(r, move.src)
                                                        for r in meta.replicas):
            return False
        dst = evolve(move.dst, checksum=move.checksum, status=ReplicaStatus.COMPLETE)
        if move.kind == "offload":
            gone = [r for r in meta.replicas if r.tier == "dram"]
            st.segments.release_all(gone)
            keep = tuple(r for r in meta.replicas if r.tier != "dram") + (dst,)
        else:
            keep = (dst, *meta.replicas)
        st.set(evolve(meta, replicas=keep))
        st.counts["offloads" if move.kind == "offload" else "promotions"] += 1
        st.count_copy(move.kind, meta.size)
        return True

    # -- starting moves (lock held) --------------------------------------------------------------
    def offload(self, meta: ObjectMeta, now: float) -> bool:
        """Start moving `meta` to SSD; False when it has an SSD copy already, no room, or
        `offload_on_evict` is off."""
        if not self.state.offload_on_evict or any(r.tier == "ssd" for r in meta.replicas):
            return False
        segs = self.state.segments
        drams = [r for r in meta.replicas if r.tier == "dram"]
        for r in drams:
            seg = segs.locate(r)
            if seg is None or not segs.fits_on(r.segment, meta.size, "ssd"):
                continue  # no SSD mount there to hold it (none to evict from either)
            dst = segs.allocate_on(r.segment, meta.size, "ssd")
            if dst is None and self._evict_ssd(r.segment, meta, now):
                dst = segs.allocate_on(r.segment, meta.size, "ssd")
            if dst is not None:
                self.moves.add("offload", meta.key, r, dst, r.checksum, seg.client_id,
                               len(drams) * segs.aligned(meta.size), now)
                return True
        return False

    def _evict_ssd(self, segment: str, incoming: ObjectMeta, now: float) -> bool:
        """Make room for `incoming` on the SSD mounts of `segment` by evicting the SSD replicas
        there of objects in the policy's order (never leased or hard-pinned ones); whether any
        went. The SSD tier is a cache too: newer evictions displace older ones."""
        st = self.state

        def here(m: ObjectMeta) -> bool:
            return m.key not in self.moves and m is not incoming and any(
                r.tier == "ssd" and r.segment == segment for r in m.replicas)

        victims = choose_victims(st.ordered(here), st.segments.aligned(incoming.size), now,
                                 "ssd", st.segments.aligned)
        for meta in victims:
            gone = [r for r in meta.replicas if r.tier == "ssd" and r.segment == segment]
            for r in gone:
                seg = st.segments.locate(r)
                if seg is not None:
                    self.moves.forget(seg.client_id, r.offset)
            st.segments.release_all(gone)
            keep = tuple(r for r in meta.replicas if r not in gone)
            if keep:
                st.set(evolve(meta, replicas=keep))
            else:
                st.forget(meta.key, evicted=True)
            st.count_eviction("ssd")
        return bool(victims)

    def promote(self, meta: ObjectMeta, now: float, evict_on: EvictOn) -> None:
        """After the `promotion_threshold`-th get of an object held only on SSD, start copying
        it into DRAM on the same client (making room there first with `evict_on` when it has
        none); nothing when `promotion_on_hit` is off."""
        st = self.state
        if not st.promotion_on_hit:
            return
        for r in meta.replicas:  # a loop: any() with a generator costs a get 1 µs
            if r.tier == "dram":
                return
        if meta.key in self.moves:
            return
        hits = self.hits[meta.key] = self.hits.get(meta.key, 0) + 1
        if hits < st.promotion_threshold:
            return
        del self.hits[meta.key]
        segs = self.state.segments
        for attempt in range(2):
            for r in meta.replicas:
                seg = segs.locate(r)
                dst = segs.allocate_on(r.segment, meta.size, "dram") if seg else None
                if seg is not None and dst is not None:
                    self.moves.add("promote", meta.key, r, dst, r.checksum, seg.client_id, 0,
                                   now)
                    return
            if attempt == 0:
                for seg_name in {r.segment for r in meta.replicas}:
                    evict_on(seg_name, segs.aligned(meta.size), now, "promotion")

    def expire(self, now: float) -> None:
        """Forget moves never handed out within the put timeout (their client does not poll)."""
        for p in self.moves.stale(now, self.state.put_timeout):
            self.state.segments.release(p.move.dst)

    # -- keeping the book right when objects and segments go (events) ----------------------------
    def _dropped(self, meta: ObjectMeta) -> None:
        self.hits.pop(meta.key, None)
        segs = self.state.segments
        p = self.moves.cancel(meta.key)
        if p is not None:
            segs.release(p.move.dst)
        for r in meta.replicas:
            seg = segs.locate(r) if r.tier == "ssd" else None
            if seg is not None:
                self.moves.forget(seg.client_id, r.offset)

    def _lost(self, segments: list[Mount]) -> None:
        segs = self.state.segments
        for p in self.moves:
            if segs.locate(p.move.dst) is None:
                self.moves.pop(p)
            elif segs.locate(p.move.src) is None and \
                    (q := self.moves.call_off(p)) is not None:
                segs.release(q.move.dst)
        for cid in {s.client_id for s in segments}:
            if not segs.segments(cid):
                self.moves.drop_client(cid)
