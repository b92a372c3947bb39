"""Which objects to evict: least recently used first, soft-pinned ones (while their pin lasts)
only after all others.

Never chosen: objects whose put has not ended, leased objects, hard-pinned objects, and objects
with no replica on the tier being relieved.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from mooncake_cli.store.records import ObjectMeta, Tier


def choose_victims(lru: Iterable[ObjectMeta], need: int, now: float, tier: Tier,
                   cost: Callable[[int], int]) -> list[ObjectMeta]:
    """Objects from `lru` (least recently used first) whose `tier` replicas free >= `need` bytes
    (or every candidate, when they cannot). `cost(size)` is the bytes a replica really takes."""
    victims: list[ObjectMeta] = []
    soft: list[ObjectMeta] = []
    freed = 0
    for meta in lru:
        if freed >= need:
            return victims
        if not meta.complete or meta.config.hard_pin or meta.leased(now):
            continue
        n = sum(1 for r in meta.replicas if r.tier == tier)
        if n == 0:
            continue
        if meta.soft_pinned(now):
            soft.append(meta)
            continue
        victims.append(meta)
        freed += n * cost(meta.size)
    for meta in soft:
        if freed >= need:
            break
        victims.append(meta)
        freed += sum(1 for r in meta.replicas if r.tier == tier) * cost(meta.size)
    return victims
