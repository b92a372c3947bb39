"""Short answers: a batch whose every key has one replica on one segment is answered with one
record of the segment and a list per field, instead of a record per key (what a client holding
its own replicas gets; a client asks with the request's `runs`). Anything else is answered per
key as before. Decoding checks the fields as the long answer's records do."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from mooncake_cli.store.errors import InvalidParams
from mooncake_cli.store.records import Replica, ReplicaStatus, Tier, moved_to
from mooncake_cli.store.wire.requests import MAX_BATCH, Checksum, SegmentName, Size


def _single(results: list[Any], status: ReplicaStatus) -> list[Replica] | None:
    """Each key's one replica, when every key of a batch's per-key `results` has exactly one,
    all `status`, on one segment (host, tier) and with no ledger record; else None."""
    if not results or type(first := results[0]) is not tuple or len(first) != 1:
        return None
    seg, host, tier = first[0].segment, first[0].host, first[0].tier
    out = []
    for rs in results:
        if type(rs) is not tuple or len(rs) != 1:
            return None
        r = rs[0]
        if r.segment != seg or r.host != host or r.tier != tier or r.status is not status or \
                r.note_at or r.note_seq:
            return None
        out.append(r)
    return out


class Run(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A batch_put_start answer in short: every key started with one pending replica of `size`
    bytes on `segment` (of `host`, `tier`), at `offsets[i]` for the i-th key (what a writer
    holding its own replicas gets: one record of the segment instead of one per key)."""

    segment: SegmentName
    host: Annotated[str, msgspec.Meta(max_length=1024)]
    tier: Tier
    size: Size
    offsets: Annotated[list[Annotated[int, msgspec.Meta(ge=0)]],
                       msgspec.Meta(max_length=MAX_BATCH)]

    @classmethod
    def of(cls, started: list[Any]) -> Run | None:
        """The Run of a batch_put_start's per-key results, None where none describes them."""
        one = _single(started, ReplicaStatus.PENDING) if len(started) > 1 else None
        if one is None:
            return None
        size = one[0].size
        if any(r.size != size or r.checksum is not None for r in one):
            return None
        return cls(one[0].segment, one[0].host, one[0].tier, size, [r.offset for r in one])

    def replicas(self) -> list[list[Replica]]:
        """Per key, its replicas as the long answer lists them."""
        if not self.offsets:
            return []
        first = Replica(self.segment, self.offsets[0], self.size, self.tier, self.host)
        return [[first], *([r] for r in moved_to(first, self.offsets[1:]))]  # offsets >= 0


class Found(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A batch_get_replica_list answer in short: every key has one complete replica, all on
    `segment` (of `host`, `tier`); the i-th key's at `offsets[i]`, `sizes[i]` bytes long,
    with checksum `checksums[i]` (a reader of its own segment's keys gets this)."""

    segment: SegmentName
    host: Annotated[str, msgspec.Meta(max_length=1024)]
    tier: Tier
    offsets: Annotated[list[Annotated[int, msgspec.Meta(ge=0)]],
                       msgspec.Meta(max_length=MAX_BATCH)]
    sizes: Annotated[list[Size], msgspec.Meta(max_length=MAX_BATCH)]
    checksums: Annotated[list[Checksum | None], msgspec.Meta(max_length=MAX_BATCH)]

    @classmethod
    def of(cls, found: list[Any]) -> Found | None:
        """The Found of a batch_get_replica_list's per-key results, None where none fits."""
        one = _single(found, ReplicaStatus.COMPLETE)
        if one is None:
            return None
        return cls(one[0].segment, one[0].host, one[0].tier, [r.offset for r in one],
                   [r.size for r in one], [r.checksum for r in one])

    def replicas(self) -> list[list[Replica]]:
        """Per key, its replicas as the long answer lists them."""
        if not len(self.offsets) == len(self.sizes) == len(self.checksums):
            raise InvalidParams("a short answer's lists differ in length")
        seg, tier, host, done = self.segment, self.tier, self.host, ReplicaStatus.COMPLETE
        return [[Replica(seg, off, size, tier, host, csum, done)]
                for off, size, csum in zip(self.offsets, self.sizes, self.checksums,
                                           strict=True)]
