"""Routing on KV events: what a prefill worker whose engine publishes its KV events (a vLLM
role) holds is what its events say, not what the conductor placed there.

A registration carrying `kv_events` becomes an indexer stream (conductor/indexer.py: the same
streams the indexer API serves; instance_id = the worker's name, tenant "default", the
conductor's model name, at the conductor's block size: the stream rehashes each event's token
ids, whatever the engine's block size). Before each decision, `sync` makes the scheduler's
cache index agree with the streams on the request's blocks: each followed worker holds
exactly the leading blocks its events say it holds on any medium. Blocks the engine evicted
are gone from the index at the next decision that asks for them, and a prefill answer's
`stored_keys` are not taken on faith for followed workers (`follows`): the events say it.

With a store master's object events followed (`follow_store`, `--store-events`), the leading
blocks of the request the store holds are set the same way on the holder STORE: a prefix any
prefill worker can fetch, as from a worker's segment. Our workers' blocks are known by our
block keys (`Indexer.store_depth`); those vLLM's store connector saved, by vLLM's block hashes,
joined with the followed workers' events, which name the same hashes with their tokens
(`Indexer.engine_store_depth`).

A block of the conductor's size is known by its sequence hash (`seqhash`); the cache index by
our block keys (`kvkeys`). Both cut the prompt at the same block size, so the i-th of each
name the same block and the translation is positional, per request.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable, Sequence

from mooncake_cli.api.indexer import Kind, Register, Unregister
from mooncake_cli.api.roles import KvEvents
from mooncake_cli.conductor.indexer import Indexer, Scope
from mooncake_cli.conductor.seqhash import seq_hashes
from mooncake_cli.scheduler.index import CacheIndex

KIND: Kind = "vLLM"  # the batch format; SGLang's is the same wire
STORE = "(store)"  # the store's holdings in the cache index: any prefill worker may fetch them


class EventRouting:
    def __init__(self, indexer: Indexer, model: str, block_size: int) -> None:
        self.indexer, self.model, self.block_size = indexer, model, block_size
        self._followed: dict[str, KvEvents] = {}
        self._store = False  # a store master's object events are followed
        self._lock = threading.Lock()

    def follow_store(self, endpoint: str, replay_endpoint: str | None = None) -> None:
        """Follow a store master's object events (`mooncake store master --kv-events`): the
        leading blocks of a request the store holds become a prefix every prefill worker can
        fetch (the cache index's holder STORE), as a worker's segment is."""
        self.indexer.follow_store(endpoint, replay_endpoint)
        self._store = True

    def follow(self, name: str, role: str, src: KvEvents | None) -> None:
        """Subscribe to a prefill worker's events (again with a new source; a heartbeat with
        the same one changes nothing). ServingError 400 for an endpoint ZMQ refuses."""
        if role != "prefill" or src is None:
            self.forget(name)
            return
        with self._lock:
            if self._followed.get(name) == src:
                return
        self.indexer.register(Register(
            type=KIND, modelname=self.model, instance_id=name, block_size=self.block_size,
            endpoint=src.endpoint, replay_endpoint=src.replay_endpoint))
        with self._lock:
            self._followed[name] = src

    def forget(self, name: str) -> None:
        with self._lock:
            if self._followed.pop(name, None) is None:
                return
        self.indexer.unregister(Unregister(type=KIND, modelname=self.model, instance_id=name,
                                           block_size=self.block_size))

    def follows(self, name: str) -> bool:
        with self._lock:
            return name in self._followed

    def sync(self, index: CacheIndex, tokens: Sequence[int],
             keys: Sequence[Hashable]) -> dict[str, int]:
        """Set each followed worker's holding of `keys` (the blocks of `tokens`) in `index` to
        what its events say; returns the leading blocks each holds (for explain)."""
        with self._lock:
            names = list(self._followed)
        if not keys:
            return {}
        depths: dict[str, int] = {}
        scope = Scope(self.model, self.block_size)
        hashes = seq_hashes(tokens, self.block_size)[:len(keys)] if names else []
        if names:
            matches = self.indexer.match(scope, hashes)
            for name in names:
                m = matches.get(name)
                depths[name] = m.longest_matched // self.block_size if m is not None else 0
        if self._store:  # our workers' blocks by our keys, vLLM's by the blocks' vLLM hashes
            ours = self.indexer.store_depth([str(k) for k in keys])["longest"]
            depths[STORE] = max(ours, self.indexer.engine_store_depth(scope, hashes)
                                if hashes else 0)
            if not index.knows(STORE):
                index.add_instance(STORE)
        for name, d in depths.items():
            if index.knows(name):  # not yet (or no longer) in the cluster: nothing to set
                index.evict(name, keys[d:])
                index.store(name, keys[:d])
        return depths
