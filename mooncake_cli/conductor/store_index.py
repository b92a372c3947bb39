"""What a store master's event stream says the store holds: each of our KV block objects
(`kv/<model>/<dtype>/<L>x<H>x<bs>x<D>/<hash>`, mooncake_cli.kvkeys) with the media it is on
("cpu": DRAM, "disk": SSD), and the namespaces (model, dtype, geometry) those keys belong to.

A query's token ids become our block keys in every namespace seen of its model and block size
(the store may hold one model under several dtypes or geometries: the deepest match counts).
Objects whose key is not one of ours (another connector's, e.g. vLLM's MooncakeStoreConnector)
are counted (`foreign`), never indexed. At most `max_keys` keys (beyond: `dropped`).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Sequence

from mooncake_cli.conductor.event_index import TIERS, Match
from mooncake_cli.conductor.kv_events import Cleared, Event, ObjectRemoved, ObjectStored
from mooncake_cli.kvkeys import KEY_PREFIX, KVNamespace, block_keys, parse_key

BIT = {m: 1 << i for i, m in enumerate((*TIERS, "other"))}  # a key's media as bits (memory)


def _zero() -> Match:
    return Match(0, dict.fromkeys(TIERS, 0))


class StoreIndex:
    def __init__(self, max_keys: int = 1 << 22) -> None:
        self.max_keys = max_keys
        self.counts: Counter[str] = Counter()
        self._media: dict[str, int] = {}  # key -> its media (BIT)
        self._spaces: Counter[KVNamespace] = Counter()  # keys held per namespace
        self._ns: dict[str, KVNamespace | None] = {}  # key prefix -> its namespace (None: not ours)
        self._lock = threading.Lock()

    def _namespace(self, key: str) -> KVNamespace | None:
        prefix = key.rpartition("/")[0]
        if prefix in self._ns:
            return self._ns[prefix]
        ns = None
        if key.startswith(KEY_PREFIX + "/"):
            try:
                model, dtype, (layers, heads, bs, hd), _ = parse_key(key)
                ns = KVNamespace(model, dtype, bs, layers, heads, hd)
            except ValueError:
                return None  # a malformed hash would poison its prefix: not cached
        if len(self._ns) < 4096:
            self._ns[prefix] = ns
        return ns

    # -- events ---------------------------------------------------------------------------
    def apply(self, events: Sequence[Event]) -> None:
        with self._lock:
            for ev in events:
                if isinstance(ev, ObjectStored):
                    self._stored(ev)
                elif isinstance(ev, ObjectRemoved):
                    self._removed(ev)
                elif isinstance(ev, Cleared):
                    self._clear()
                    self.counts["cleared"] += 1
                else:
                    self.counts["not_object_events"] += 1

    def clear(self) -> None:
        with self._lock:
            self._clear()

    def _clear(self) -> None:
        self._media.clear()
        self._spaces.clear()

    def _stored(self, ev: ObjectStored) -> None:
        media = self._media.get(ev.key)
        if media is None:
            ns = self._namespace(ev.key)
            if ns is None:
                self.counts["foreign"] += 1
                return
            if len(self._media) >= self.max_keys:
                self.counts["dropped"] += 1
                return
            media = 0
            self._spaces[ns] += 1
        self._media[ev.key] = media | BIT.get(ev.medium, BIT["other"])
        self.counts["stored"] += 1

    def _removed(self, ev: ObjectRemoved) -> None:
        media, bit = self._media.get(ev.key, 0), BIT.get(ev.medium, BIT["other"])
        if not media & bit:
            self.counts["removed_unknown"] += 1
            return
        self.counts["removed"] += 1
        if media & ~bit:
            self._media[ev.key] = media & ~bit
        else:
            del self._media[ev.key]
            ns = self._namespace(ev.key)
            if ns is not None:
                self._spaces[ns] -= 1
                if self._spaces[ns] <= 0:
                    del self._spaces[ns]

    # -- queries --------------------------------------------------------------------------
    def depth(self, keys: Sequence[str]) -> Match:
        """Leading `keys` held: on some medium (`longest`), and per tier."""
        tiers = dict.fromkeys(TIERS, 0)
        alive = set(TIERS)
        longest = 0
        with self._lock:
            for i, key in enumerate(keys):
                media = self._media.get(key, 0)
                if not media:
                    break
                longest = i + 1
                for t in list(alive):
                    if media & BIT[t]:
                        tiers[t] = i + 1
                    else:
                        alive.discard(t)
        return Match(longest, tiers)

    def match(self, model: str, block_size: int, lora: str | None,
              token_ids: Sequence[int]) -> Match:
        """Leading blocks of `token_ids` held, in the namespace of `model` and `block_size`
        that holds most of them (our keys carry no LoRA: a LoRA query matches nothing)."""
        if lora is not None:
            return _zero()
        with self._lock:
            spaces = [ns for ns in self._spaces
                      if ns.model == model and ns.block_size == block_size]
        best = _zero()
        for ns in spaces:
            m = self.depth(block_keys(token_ids, ns))
            if m.longest > best.longest:
                best = m
        return best

    def held(self) -> dict[str, int]:
        """Objects held per medium."""
        with self._lock:
            return {m: n for m, bit in BIT.items()
                    if (n := sum(1 for media in self._media.values() if media & bit))}

    def namespaces(self) -> list[str]:
        with self._lock:
            return sorted(ns.tag() for ns in self._spaces)
