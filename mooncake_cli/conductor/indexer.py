"""The conductor's KV indexer: the event streams registered through the indexer API, each with
its subscriber thread and its `StreamIndex`, and the prefix queries over them.

    ix = Indexer()
    ix.register(Register(...))                  # starts its subscriber
    ix.match(scope, seq_hashes)                 # {instance: InstanceMatch}
    ix.unregister(Unregister(...)); ix.close()

A stream is one (instance_id, tenant_id, dp_rank); registering it again with the same endpoint
and scope is a no-op, with another one replaces it. A query sees the streams of its tenant
whose model, block size, salt (`additionalsalt` = `cache_salt`, none = "") match; the LoRA is
each block's own (an event's lora_name, else the registration's). At most `max_streams`.

A `type: "Mooncake"` stream is a store master's per-object events (store_index.StoreIndex):
it answers a query of its tenant and salt whose model is its `modelname` ("*": any) at any
block size its keys have, from the query's token ids (`match(..., token_ids)`); by hashes
alone it matches nothing. `store_depth(keys)` asks the store streams about our block keys.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import zmq

from mooncake_cli.api.errors import ErrorCode, ServingError, bad
from mooncake_cli.api.indexer import InstanceMatch, Register, Unregister
from mooncake_cli.conductor.event_index import TIERS, Match, StreamIndex
from mooncake_cli.conductor.kv_events import BlockHash
from mooncake_cli.conductor.kv_subscriber import Subscriber
from mooncake_cli.conductor.store_index import StoreIndex

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Scope:
    """What a query asks about (the spec's query dimensions but the hashes)."""

    model: str
    block_size: int
    lora_name: str | None = None
    tenant_id: str = "default"
    instance_id: str | None = None
    salt: str = ""


STORE: Final = "Mooncake"  # the registration type of a store master's events


@dataclass
class _Stream:
    reg: Register
    index: StreamIndex | StoreIndex
    sub: Subscriber

    @property
    def name(self) -> str:
        return f"{self.reg.instance_id}|{self.reg.tenant_id}|{self.reg.dp_rank}"

    def serves(self, scope: Scope) -> bool:
        r = self.reg
        if isinstance(self.index, StoreIndex):
            return (r.tenant_id, r.additionalsalt or "") == (scope.tenant_id, scope.salt) and \
                r.modelname in ("*", scope.model) and scope.instance_id in (None, r.instance_id)
        return (r.tenant_id, r.modelname, r.block_size, r.additionalsalt or "") == \
            (scope.tenant_id, scope.model, scope.block_size, scope.salt) and \
            scope.instance_id in (None, r.instance_id)

    def match(self, scope: Scope, hashes: Sequence[int],
              token_ids: Sequence[int] | None) -> Match:
        if isinstance(self.index, StoreIndex):
            if token_ids is None:
                return Match(0, dict.fromkeys(TIERS, 0))
            return self.index.match(scope.model, scope.block_size, scope.lora_name, token_ids)
        return self.index.match(scope.lora_name, hashes)


class Indexer:
    def __init__(self, max_streams: int = 1024, max_nodes: int = 1 << 19,
                 replay_timeout: float = 2.0) -> None:
        self.max_streams, self.max_nodes = max_streams, max_nodes
        self.replay_timeout = replay_timeout
        self._ctx: zmq.Context | None = None  # made at the first registration
        self._streams: dict[tuple[str, str, int], _Stream] = {}
        self._retired: list[Subscriber] = []
        self._lock = threading.Lock()
        self._closed = False

    def register(self, reg: Register) -> None:
        key = (reg.instance_id, reg.tenant_id, reg.dp_rank)
        with self._lock:
            if self._closed:
                raise ServingError(ErrorCode.UNAVAILABLE, "the indexer is closing")
            old = self._streams.get(key)
            if old is not None and old.reg == reg:
                return
            if old is None and len(self._streams) >= self.max_streams:
                raise ServingError(ErrorCode.CONFLICT, f"{self.max_streams} event streams are "
                                   "registered (the most): unregister one first")
            if self._ctx is None:
                self._ctx = zmq.Context()
            try:
                sock = Subscriber.connect(self._ctx, reg.endpoint)
            except zmq.ZMQError as e:
                raise bad(f"'endpoint' {reg.endpoint}: {e}", "endpoint") from None
            store = reg.type == STORE
            index = StoreIndex() if store else \
                StreamIndex(reg.block_size, reg.lora_name, self.max_nodes)
            sub = Subscriber(self._ctx, sock, reg.replay_endpoint, index,
                             f"{reg.instance_id}|{reg.tenant_id}|{reg.dp_rank}",
                             self.replay_timeout, clear_on_loss=store)
            if old is not None:
                self._retire(old.sub)
            self._streams[key] = _Stream(reg, index, sub.start())

    def follow_store(self, endpoint: str, replay_endpoint: str | None = None,
                     instance_id: str = "store") -> None:
        """Register a store master's events (`mooncake store master --kv-events`) for every
        model; its replay endpoint derived as the master derives it when not given."""
        from mooncake_cli.api.kv_events import replay_of

        replay = replay_endpoint or replay_of(endpoint)
        self.register(Register(type=STORE, modelname="*", instance_id=instance_id,
                               block_size=1, endpoint=endpoint, replay_endpoint=replay))

    def unregister(self, req: Unregister) -> list[str]:
        with self._lock:
            key = (req.instance_id, req.tenant_id, req.dp_rank)
            s = self._streams.get(key)
            if s is None or (s.reg.type, s.reg.modelname, s.reg.block_size) != \
                    (req.type, req.modelname, req.block_size) or \
                    req.lora_name not in (None, s.reg.lora_name):
                return []
            del self._streams[key]
            self._retire(s.sub)
            return [s.name]

    def _retire(self, sub: Subscriber) -> None:
        sub.stop()  # its thread closes its sockets within 0.1 s; `close` joins it
        self._retired = [r for r in self._retired if r.alive()] + [sub]

    def match(self, scope: Scope, hashes: Sequence[int],
              token_ids: Sequence[int] | None = None) -> dict[str, InstanceMatch]:
        """Per instance of `scope`: the tokens of the prefix `hashes` (sequence hashes at
        `scope.block_size`; `token_ids` too, for store streams) that it holds, as the spec's
        answer has them."""
        with self._lock:
            streams = [s for s in self._streams.values() if s.serves(scope)]
        bs = scope.block_size
        per: dict[str, dict[str, Any]] = {}
        for s in sorted(streams, key=lambda s: (s.reg.instance_id, s.reg.dp_rank)):
            m = s.match(scope, hashes, token_ids)
            inst = per.setdefault(s.reg.instance_id, {"longest_matched": 0, "GPU": 0,
                                                      "CPU": 0, "DISK": 0, "DP": {}})
            inst["DP"][str(s.reg.dp_rank)] = m.longest * bs
            inst["longest_matched"] = max(inst["longest_matched"], m.longest * bs)
            for tier, blocks in m.tiers.items():
                inst[tier.upper()] = max(inst[tier.upper()], blocks * bs)
        return {name: InstanceMatch(**v) for name, v in per.items()}

    def store_depth(self, keys: Sequence[str]) -> dict[str, int]:
        """Leading `keys` (our block keys, kvkeys.block_keys) the store holds, as the deepest
        store stream says: in some tier ("longest"), in DRAM ("cpu"), on SSD ("disk")."""
        with self._lock:
            stores = [s.index for s in self._streams.values() if isinstance(s.index, StoreIndex)]
        best = {"longest": 0, "cpu": 0, "disk": 0}
        for index in stores:
            m = index.depth(keys)
            for name, n in (("longest", m.longest), ("cpu", m.tiers["cpu"]),
                            ("disk", m.tiers["disk"])):
                best[name] = max(best[name], n)
        return best

    def engine_store_depth(self, scope: Scope, hashes: Sequence[int]) -> int:
        """Leading `hashes` (sequence hashes at `scope.block_size`) the store holds as vLLM's
        store connector saved them: any vLLM stream of `scope` that saw the blocks names
        their vLLM hashes, and a store stream says which of those it holds."""
        with self._lock:
            stores = [s.index for s in self._streams.values() if isinstance(s.index, StoreIndex)]
            engines = [s.index for s in self._streams.values()
                       if isinstance(s.index, StreamIndex) and s.serves(scope)]
        if not stores or not engines:
            return 0

        def held(h: BlockHash) -> bool:
            return any(store.engine_holds(h) for store in stores)

        return max(ix.covered(scope.lora_name, hashes, held) for ix in engines)

    def snapshot(self) -> list[dict[str, Any]]:
        """Each stream: its registration, where its events stand, and what it holds (a store
        stream: objects per medium, and the namespaces of its keys)."""
        with self._lock:
            streams = list(self._streams.values())
        return [{**s.reg.model_dump(), "next_seq": s.sub.expected,
                 "counts": {**dict(s.sub.counts), **dict(s.index.counts)},
                 "blocks": s.index.held(),
                 **({"namespaces": s.index.namespaces()}
                    if isinstance(s.index, StoreIndex) else {})} for s in streams]

    def close(self) -> None:
        with self._lock:
            self._closed = True
            subs = [s.sub for s in self._streams.values()] + self._retired
            self._streams.clear()
            self._retired = []
        for sub in subs:
            sub.stop()
        for sub in subs:
            sub.join()
        if any(sub.alive() for sub in subs):  # term() would wait for their sockets forever
            log.warning("kv events: a subscriber did not stop; its context is left open")
        elif self._ctx is not None:
            self._ctx.term()
