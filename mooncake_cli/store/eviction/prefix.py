"""Prefix-aware: a KV block is worth something only while every block before it is held, so a
block's descendants go before it, and a chain is judged by its head.

Parent links come from batches (`chain`: a batch lists one prefix in order, each block the
parent of the next), for blocks not held yet too (a lookup names the misses before they are
put; at most MAX_LINKS such links are kept). The order is an inner policy's (hit density by
default: density.py), which this one steers:
- a chain's end (the last block of a batch, with no held child: a prompt's partial last block,
  which the next turn replaces) goes first, oldest first, until a child continues it;
- using a chain renews it tail first and then every held ancestor above it, so a chain ages as
  one unit with its head the most recent, and a head shared by many chains (a system prompt) is
  renewed by each;
- a block put below a block read in its present stay (a conversation's next turn) is admitted
  with its parent's standing (a read, for the inner policy), unless the parent is shared;
- otherwise victims come in the inner order, except that a block waits until its held children
  have gone: what is cut from a chain is its tail.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Sequence

from mooncake_cli.interfaces import EvictionPolicy
from mooncake_cli.store.eviction.density import HitDensityPolicy

MAX_LINKS = 1 << 16  # links of blocks not held, remembered for their put
SHARED = 3  # held children that make a block shared (a system prompt)


class PrefixPolicy:
    name = "prefix"

    def __init__(self, inner: EvictionPolicy | None = None) -> None:
        self.inner = HitDensityPolicy() if inner is None else inner
        self._held: set[str] = set()
        self._parent: dict[str, str] = {}  # held key -> its parent's key (held or not)
        self._kids: dict[str, set[str]] = {}  # key -> its held children
        self._links: OrderedDict[str, str] = OrderedDict()  # key not held -> its parent
        self._read: set[str] = set()  # held keys read in their present stay
        self._tips: OrderedDict[str, None] = OrderedDict()  # held ends of chains, oldest first

    # -- links -----------------------------------------------------------------------------------
    def _link(self, key: str, parent: str) -> None:
        if key == parent:
            return
        if key not in self._held:
            self._links[key] = parent
            self._links.move_to_end(key)
            if len(self._links) > MAX_LINKS:
                self._links.popitem(last=False)
            return
        old = self._parent.get(key)
        if old == parent:
            return
        if old is not None:
            self._detach(key, old)
        self._parent[key] = parent
        self._kids.setdefault(parent, set()).add(key)
        self._tips.pop(parent, None)  # continued: no longer an end

    def _detach(self, key: str, parent: str) -> None:
        kids = self._kids.get(parent)
        if kids is not None:
            kids.discard(key)
            if not kids:
                del self._kids[parent]

    def parent(self, key: str) -> str | None:
        """The parent learnt for `key`, held or not (None: a head, or never chained)."""
        return self._parent.get(key, self._links.get(key))

    # -- the policy ------------------------------------------------------------------------------
    def admit(self, key: str) -> None:
        self._held.add(key)
        self.inner.admit(key)
        parent = self._links.pop(key, None)
        if parent is not None:
            self._link(key, parent)
            if parent in self._read and len(self._kids.get(parent, ())) <= SHARED:
                self.inner.touch(key, True)  # continues a chain in use: its standing

    def touch(self, key: str, hit: bool) -> None:
        if hit and key in self._held:
            self._read.add(key)
        self.inner.touch(key, hit)

    def chain(self, keys: Sequence[str]) -> None:
        if not keys:
            return
        for parent, key in zip(keys[:-1], keys[1:], strict=True):
            self._link(key, parent)
        last = keys[-1]
        if last in self._held and last not in self._kids:
            self._tips[last] = None
            self._tips.move_to_end(last)
        for key in reversed(keys):  # tail first: the head ends most recent
            if key in self._held:
                self.inner.touch(key, False)
        seen = set(keys)
        up = self.parent(keys[0])
        while up is not None and up in self._held and up not in seen:
            self.inner.touch(up, False)
            seen.add(up)
            up = self._parent.get(up)
        self.inner.chain(keys)

    def remove(self, key: str, evicted: bool) -> None:
        if key not in self._held:
            return
        self._held.discard(key)
        self._read.discard(key)
        self._tips.pop(key, None)
        self.inner.remove(key, evicted)
        parent = self._parent.pop(key, None)
        if parent is not None:
            self._detach(key, parent)
            self._link(key, parent)  # remembered, should it be put again

    def victims(self) -> Iterator[str]:
        left: dict[str, int] = {}  # held children of a key not yet yielded
        waiting: set[str] = set()
        done: set[str] = set()

        def pending(key: str) -> int:
            n = left.get(key)
            return len(self._kids.get(key, ())) if n is None else n

        for key in self._tips:
            done.add(key)
            yield key
        for key in self.inner.victims():
            if key in done:
                continue
            if pending(key) > 0:
                waiting.add(key)
                continue
            while True:  # yield it, then each ancestor it was the last held child of
                done.add(key)
                yield key
                up = self._parent.get(key)
                if up is None or up not in self._held or up in done:
                    break
                left[up] = pending(up) - 1
                if left[up] > 0 or up not in waiting:
                    break
                waiting.discard(up)
                key = up
        for key in self.inner.victims():  # cycles of links, if a client ever sent one
            if key not in done:
                yield key

    def __len__(self) -> int:
        return len(self._held)
