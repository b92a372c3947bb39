"""Prefix reuse through the store: find the leading run of a prompt's blocks already stored,
load them straight into the paged cache, put newly computed blocks back, and give blocks
fetched from other segments a replica in this worker's own (hot blocks gain replicas). Objects
take the form of the worker's KV wire (worker/kvwire.py): int8 ones are quantized on put and
dequantized on load."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch

from mooncake_cli.engine import KVCache
from mooncake_cli.interfaces import MooncakeError
from mooncake_cli.kvkeys import fits, reusable_blocks
from mooncake_cli.store.client import StoreClient
from mooncake_cli.store.errors import ObjectAlreadyExists, StoreError
from mooncake_cli.store.records import ReplicateConfig
from mooncake_cli.worker.kvwire import KVWire

log = logging.getLogger("mooncake.worker")


class PrefixStore:
    """Block-level store I/O for one KV cache."""

    def __init__(self, store: StoreClient, cache: KVCache, wire: KVWire | None = None) -> None:
        self.store = store
        self.cache = cache
        self.wire = wire or KVWire("native", cache)
        self.evictions = 0  # blocks found gone (evicted, unreadable) between lookup and read
        own = store.owner.segment is not None
        self.put_config = ReplicateConfig(preferred_segment=store.engine.name if own else "")
        on_host = cache.pool.device.type == "cpu"
        # a device cache is staged through one host block (the store reads and writes host memory)
        self._staging = None if on_host else torch.empty(cache.pool.shape[1:],
                                                         dtype=cache.pool.dtype)
        self._loaded: dict[str, torch.Tensor] = {}  # int8 objects of the last load, by key

    def _read(self, key: str, block: int) -> int:
        if self.wire.int8:
            obj = torch.empty(self.wire.object_bytes, dtype=torch.uint8)
            got = self.store.get_into(key, obj)
            if got == self.wire.object_bytes:
                self.wire.decode_into(obj, self.cache.block(block))
                self._loaded[key] = obj
                self.wire.keep(block, obj)
            return got
        if self._staging is None:
            return self.store.get_into(key, self.cache.block(block))
        got = self.store.get_into(key, self._staging)
        self.cache.block(block).copy_(self._staging)
        return got

    def _host(self, block: int) -> torch.Tensor:
        data = self.cache.block(block)
        return data if self._staging is None else data.cpu()

    def leading_hits(self, keys: Sequence[str], local: bool = False) -> int:
        """How many leading keys the store holds (a miss ends the run); with `local`, only
        objects with a replica in this worker's own segment count."""
        if not keys:
            return 0
        try:
            found = self.store.batch_exists(list(keys))
        except StoreError as e:
            log.warning("store lookup failed, computing the whole prompt: %s", e)
            return 0
        n = 0
        for hit in found:
            if hit is not True:
                break
            n += 1
        if local and n:
            own = self.store.engine.name
            try:
                metas = self.store.batch_describe(list(keys[:n]))
            except StoreError as e:
                log.warning("store lookup failed, computing the whole prompt: %s", e)
                return 0
            for i, meta in enumerate(metas):
                if isinstance(meta, StoreError) or not any(r.segment == own
                                                          for r in meta.replicas):
                    return i
        return n

    def load(self, keys: Sequence[str], num_tokens: int, table: list[int],
             reuse: str = "any") -> int:
        """Load the reusable leading blocks of a `num_tokens` prompt into `table` (grown as
        needed); the number of blocks loaded. A block that cannot be read (evicted since the
        lookup, failed transfer, wrong size) ends the run: the rest is computed. `reuse`
        "local" loads only blocks held in this worker's own segment."""
        hits = self.leading_hits(keys, local=reuse == "local")
        want = reusable_blocks(num_tokens, self.cache.block_size, hits)
        if want == 0:
            return 0
        self.cache.ensure(table, want * self.cache.block_size)
        size = self.wire.object_bytes
        self._loaded.clear()
        for i in range(want):
            if not fits(keys[i], self.wire.ns):
                return i
            try:
                got = self._read(keys[i], table[i])
            except StoreError as e:
                log.info("block %d of the prefix is unavailable (%s): computing from there",
                         i, e)
                self.evictions += 1
                return i
            if got != size:
                log.warning("store object %s is %d bytes, expected %d: computing from there",
                            keys[i], got, size)
                return i
        return want

    def put(self, keys: Sequence[str], blocks: Sequence[int]) -> list[str]:
        """Put each block under its key; the keys stored. Failures are logged, never raised
        (an object already stored by another worker counts as not stored by us)."""
        return self.put_tensors(keys, [self._host(b) for b in blocks]) if keys else []

    def put_tensors(self, keys: Sequence[str], data: Sequence[torch.Tensor],
                    config: ReplicateConfig | None = None) -> list[str]:
        """`put` of host copies of blocks (`config`: the default places one replica here)."""
        if not keys:
            return []
        try:
            errors = self.store.batch_put(list(keys), self.wire.encode(data),
                                          config or self.put_config)
        except MooncakeError as e:  # a StoreError, or the transfer engine's own
            log.warning("storing %d KV blocks failed: %s", len(keys), e)
            return []
        stored = []
        for key, err in zip(keys, errors, strict=True):
            if err is None:
                stored.append(key)
            else:
                log.info("not storing %s: %s", key, err)
        return stored

    def _objects(self, keys: Sequence[str], blocks: Sequence[int]) -> list[torch.Tensor]:
        """The store objects of loaded blocks: int8 ones as they were read."""
        if not self.wire.int8:
            return [self._host(b) for b in blocks]
        return [self._loaded[k] if k in self._loaded else self.wire.encode([self._host(b)])[0]
                for k, b in zip(keys, blocks, strict=True)]

    def replicate(self, keys: Sequence[str], blocks: Sequence[int]) -> list[str]:
        """Add a replica in this worker's own segment of each loaded block (the cache blocks
        hold the object's bytes); the keys that gained one. A block held here already is
        skipped; failures are logged, never raised."""
        if not keys or self.store.owner.segment is None:
            return []
        try:
            errors = self.store.batch_add_replica(list(keys), self._objects(keys, blocks))
        except MooncakeError as e:
            log.warning("replicating %d fetched KV blocks failed: %s", len(keys), e)
            return []
        added = []
        for key, err in zip(keys, errors, strict=True):
            if err is None:
                added.append(key)
            elif not isinstance(err, ObjectAlreadyExists):
                log.info("no replica of %s here: %s", key, err)
        return added
