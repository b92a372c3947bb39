"""The mounted segments, one allocator each, and replica placement across them.

Placement puts the replicas of one object on distinct transfer segments (distinct processes),
preferring distinct hosts, trying the preferred segment first and then the ones with the most
free space. Not thread-safe: the master's lock guards it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from mooncake_cli.store.allocator import DEFAULT_ALIGNMENT, Allocator
from mooncake_cli.store.errors import InvalidReplica, SegmentAlreadyExists, SegmentNotFound
from mooncake_cli.store.records import Mount, Replica, ReplicaStatus, Tier, moved_to


class _Mount:
    __slots__ = ("segment", "alloc")

    def __init__(self, segment: Mount, alignment: int) -> None:
        self.segment = segment
        self.alloc = Allocator(segment.size, alignment)

    def replica(self, off: int, size: int) -> Replica:
        """A pending replica of the block at `off` (a checked mount: it passes its checks)."""
        s = self.segment
        return Replica(s.name, s.base + off, size, s.tier, s.host)


class SegmentTable:
    """Mounts keyed by (transfer segment name, base), grouped by name."""

    def __init__(self, alignment: int = DEFAULT_ALIGNMENT) -> None:
        self.alignment = alignment
        self._by_name: dict[str, list[_Mount]] = {}
        # (aligned size, tier) -> [(name, mounts that can hold it)]: placement's candidates,
        # kept until a mount comes or goes
        self._fit: dict[tuple[int, Tier], list[tuple[str, list[_Mount]]]] = {}
        self._tiers: dict[Tier, list[_Mount]] = {}  # the mounts of each tier, kept as _fit is

    def mount(self, seg: Mount) -> bool:
        """Add a mount; False if this very segment is already mounted (a harmless repeat)."""
        mounts = self._by_name.get(seg.name, [])
        for m in mounts:
            if m.segment == seg:
                return False
            old = m.segment
            if old.client_id != seg.client_id or old.host != seg.host:
                raise SegmentAlreadyExists(
                    f"segment {seg.name} is mounted by client {old.client_id} on {old.host}")
            if seg.base < old.base + old.size and old.base < seg.base + seg.size:
                raise SegmentAlreadyExists(
                    f"segment {seg.name} range [{seg.base}, {seg.base + seg.size}) overlaps "
                    f"the mount at base {old.base}")
        self._by_name.setdefault(seg.name, []).append(_Mount(seg, self.alignment))
        self._fit.clear()
        self._tiers.clear()
        return True

    def unmount(self, name: str, base: int | None = None) -> list[Mount]:
        """Remove the mounts of `name` (only the one at `base` when given); what was removed."""
        mounts = self._by_name.get(name, [])
        gone = [m for m in mounts if base is None or m.segment.base == base]
        self._fit.clear()
        self._tiers.clear()
        if not gone:
            where = "" if base is None else f" at base {base}"
            raise SegmentNotFound(f"segment {name}{where} is not mounted")
        kept = [m for m in mounts if m not in gone]
        if kept:
            self._by_name[name] = kept
        else:
            del self._by_name[name]
        return [m.segment for m in gone]

    def segments(self, client_id: str | None = None) -> list[Mount]:
        return [m.segment for m in self._mounts()
                if client_id is None or m.segment.client_id == client_id]

    def usage(self) -> list[tuple[Mount, int]]:
        """(segment, allocated bytes) of every mount."""
        return [(m.segment, m.alloc.used) for m in self._mounts()]

    def totals(self, tier: Tier) -> tuple[int, int, int]:
        """(mounts, used bytes, capacity) over every mount of `tier`."""
        ms = self._tiers.get(tier)
        if ms is None:
            ms = self._tiers[tier] = [m for m in self._mounts() if m.segment.tier == tier]
        if len(ms) == 1:  # one mount: no generator sums (1 µs of every put start)
            a = ms[0].alloc
            return 1, a.used, a.capacity
        return len(ms), sum(m.alloc.used for m in ms), sum(m.alloc.capacity for m in ms)

    def fitting(self, size: int, tier: Tier) -> int:
        """How many distinct segments have a `tier` mount large enough for `size` bytes."""
        return len(self._fitting(self.aligned(size), tier))

    def _mounts(self) -> Iterator[_Mount]:
        for ms in self._by_name.values():
            yield from ms

    def _find(self, r: Replica) -> _Mount | None:
        for m in self._by_name.get(r.segment, ()):
            if m.segment.holds(r.offset, r.size):
                return m
        return None

    def locate(self, r: Replica) -> Mount | None:
        """The mount holding replica `r`, None if its segment is gone."""
        m = self._find(r)
        return m.segment if m is not None else None

    def client_of(self, r: Replica) -> str | None:
        """The client id of the mount holding replica `r`, None if its segment is gone."""
        m = self._find(r)
        return m.segment.client_id if m is not None else None

    def aligned(self, size: int) -> int:
        return -(-size // self.alignment) * self.alignment

    def _fitting(self, need: int, tier: Tier) -> list[tuple[str, list[_Mount]]]:
        """Per transfer segment name, its `tier` mounts that can hold `need` bytes at all."""
        fit = self._fit.get((need, tier))
        if fit is None:
            fit = self._fit[(need, tier)] = [
                (name, mounts) for name, ms in self._by_name.items()
                if (mounts := [m for m in ms if m.segment.tier == tier
                               and m.alloc.capacity >= need])]
        return fit

    def allocate(self, size: int, n: int, tier: Tier, preferred: str | Sequence[str] = "",
                 least: int | None = None) -> list[Replica]:
        """`n` pending replicas of `size` bytes on distinct segments (the `preferred` ones first,
        in order), or [] (nothing held) when fewer than `least` (default `n`) fit."""
        fit = self._fitting(self.aligned(size), tier)
        if len(fit) == 1 and n >= 1:  # one segment to place on (a single-node store)
            r = self._alloc_on(fit[0][1], size)
            if r is None:
                return []
            if (n if least is None else least) > 1:
                self.release(r)
                return []
            return [r]
        order = [preferred] if isinstance(preferred, str) else list(preferred)
        rank = {name: i for i, name in reversed(list(enumerate(order)))}
        candidates = [(rank.get(name, len(order)), -sum(m.alloc.free_bytes for m in mounts),
                       name, mounts) for name, mounts in fit]
        if len(candidates) > 1:
            candidates.sort(key=lambda c: c[:3])
        chosen: list[Replica] = []
        used_names: set[str] = set()
        used_hosts: set[str] = set()
        for distinct_hosts in (True, False):
            for _, _, name, mounts in candidates:
                if len(chosen) == n:
                    break
                host = mounts[0].segment.host
                if name in used_names or (distinct_hosts and host in used_hosts):
                    continue
                r = self._alloc_on(mounts, size)
                if r is not None:
                    chosen.append(r)
                    used_names.add(name)
                    used_hosts.add(host)
        if len(chosen) < (n if least is None else least):
            self.release_all(chosen)
            return []
        return chosen

    def carve(self, size: int, count: int, tier: Tier) -> list[Replica]:
        """`count` pending replicas of `size` bytes, one run of blocks cut at once, when exactly
        one `tier` mount of one segment can hold them (a single-node store: where `allocate`
        would put each of them); [] otherwise or when no free block holds the run."""
        fit = self._fitting(self.aligned(size), tier)
        if count < 2 or len(fit) != 1 or len(fit[0][1]) != 1:
            return []
        m = fit[0][1][0]
        offsets = m.alloc.alloc_run(size, count)
        if offsets is None:
            return []
        first, base = m.replica(offsets[0], size), m.segment.base
        return [first, *moved_to(first, (base + off for off in offsets[1:]))]

    def _mounts_on(self, name: str, size: int, tier: Tier) -> list[_Mount]:
        """The `tier` mounts of transfer segment `name` large enough for `size` bytes."""
        need = self.aligned(size)
        return [m for m in self._by_name.get(name, ())
                if m.segment.tier == tier and m.alloc.capacity >= need]

    def fits_on(self, name: str, size: int, tier: Tier) -> bool:
        """Whether transfer segment `name` has a `tier` mount large enough for `size` bytes."""
        return bool(self._mounts_on(name, size, tier))

    def allocate_on(self, name: str, size: int, tier: Tier) -> Replica | None:
        """A pending replica of `size` bytes on a `tier` mount of transfer segment `name` (one
        client), or None when none has room; offloads and promotions stay on their client."""
        mounts = self._mounts_on(name, size, tier)
        return self._alloc_on(mounts, size) if mounts else None

    def _alloc_on(self, mounts: list[_Mount], size: int) -> Replica | None:
        for m in (sorted(mounts, key=lambda m: -m.alloc.free_bytes) if len(mounts) > 1
                  else mounts):
            off = m.alloc.alloc(size)
            if off is not None:
                return m.replica(off, size)
        return None

    def release(self, r: Replica) -> int:
        """Free replica `r`'s block; its aligned length, 0 if its segment is already gone."""
        m = self._find(r)
        if m is None or m.alloc.size_of(r.offset - m.segment.base) is None:
            return 0
        return m.alloc.free(r.offset - m.segment.base)

    def release_all(self, replicas: list[Replica] | tuple[Replica, ...]) -> int:
        return sum(self.release(r) for r in replicas)

    def claim(self, r: Replica) -> Replica:
        """Reserve the block a re-registered replica occupies; the replica as the master keeps it
        (complete, host and tier from the mount). SegmentNotFound / InvalidReplica on conflict."""
        m = self._find(r)
        if m is None:
            raise SegmentNotFound(f"no mounted segment {r.segment} holds "
                                  f"[{r.offset}, {r.offset + r.size})")
        if m.segment.tier != r.tier:
            raise InvalidReplica(f"replica on {r.segment} says tier {r.tier}, the mount is "
                                 f"{m.segment.tier}")
        rel = r.offset - m.segment.base
        if rel % self.alignment or rel + self.aligned(r.size) > m.alloc.capacity:
            raise InvalidReplica(f"replica at {r.offset} on {r.segment} is not aligned to "
                                 f"{self.alignment} or overruns the segment")
        if not m.alloc.reserve(rel, r.size):
            raise InvalidReplica(f"replica at {r.offset} on {r.segment} overlaps another object")
        return Replica(r.segment, r.offset, r.size, m.segment.tier, m.segment.host, r.checksum,
                       ReplicaStatus.COMPLETE)
