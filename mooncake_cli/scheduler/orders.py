"""Live instances kept in the orders the scheduler searches them in, so that a decision looks
at the few instances that can win instead of all of them.

Both orders are lazy heaps: an instance whose state changed (InstanceState reports it through
`touch`) gets a new entry with a new stamp when the order is next read, and its older entries
are skipped as stale. Reading in order (`walk`) does not pop the heap: it keeps a frontier of
heap positions, so visiting k instances costs O(k log k) and changes nothing.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mooncake_cli.scheduler.state import InstanceState


def _in_order(heap: list[Any], valid: Callable[[Any], bool]) -> Iterator[Any]:
    """The valid entries of a heap, smallest first, without modifying it."""
    if not heap:
        return
    frontier = [(heap[0], 0)]
    n = len(heap)
    while frontier:
        entry, i = heapq.heappop(frontier)
        if valid(entry):
            yield entry
        for j in (2 * i + 1, 2 * i + 2):
            if j < n:
                heapq.heappush(frontier, (heap[j], j))


class _Lazy:
    """Stamps, pending changes and the live set shared by both orders."""

    def __init__(self) -> None:
        self._insts: dict[str, InstanceState] = {}
        self._stamp: dict[str, int] = {}
        self._dirty: dict[str, InstanceState] = {}
        self._live: set[str] = set()

    def add(self, inst: InstanceState) -> None:
        self._insts[inst.name] = inst
        self._dirty[inst.name] = inst

    def remove(self, name: str) -> None:
        self._insts.pop(name, None)
        self._dirty.pop(name, None)
        self._live.discard(name)
        self._stamp[name] = self._stamp.get(name, 0) + 1

    def touch(self, inst: InstanceState) -> None:
        """`inst` changed: reorder it before the next read."""
        if inst.name in self._insts:
            self._dirty[inst.name] = inst

    def _flush(self) -> list[tuple[InstanceState, int]]:
        """Re-stamp the changed instances; the live ones, with their new stamps."""
        out = []
        for name, inst in self._dirty.items():
            st = self._stamp[name] = self._stamp.get(name, 0) + 1
            if inst.alive:
                self._live.add(name)
                out.append((inst, st))
            else:
                self._live.discard(name)
        self._dirty.clear()
        return out

    def _compact_due(self, entries: int) -> bool:
        return entries > 2 * len(self._live) + 64


class QueueOrder(_Lazy):
    """Live prefill instances by estimated start time, max(busy_until, now), then name: the
    idle ones as a sorted list of names (and one in registration order), then the busy ones
    by busy_until."""

    def __init__(self) -> None:
        super().__init__()
        self._busy: list[tuple[float, str, int]] = []
        self._idle: list[str] = []
        self._idle_added: list[tuple[int, str]] = []  # (registration number, name)
        self._added: dict[str, int] = {}
        self._numbers = itertools.count()
        self._now = -math.inf

    def add(self, inst: InstanceState) -> None:
        super().add(inst)
        self._added[inst.name] = next(self._numbers)

    def live_count(self, now: float) -> int:
        self._sync(now)
        return len(self._live)

    def remove(self, name: str) -> None:
        self._unidle(name)
        super().remove(name)
        self._added.pop(name, None)

    def _unidle(self, name: str) -> None:
        i = bisect.bisect_left(self._idle, name)
        if i < len(self._idle) and self._idle[i] == name:
            del self._idle[i]
            entry = (self._added[name], name)
            j = bisect.bisect_left(self._idle_added, entry)
            del self._idle_added[j]

    def _enidle(self, name: str) -> None:
        bisect.insort(self._idle, name)
        bisect.insort(self._idle_added, (self._added[name], name))

    def _sync(self, now: float) -> None:
        if now < self._now or self._compact_due(len(self._busy)):
            self._busy, self._idle, self._idle_added = [], [], []  # idle depends on now
            self._dirty.update((n, self._insts[n]) for n in self._live)
        self._now = now
        if self._dirty:
            for name in self._dirty:
                self._unidle(name)
            for inst, st in self._flush():
                if inst.busy_until <= now:
                    self._enidle(inst.name)
                else:
                    heapq.heappush(self._busy, (inst.busy_until, inst.name, st))
        busy, stamp = self._busy, self._stamp
        while busy and (busy[0][0] <= now or stamp.get(busy[0][1]) != busy[0][2]):
            _, name, st = heapq.heappop(busy)
            if stamp.get(name) == st:
                self._enidle(name)
                stamp[name] = st + 1  # its busy entries are void now

    def idle(self, now: float) -> list[str]:
        """The names of the live instances idle at `now` (busy_until <= now), sorted; the
        order's own list, valid until the next change."""
        self._sync(now)
        return self._idle

    def idle_first_added(self, now: float, count: int) -> list[str]:
        """The names of the first `count` live instances idle at `now`, in the order they
        were added."""
        self._sync(now)
        return [name for _, name in self._idle_added[:count]]

    def busy(self, now: float) -> Iterator[InstanceState]:
        """Live instances busy at `now`, by (busy_until, name). Changes made meanwhile count
        from the next read; nothing that reads this order may run inside the walk."""
        self._sync(now)
        stamp, insts = self._stamp, self._insts
        for _, name, _ in _in_order(self._busy, lambda e: stamp.get(e[1]) == e[2]):
            yield insts[name]

    def walk(self, now: float) -> Iterator[InstanceState]:
        """Every live instance in order: the idle ones, then the busy ones."""
        for name in list(self.idle(now)):
            yield self._insts[name]
        yield from self.busy(now)


class DecodeOrder(_Lazy):
    """Live decode instances by (KV tokens held, name), held as `InstanceState.held_tokens()`
    says."""

    def __init__(self) -> None:
        super().__init__()
        self._heap: list[tuple[int, str, int]] = []

    def live_count(self) -> int:
        self._sync()
        return len(self._live)

    def _sync(self) -> None:
        if self._compact_due(len(self._heap)):
            self._heap = []
            self._dirty.update((n, self._insts[n]) for n in self._live)
        for inst, st in self._flush():
            heapq.heappush(self._heap, (inst.held_tokens(), inst.name, st))
        heap, stamp = self._heap, self._stamp
        while heap and stamp.get(heap[0][1]) != heap[0][2]:  # stale tops would be walked
            heapq.heappop(heap)

    def walk(self) -> Iterator[InstanceState]:
        """Live instances in order (as `QueueOrder.walk`)."""
        self._sync()
        stamp, insts = self._stamp, self._insts
        for entry in _in_order(self._heap, lambda e: stamp.get(e[1]) == e[2]):
            yield insts[entry[1]]
