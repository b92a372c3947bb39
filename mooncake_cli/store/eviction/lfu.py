"""Least frequently used first, in frequency buckets; ties go least recently used first.

An object starts at one use when admitted and gains one per read (`touch` with hit); a renewal
(put ended, replica added) refreshes its place among equals without counting. Frequencies are
those of the object's present stay: an evicted object comes back at one.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from collections.abc import Iterator, Sequence


class LfuPolicy:
    """Frequency buckets: each an LRU list of the objects with that many uses."""

    name = "lfu"

    def __init__(self) -> None:
        self._freq: dict[str, int] = {}
        self._buckets: dict[int, OrderedDict[str, None]] = {}
        self._levels: list[int] = []  # the frequencies with a bucket, ascending

    def _place(self, key: str, f: int) -> None:
        bucket = self._buckets.get(f)
        if bucket is None:
            bucket = self._buckets[f] = OrderedDict()
            bisect.insort(self._levels, f)
        bucket[key] = None
        self._freq[key] = f

    def _unplace(self, key: str) -> int:
        f = self._freq.pop(key)
        bucket = self._buckets[f]
        del bucket[key]
        if not bucket:
            del self._buckets[f]
            del self._levels[bisect.bisect_left(self._levels, f)]
        return f

    def admit(self, key: str) -> None:
        if key in self._freq:
            self._unplace(key)
        self._place(key, 1)

    def touch(self, key: str, hit: bool) -> None:
        if key in self._freq:
            self._place(key, self._unplace(key) + (1 if hit else 0))

    def chain(self, keys: Sequence[str]) -> None:
        pass

    def remove(self, key: str, evicted: bool) -> None:
        if key in self._freq:
            self._unplace(key)

    def frequency(self, key: str) -> int:
        """Uses of `key` in its present stay (0: not held)."""
        return self._freq.get(key, 0)

    def victims(self) -> Iterator[str]:
        for f in self._levels:
            yield from self._buckets[f]

    def __len__(self) -> int:
        return len(self._freq)
