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
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import zmq

from mooncake_cli.api.errors import ErrorCode, ServingError, bad
from mooncake_cli.api.indexer import InstanceMatch, Register, Unregister
from mooncake_cli.conductor.event_index import StreamIndex
from mooncake_cli.conductor.kv_subscriber import Subscriber

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


@dataclass
class _Stream:
    reg: Register
    index: StreamIndex
    sub: Subscriber

    @property
    def name(self) -> str:
        return f"{self.reg.instance_id}|{self.reg.tenant_id}|{self.reg.dp_rank}"

    def serves(self, scope: Scope) -> bool:
        r = self.reg
        return (r.tenant_id, r.modelname, r.block_size, r.additionalsalt or "") == \
            (scope.tenant_id, scope.model, scope.block_size, scope.salt) and \
            scope.instance_id in (None, r.instance_id)


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
        if reg.type == "Mooncake":
            raise bad("type 'Mooncake' (a store master's per-object events) is not supported "
                      "yet: register vLLM or SGLang event publishers", "type")
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
            index = StreamIndex(reg.block_size, reg.lora_name, self.max_nodes)
            sub = Subscriber(self._ctx, sock, reg.replay_endpoint, index,
                             f"{reg.instance_id}|{reg.tenant_id}|{reg.dp_rank}",
                             self.replay_timeout)
            if old is not None:
                self._retire(old.sub)
            self._streams[key] = _Stream(reg, index, sub.start())

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

    def match(self, scope: Scope, hashes: Sequence[int]) -> dict[str, InstanceMatch]:
        """Per instance of `scope`: the tokens of the prefix `hashes` (sequence hashes at
        `scope.block_size`) that it holds, as the spec's answer has them."""
        with self._lock:
            streams = [s for s in self._streams.values() if s.serves(scope)]
        bs = scope.block_size
        per: dict[str, dict[str, Any]] = {}
        for s in sorted(streams, key=lambda s: (s.reg.instance_id, s.reg.dp_rank)):
            m = s.index.match(scope.lora_name, hashes)
            inst = per.setdefault(s.reg.instance_id, {"longest_matched": 0, "GPU": 0,
                                                      "CPU": 0, "DISK": 0, "DP": {}})
            inst["DP"][str(s.reg.dp_rank)] = m.longest * bs
            inst["longest_matched"] = max(inst["longest_matched"], m.longest * bs)
            for tier, blocks in m.tiers.items():
                inst[tier.upper()] = max(inst[tier.upper()], blocks * bs)
        return {name: InstanceMatch(**v) for name, v in per.items()}

    def snapshot(self) -> list[dict[str, Any]]:
        """Each stream: its registration, where its events stand, and what it holds."""
        with self._lock:
            streams = list(self._streams.values())
        return [{**s.reg.model_dump(), "next_seq": s.sub.expected,
                 "counts": {**dict(s.sub.counts), **dict(s.index.counts)},
                 "blocks": s.index.held()} for s in streams]

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
