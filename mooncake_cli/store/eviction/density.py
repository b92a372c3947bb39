"""Hit density: evict the object with the fewest expected hits per unit of room-time, from what
this cache has seen so far (no knowledge of the future; LHD, Beckmann et al., NSDI'18, in a
simple form).

Objects fall in classes by how often they were used again (read, or put again after eviction;
capped at CLASSES-1); objects not used yet that came as one chain of 4 or more (a prefix put in
one batch, `chain`) are told apart by the chain's length, in log-4 classes of their own (4-15,
16-63, 64+ blocks): a chain is judged as one, by what chains of its length did before. Two
things are learnt online, from the accesses alone:
- per class, the share of objects that were used again (read, or put again after eviction: the
  keys of evicted objects are remembered, up to GHOSTS x objects held), as odds o(c);
- over all classes, the distribution of reuse gaps, in log buckets: the survival S(a) (the share
  of gaps longer than a) and the mean residual gap R(a).
Time is counted in objects admitted (the cache's turnover: a read takes no room), so the age a
of an object is the number admitted since its last use. An object of class c and age a is worth
p / R(a), where p, the chance it is used again, is o(c) S(a) / (1 + o(c) S(a)). The estimates
are refitted every PERIOD accesses (admissions and reads), the counts decayed by DECAY then.
Victims are the heads of the classes (each class's oldest: within a class, worth is taken to
fall with age), least worth first.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterator, Sequence

PER_OCTAVE = 4  # age buckets per doubling
BUCKETS = 28 * PER_OCTAVE
CLASSES = 6
LENGTHS = 3  # classes of unused objects by the length of the chain they came in
KINDS = CLASSES + LENGTHS
GHOSTS = 8  # evicted keys remembered, x objects held
PERIOD = 2048  # accesses between refits
DECAY = 0.999  # counts kept at each refit
MID = [2 ** ((b + 0.5) / PER_OCTAVE) for b in range(BUCKETS)]


def after_use(c: int) -> int:
    """The class of an object of class `c` used once more."""
    return 1 if c >= CLASSES else min(CLASSES - 1, c + 1)


def length_class(n: int) -> int:
    """The class of an unused object that came in a chain of `n` (0: too short to tell)."""
    return 0 if n < 4 else CLASSES + min(LENGTHS - 1, (n.bit_length() - 3) // 2)


def _bucket(age: int) -> int:
    return min(BUCKETS - 1, int(math.log2(age + 1) * PER_OCTAVE))


_SMALL = [_bucket(a) for a in range(1 << 14)]  # the buckets of the common ages, looked up


def bucket(age: int) -> int:
    """The log bucket of an age (objects admitted since)."""
    return _SMALL[age] if 0 <= age < len(_SMALL) else _bucket(age)


class HitDensityPolicy:
    name = "density"

    def __init__(self) -> None:
        self.queues: list[OrderedDict[str, None]] = [OrderedDict() for _ in range(KINDS)]
        self._class: dict[str, int] = {}
        self._last: dict[str, int] = {}  # key -> clock at its last use
        self._ghosts: OrderedDict[str, tuple[int, int]] = OrderedDict()  # evicted: class, last
        self.clock = 0
        self._gaps = [0.0] * BUCKETS
        self._entries = [1.0] * KINDS  # prior: 0.3 of objects used again
        self._reused = [0.3] * KINDS
        self.odds = [0.4] * KINDS
        self.survival = [1.0] * BUCKETS
        self.residual = [1.0] * BUCKETS
        self._since = 0

    # -- learning --------------------------------------------------------------------------------
    def _tick(self, admitted: bool) -> None:
        self.clock += admitted
        self._since += 1
        if self._since >= PERIOD:
            self._since = 0
            self.refit()

    def refit(self) -> None:
        """The odds per class, S and R from the counts so far; then the counts decay."""
        for c in range(KINDS):
            p = min(0.99, self._reused[c] / self._entries[c])
            self.odds[c] = p / (1 - p)
        total = sum(self._gaps)
        longer = total
        for b in range(BUCKETS):
            longer -= self._gaps[b]
            self.survival[b] = (longer + 1e-3) / (total + 1e-3) if total else 1.0
        n = w = 0.0
        for b in range(BUCKETS - 1, -1, -1):
            n += self._gaps[b]
            w += self._gaps[b] * MID[b]
            self.residual[b] = max(1.0, w / n - MID[b] if n else 1.0) + MID[0]
        self._gaps = [g * DECAY for g in self._gaps]
        self._entries = [e * DECAY for e in self._entries]
        self._reused = [r * DECAY for r in self._reused]

    def _reuse(self, c: int, last: int) -> None:
        self._gaps[bucket(self.clock - last)] += 1
        self._reused[c] += 1

    def _place(self, key: str, c: int) -> None:
        old = self._class.get(key)
        if old is not None:
            del self.queues[old][key]
        self._class[key] = c
        self.queues[c][key] = None
        self._last[key] = self.clock
        self._entries[c] += 1

    def worth(self, key: str) -> float:
        """Expected hits per admission of the room `key` holds now."""
        b = bucket(self.clock - self._last[key])
        o = self.odds[self._class[key]] * self.survival[b]
        return o / (1 + o) / self.residual[b]

    # -- the policy ------------------------------------------------------------------------------
    def admit(self, key: str) -> None:
        self._tick(True)
        ghost = self._ghosts.pop(key, None)
        if ghost is not None:  # used again, after its eviction
            self._reuse(*ghost)
            self._place(key, after_use(ghost[0]))
        else:
            self._place(key, 0)

    def touch(self, key: str, hit: bool) -> None:
        c = self._class.get(key)
        if c is None:
            return
        if hit:
            self._tick(False)
            self._reuse(c, self._last[key])
            self._place(key, after_use(c))
        else:
            self.queues[c].move_to_end(key)
            self._last[key] = self.clock

    def chain(self, keys: Sequence[str]) -> None:
        """Unused objects of a chain of 4 or more move to its length's class (their entry
        counted there, not in class 0)."""
        c = length_class(len(keys))
        if not c:
            return
        for key in keys:
            if self._class.get(key) == 0:
                self._entries[0] = max(0.0, self._entries[0] - 1)
                self._place(key, c)

    def remove(self, key: str, evicted: bool) -> None:
        c = self._class.pop(key, None)
        if c is None:
            return
        del self.queues[c][key]
        last = self._last.pop(key)
        if evicted:
            self._ghosts[key] = (c, last)
            while len(self._ghosts) > GHOSTS * max(1, len(self._class)):
                self._ghosts.popitem(last=False)

    def victims(self) -> Iterator[str]:
        """Least worth first among the classes' heads; a head's worth is computed when it
        becomes one (nothing it depends on changes while victims are taken)."""
        its = [iter(q) for q in self.queues]
        heads = [next(it, None) for it in its]
        worths = [self.worth(h) if h is not None else math.inf for h in heads]
        while True:
            best = min(worths)
            if best == math.inf:
                return
            pick = worths.index(best)
            yield heads[pick]  # type: ignore[misc]
            head = heads[pick] = next(its[pick], None)
            worths[pick] = self.worth(head) if head is not None else math.inf

    def __len__(self) -> int:
        return len(self._class)
