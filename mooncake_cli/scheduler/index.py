"""The global cache index: which instance holds which KV block keys.

Each instance's blocks are kept in LRU order with an optional capacity in blocks; storing past
the capacity evicts the least recently used blocks (and says which). Without a capacity the
index only follows events (a store or instance that evicts on its own reports `evicted`).
Block keys are any hashable value: the chained hash keys of the live system, or trace hash ids.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass

from mooncake_cli.scheduler.prefix_match import PrefixMatch

EVENT_KINDS = ("stored", "touched", "evicted", "dropped")


@dataclass(frozen=True)
class CacheEvent:
    """What an instance or the store reports: blocks `stored` (or re-used: `touched`),
    `evicted`, or the whole instance `dropped` (dead or deregistered)."""

    kind: str
    instance: str
    keys: tuple[Hashable, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in EVENT_KINDS:
            raise ValueError(f"cache event kind must be one of {', '.join(EVENT_KINDS)}, "
                             f"not {self.kind!r}")


class CacheIndex:
    """Block key -> holders, and per instance an LRU of its keys."""

    def __init__(self) -> None:
        self._lru: dict[str, OrderedDict[Hashable, None]] = {}
        self._capacity: dict[str, int | None] = {}
        self._holders: dict[Hashable, set[str]] = {}

    # -- membership -----------------------------------------------------------------------
    def add_instance(self, name: str, capacity_blocks: int | None = None) -> None:
        if capacity_blocks is not None and capacity_blocks < 0:
            raise ValueError(f"capacity of {name} must be >= 0 blocks, not {capacity_blocks}")
        self._lru.setdefault(name, OrderedDict())
        self._capacity[name] = capacity_blocks

    def instances(self) -> list[str]:
        return list(self._lru)

    def knows(self, name: str) -> bool:
        return name in self._lru

    def drop(self, name: str) -> None:
        """Forget an instance and everything it held."""
        for key in self._lru.pop(name, {}):
            self._unhold(key, name)
        self._capacity.pop(name, None)

    # -- events ---------------------------------------------------------------------------
    def apply(self, event: CacheEvent) -> list[Hashable]:
        """Apply one event; returns the keys evicted to make room (for `stored`)."""
        if event.kind == "dropped":
            self.drop(event.instance)
            return []
        if event.kind == "evicted":
            self.evict(event.instance, event.keys)
            return []
        if event.kind == "touched":
            self.touch(event.instance, event.keys)
            return []
        return self.store(event.instance, event.keys)

    def store(self, name: str, keys: Iterable[Hashable]) -> list[Hashable]:
        """`keys` now held by `name` as most recently used; returns the LRU keys evicted."""
        lru = self._lru.get(name)
        if lru is None:
            self.add_instance(name)
            lru = self._lru[name]
        for key in keys:
            if key in lru:
                lru.move_to_end(key)
            else:
                lru[key] = None
                self._holders.setdefault(key, set()).add(name)
        cap = self._capacity.get(name)
        evicted: list[Hashable] = []
        if cap is not None:
            while len(lru) > cap:
                key, _ = lru.popitem(last=False)
                self._unhold(key, name)
                evicted.append(key)
        return evicted

    def touch(self, name: str, keys: Iterable[Hashable]) -> None:
        """Mark held keys as recently used (a cache hit); keys not held are ignored."""
        lru = self._lru.get(name)
        if lru is None:
            return
        for key in keys:
            if key in lru:
                lru.move_to_end(key)

    def evict(self, name: str, keys: Iterable[Hashable]) -> None:
        lru = self._lru.get(name)
        if lru is None:
            return
        for key in keys:
            if lru.pop(key, 0) is None:
                self._unhold(key, name)

    def _unhold(self, key: Hashable, name: str) -> None:
        holders = self._holders.get(key)
        if holders is not None:
            holders.discard(name)
            if not holders:
                del self._holders[key]

    # -- queries --------------------------------------------------------------------------
    def holders(self, key: Hashable) -> frozenset[str]:
        return frozenset(self._holders.get(key, ()))

    def blocks(self, name: str) -> int:
        return len(self._lru.get(name, ()))

    def prefix_match(self, keys: Sequence[Hashable], small: int) -> PrefixMatch:
        """The prefix lengths of `keys`, wide levels (over `small` holders) kept as sets;
        valid until the index next changes."""
        return PrefixMatch(self._holders, self._lru, keys, small)

    def key_count(self) -> int:
        """Distinct keys held by some instance."""
        return len(self._holders)

    def most_holders(self) -> int:
        """The number of instances holding the most widely held key."""
        return max(map(len, self._holders.values()), default=0)

    def prefix_len(self, name: str, keys: Sequence[Hashable]) -> int:
        """Leading blocks of `keys` that `name` holds."""
        lru = self._lru.get(name)
        if lru is None:
            return 0
        n = 0
        for key in keys:
            if key not in lru:
                break
            n += 1
        return n

    def prefix_lengths(self, keys: Sequence[Hashable]) -> dict[str, int]:
        """Leading blocks of `keys` held, for every instance holding at least the first one.

        Walks the keys once, narrowing the set of instances still matching: the cost is the
        number of (key, holder) pairs on the matched prefix, not the number of instances."""
        out: dict[str, int] = {}
        if not keys:
            return out
        alive = set(self._holders.get(keys[0], ()))
        i = 1
        while alive and i < len(keys):
            nxt = self._holders.get(keys[i])
            keep = alive & nxt if nxt else set()
            for name in alive - keep:
                out[name] = i
            alive = keep
            i += 1
        for name in alive:
            out[name] = i
        return out
