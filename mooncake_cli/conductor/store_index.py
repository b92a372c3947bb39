"""What a store master's event stream says the store holds: each of our KV block objects
(`kv/<model>/<dtype>/<L>x<H>x<bs>x<D>/<hash>`, mooncake_cli.kvkeys) with the media it is on
("cpu": DRAM, "disk": SSD), and the namespaces (model, dtype, geometry) those keys belong to.

A query's token ids become our block keys in every namespace seen of its model and block size
(the store may hold one model under several dtypes or geometries: the deepest match counts).
vLLM's MooncakeStoreConnector keys (`<model>@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@<hex>`, one
object per vLLM block, named by vLLM's block hash) are kept apart, by that hash's low 64 bits
(what vLLM's events carry by default, and enough to tell blocks apart: `engine`): the
conductor joins them with the vLLM workers' own KV events, which carry the same hashes with
the tokens (`Indexer.engine_store_depth`). Only rank 0 of every parallel dimension and KV cache
group 0 are kept (a tensor-parallel block counts as held when rank 0's shard is). Other objects
whose key is not one of ours are counted (`foreign`), never indexed. At most `max_keys` keys
of each kind (beyond: `dropped`).
"""

from __future__ import annotations

import re
import threading
from collections import Counter
from collections.abc import Sequence

from mooncake_cli.conductor.event_index import TIERS, Match
from mooncake_cli.conductor.kv_events import Cleared, Event, ObjectRemoved, ObjectStored
from mooncake_cli.kvkeys import KEY_PREFIX, KVNamespace, block_keys, parse_key

BIT = {m: 1 << i for i, m in enumerate((*TIERS, "other"))}  # a key's media as bits (memory)
_ENGINE_KEY = re.compile(r"@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@([0-9a-f]{16,128})$")


def _zero() -> Match:
    return Match(0, dict.fromkeys(TIERS, 0))


class StoreIndex:
    def __init__(self, max_keys: int = 1 << 22) -> None:
        self.max_keys = max_keys
        self.counts: Counter[str] = Counter()
        self._media: dict[str, int] = {}  # key -> its media (BIT)
        self._engine: dict[int, int] = {}  # vLLM block hash (low 64 bits) -> its media (BIT)
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
        self._engine.clear()
        self._spaces.clear()

    def _stored(self, ev: ObjectStored) -> None:
        media = self._media.get(ev.key)
        if media is None:
            ns = self._namespace(ev.key)
            if ns is None:
                self._engine_stored(ev)
                return
            if len(self._media) >= self.max_keys:
                self.counts["dropped"] += 1
                return
            media = 0
            self._spaces[ns] += 1
        self._media[ev.key] = media | BIT.get(ev.medium, BIT["other"])
        self.counts["stored"] += 1

    def _engine_stored(self, ev: ObjectStored) -> None:
        h = _engine_hash(ev.key)
        if h is None:
            self.counts["foreign"] += 1
            return
        if h not in self._engine and len(self._engine) >= self.max_keys:
            self.counts["dropped"] += 1
            return
        self._engine[h] = self._engine.get(h, 0) | BIT.get(ev.medium, BIT["other"])
        self.counts["engine_stored"] += 1

    def _engine_removed(self, ev: ObjectRemoved) -> bool:
        h = _engine_hash(ev.key)
        media, bit = self._engine.get(h, 0) if h is not None else 0, BIT.get(ev.medium,
                                                                              BIT["other"])
        if h is None or not media & bit:
            return False
        self.counts["engine_removed"] += 1
        if media & ~bit:
            self._engine[h] = media & ~bit
        else:
            del self._engine[h]
        return True

    def _removed(self, ev: ObjectRemoved) -> None:
        if ev.key not in self._media and self._engine_removed(ev):
            return
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

    def engine_holds(self, h: bytes | int) -> bool:
        """Whether vLLM's block `h` (a hash its KV events name: the whole hash, or by default
        its low 64 bits as an int, VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES) is in the store."""
        key = _low64(h) if isinstance(h, bytes) else h
        with self._lock:
            return bool(self._engine.get(key))

    def held(self) -> dict[str, int]:
        """Objects held per medium."""
        with self._lock:
            return {m: n for m, bit in BIT.items()
                    if (n := sum(1 for media in self._media.values() if media & bit))}

    def namespaces(self) -> list[str]:
        with self._lock:
            return sorted(ns.tag() for ns in self._spaces)


def _low64(h: bytes) -> int:
    """vLLM's own conversion of a block hash for its KV events (maybe_convert_block_hash)."""
    return int.from_bytes(h, "big") & ((1 << 64) - 1)


def _engine_hash(key: str) -> int | None:
    m = _ENGINE_KEY.search(key)
    if m is None or len(m.group(1)) % 2:
        return None
    return _low64(bytes.fromhex(m.group(1)))
