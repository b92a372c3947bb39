"""Adaptive: the order of whichever expert policy has been hitting most lately.

The experts (LRU, LFU and ARC, itself a split of capacity between a recency and a frequency list
by ghost hits: arc.py) each order the objects held, and each also runs as a shadow cache, keys
only, as large as the most objects the master has held, over the same accesses. The shadow that
would have found more of the recent accesses (hits decayed by half every `half_life` x objects
held accesses) lends its order to the victims. Reads count as accesses, and so do new objects
(a miss: a shadow that still holds the key would have hit).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from mooncake_cli.interfaces import EvictionPolicy
from mooncake_cli.store.eviction.arc import ArcPolicy
from mooncake_cli.store.eviction.lfu import LfuPolicy
from mooncake_cli.store.eviction.lru import LruPolicy

HALF_LIFE = 1.0
EXPERTS: tuple[Callable[[], EvictionPolicy], ...] = (LruPolicy, LfuPolicy, ArcPolicy)


class Shadow:
    """A cache of keys run by `policy` with room for `room` of them: would it have hit?"""

    def __init__(self, policy: EvictionPolicy) -> None:
        self.policy = policy
        self.held: set[str] = set()

    def access(self, key: str, room: int) -> bool:
        if key in self.held:
            self.policy.touch(key, True)
            return True
        while len(self.held) >= room:
            victim = next(self.policy.victims())
            self.policy.remove(victim, True)
            self.held.discard(victim)
        self.policy.admit(key)
        self.held.add(key)
        return False


class AdaptivePolicy:
    name = "adaptive"

    def __init__(self, experts: Sequence[Callable[[], EvictionPolicy]] = EXPERTS,
                 half_life: float = HALF_LIFE) -> None:
        self.experts = [make() for make in experts]
        self._shadows = [Shadow(make()) for make in experts]
        self.scores = [0.0] * len(self.experts)  # decayed recent hits of each shadow
        self._held: set[str] = set()
        self._room = 1  # the most objects held so far: the shadows' size
        self._half_life = half_life

    @property
    def leader(self) -> EvictionPolicy:
        return self.experts[max(range(len(self.scores)), key=self.scores.__getitem__)]

    def _access(self, key: str) -> None:
        self._room = max(self._room, len(self._held))
        keep = 0.5 ** (1.0 / (self._half_life * self._room))
        for i, shadow in enumerate(self._shadows):
            self.scores[i] = self.scores[i] * keep + shadow.access(key, self._room)

    def admit(self, key: str) -> None:
        self._held.add(key)
        for e in self.experts:
            e.admit(key)
        self._access(key)

    def touch(self, key: str, hit: bool) -> None:
        for e in self.experts:
            e.touch(key, hit)
        if hit:
            self._access(key)

    def chain(self, keys: Sequence[str]) -> None:
        for e in self.experts:
            e.chain(keys)

    def remove(self, key: str, evicted: bool) -> None:
        self._held.discard(key)
        for e in self.experts:
            e.remove(key, evicted)

    def victims(self) -> Iterator[str]:
        return self.leader.victims()

    def __len__(self) -> int:
        return len(self._held)
