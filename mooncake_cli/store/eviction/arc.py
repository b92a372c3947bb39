"""ARC: capacity split between a recency list and a frequency list by where recent misses
would have hit (ARC, Megiddo and Modha, FAST'03).

`recent` holds objects used once in their stay, `frequent` those read again; both least
recently used first. Evicted keys are remembered (keys only) in the ghost list of the side that
evicted them. A new object whose key is in the recency ghost means recency would have kept it:
the recency side's target share `p` grows; one in the frequency ghost shrinks it. Victims come
from the recency side first while it holds more than its share, else from the frequency side.
The capacity `c` the shares are taken of is the number of objects held, as the master's room is
in bytes and objects may differ in size.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Sequence
from itertools import chain


def _push(d: OrderedDict[str, None], key: str) -> None:
    d[key] = None
    d.move_to_end(key)


class ArcPolicy:
    name = "arc"

    def __init__(self, share: float = 0.0, rate: float = 1.0) -> None:
        self.recent: OrderedDict[str, None] = OrderedDict()
        self.frequent: OrderedDict[str, None] = OrderedDict()
        self._ghost_recent: OrderedDict[str, None] = OrderedDict()
        self._ghost_frequent: OrderedDict[str, None] = OrderedDict()
        self.share = share  # the recency side's target share of the objects held
        self.rate = rate

    def _capacity(self) -> int:
        return max(1, len(self.recent) + len(self.frequent))

    def admit(self, key: str) -> None:
        self.recent.pop(key, None)
        self.frequent.pop(key, None)
        c = self._capacity()
        g1, g2 = self._ghost_recent, self._ghost_frequent
        if key in g1:
            self.share = min(1.0, self.share + self.rate * max(len(g2) / len(g1), 1.0) / c)
            del g1[key]
            _push(self.frequent, key)
        elif key in g2:
            self.share = max(0.0, self.share - self.rate * max(len(g1) / len(g2), 1.0) / c)
            del g2[key]
            _push(self.frequent, key)
        else:
            _push(self.recent, key)

    def touch(self, key: str, hit: bool) -> None:
        if key in self.recent:
            if hit:
                del self.recent[key]
                _push(self.frequent, key)
            else:
                self.recent.move_to_end(key)
        elif key in self.frequent:
            self.frequent.move_to_end(key)

    def chain(self, keys: Sequence[str]) -> None:
        pass

    def remove(self, key: str, evicted: bool) -> None:
        if key in self.recent:
            del self.recent[key]
            side = self._ghost_recent
        elif key in self.frequent:
            del self.frequent[key]
            side = self._ghost_frequent
        else:
            return
        if evicted:
            _push(side, key)
            c = self._capacity()
            for ghost in (self._ghost_recent, self._ghost_frequent):
                while len(ghost) > c:
                    ghost.popitem(last=False)

    def victims(self) -> Iterator[str]:
        if self.recent and (len(self.recent) > self.share * len(self) or not self.frequent):
            return chain(self.recent, self.frequent)
        return chain(self.frequent, self.recent)

    def __len__(self) -> int:
        return len(self.recent) + len(self.frequent)
