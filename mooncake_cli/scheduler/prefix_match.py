"""Which instances hold how much of a request's prefix, without listing every holder.

A hot first block (a shared system prompt) may be held by most instances; naming each one's
prefix length would cost a decision time in proportion to the cluster. So the match keeps the
wide levels as the index's own sets -- `levels[d-1]` holds the instances holding at least d
leading blocks, while that is more than `small` instances -- and names each instance's length
only past them (`deep`), where few instances remain.
"""

from __future__ import annotations

from collections.abc import Container, Hashable, Mapping, Sequence

FEW = 4  # holders left when each one's remaining prefix is followed alone


class PrefixMatch:
    """The prefix lengths of one request's keys; read-only views of the index's sets, valid
    until the index next changes."""

    def __init__(self, holders: Mapping[Hashable, set[str]],
                 held: Mapping[str, Container[Hashable]], keys: Sequence[Hashable],
                 small: int) -> None:
        """`holders`: key -> instances holding it; `held`: instance -> the keys it holds."""
        self.levels: list[set[str] | frozenset[str]] = []
        self.deep: dict[str, int] = {}
        if not keys:
            return
        cur: set[str] | frozenset[str] = holders.get(keys[0], frozenset())
        i = 1
        while len(cur) > small:
            self.levels.append(cur)
            if i == len(keys):
                return
            nxt = holders.get(keys[i])
            cur = cur & nxt if nxt else frozenset()  # C: iterates the smaller set
            i += 1
        alive = set(cur)
        while len(alive) > FEW and i < len(keys):
            nxt = holders.get(keys[i])
            keep = alive & nxt if nxt else set()
            for name in alive - keep:
                self.deep[name] = i
            alive = keep
            i += 1
        n = len(keys)
        for name in alive:  # a long prefix on few instances: a lookup per key each
            mine, j = held.get(name, ()), i
            while j < n and keys[j] in mine:
                j += 1
            self.deep[name] = j

    def depth(self, name: str) -> int:
        """Leading blocks `name` holds."""
        d = self.deep.get(name)
        if d is not None:
            return d
        for d in range(len(self.levels), 0, -1):
            if name in self.levels[d - 1]:
                return d
        return 0

    def wide_depths(self) -> list[int]:
        """0 and the depths some instance of the wide levels holds exactly (a level no larger
        than the next one is the same set: nobody stops there)."""
        sizes = [len(s) for s in self.levels] + [len(self.deep)]
        return [0] + [d for d in range(1, len(self.levels) + 1) if sizes[d - 1] > sizes[d]]

    def longest(self) -> int:
        """The longest prefix held anywhere, in blocks."""
        return max(self.deep.values()) if self.deep else len(self.levels)

    def source(self) -> str | None:
        """The lowest-named instance holding the longest prefix (None: nobody holds any).
        Linear in the holders when they are many: call it only when the name is needed."""
        if self.deep:
            best = max(self.deep.values())
            return min(n for n, d in self.deep.items() if d == best)
        return min(self.levels[-1]) if self.levels else None

    def lengths(self) -> dict[str, int]:
        """Every holder's prefix length, as CacheIndex.prefix_lengths (linear in holders)."""
        out: dict[str, int] = {}
        for d, level in enumerate(self.levels, 1):
            for name in level:
                out[name] = d
        out.update(self.deep)
        return out
