"""Least recently used first: the store's original order."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Sequence


class LruPolicy:
    """Objects in the order they were last used (admitted, read or renewed)."""

    name = "lru"

    def __init__(self) -> None:
        self._order: OrderedDict[str, None] = OrderedDict()  # least recently used first

    def admit(self, key: str) -> None:
        self._order[key] = None
        self._order.move_to_end(key)

    def touch(self, key: str, hit: bool) -> None:
        if key in self._order:
            self._order.move_to_end(key)

    def chain(self, keys: Sequence[str]) -> None:
        pass

    def remove(self, key: str, evicted: bool) -> None:
        self._order.pop(key, None)

    def victims(self) -> Iterator[str]:
        return iter(self._order)

    def __len__(self) -> int:
        return len(self._order)
