"""What the scheduler knows: requests, instance state records and the cluster holding them."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

from mooncake_cli.scheduler.costmodel import CostModel
from mooncake_cli.scheduler.index import CacheIndex
from mooncake_cli.scheduler.links import Links
from mooncake_cli.scheduler.orders import DecodeOrder, QueueOrder

ROLES = ("prefill", "decode")


@dataclass(frozen=True)
class Request:
    """A request as the scheduler sees it: lengths and the keys of its full KV blocks."""

    id: str
    input_tokens: int
    output_tokens: int
    block_keys: Sequence[Hashable]
    tokens: Sequence[int] = ()  # the prompt's ids (live: to match KV events' sequence hashes)

    def __post_init__(self) -> None:
        if self.input_tokens < 1 or self.output_tokens < 0:
            raise ValueError(f"request {self.id}: input_tokens must be >= 1 and "
                             f"output_tokens >= 0")


@dataclass
class InstanceState:
    """One instance: its estimated queue (prefill) or its running batch (decode).

    Every attribute set is reported to the Cluster holding it, which keeps its instances in
    the orders the scheduler searches (conductor/orders.py)."""

    name: str
    role: str
    busy_until: float = 0.0  # estimated end of everything queued (prefill)
    queued: int = 0  # requests queued or running
    batch: int = 0  # decode: requests in the running batch
    context_tokens: int = 0  # decode: KV tokens held by the batch
    booked_tokens: int = 0  # decode, live: KV tokens booked for requests in flight
    booked_requests: int = 0  # decode, live: requests booked here and not yet released
    peer_tokens: int = 0  # decode, live: KV tokens other conductors booked (conductor/peers.py)
    peer_requests: int = 0  # decode, live: requests other conductors booked here
    kv_capacity_tokens: int | None = None  # decode: KV room; None = not limiting
    alive: bool = True

    def __setattr__(self, key: str, value: Any) -> None:
        object.__setattr__(self, key, value)
        changed: Callable[[InstanceState], None] | None = self.__dict__.get("_changed")
        if changed is not None:
            changed(self)

    def held_tokens(self) -> int:
        """Decode: KV tokens counted as taken: the last load report's, or what is booked here
        (by this conductor and, with --peers, the others) when that is more (a report does
        not count requests still in prefill)."""
        return max(self.context_tokens, self.booked_tokens + self.peer_tokens)

    def load(self) -> int:
        """Decode: requests counted on it: the last load report's, or those booked here and
        not yet released (here and by peers) when they are more, so a burst counts what was
        just placed."""
        return max(self.batch, self.booked_requests + self.peer_requests)

    def queue_time(self, now: float) -> float:
        """Estimated seconds until this instance can start new work."""
        return self.busy_until - now if self.busy_until > now else 0.0

    def to_dict(self, now: float) -> dict[str, object]:
        return {"name": self.name, "role": self.role, "queue_s": round(self.queue_time(now), 6),
                "queued": self.queued, "batch": self.batch,
                "booked_requests": self.booked_requests,
                "context_tokens": self.context_tokens, "alive": self.alive}


@dataclass
class Cluster:
    """The instances, the global cache index and the cost model they share; `queues` and
    `decoders` keep the live instances in the orders the scheduler searches; `links` holds the
    bandwidth measured between instances (the cost model's for a pair never measured)."""

    model: CostModel
    index: CacheIndex = field(default_factory=CacheIndex)
    prefill: list[InstanceState] = field(default_factory=list)
    decode: list[InstanceState] = field(default_factory=list)
    by_name: dict[str, InstanceState] = field(default_factory=dict)
    queues: QueueOrder = field(default_factory=QueueOrder, repr=False, compare=False)
    decoders: DecodeOrder = field(default_factory=DecodeOrder, repr=False, compare=False)
    links: Links = field(default_factory=Links, repr=False, compare=False)

    def add(self, name: str, role: str, cache_blocks: int | None = None,
            kv_capacity_tokens: int | None = None) -> InstanceState:
        """Register an instance; `cache_blocks` bounds its LRU in the index."""
        if role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}, not {role!r}")
        if name in self.by_name:
            raise ValueError(f"instance {name} is already registered")
        inst = self.by_name[name] = InstanceState(name, role,
                                                  kv_capacity_tokens=kv_capacity_tokens)
        (self.prefill if role == "prefill" else self.decode).append(inst)
        order = self.queues if role == "prefill" else self.decoders
        order.add(inst)
        object.__setattr__(inst, "_changed", order.touch)
        if role == "prefill":
            self.index.add_instance(name, cache_blocks)
        return inst

    def remove(self, name: str) -> None:
        """Drop a dead or deregistered instance and its cached blocks."""
        self.prefill = [i for i in self.prefill if i.name != name]
        self.decode = [i for i in self.decode if i.name != name]
        inst = self.by_name.pop(name, None)
        if inst is not None:
            object.__setattr__(inst, "_changed", None)
            (self.queues if inst.role == "prefill" else self.decoders).remove(name)
        self.index.drop(name)
        self.links.forget(name)

    def live_prefill(self) -> list[InstanceState]:
        return [i for i in self.prefill if i.alive]

    def live_decode(self) -> list[InstanceState]:
        return [i for i in self.decode if i.alive]

    def cached_tokens(self, input_tokens: int, blocks: int) -> int:
        """Input tokens covered by the first `blocks` cached blocks of a prompt."""
        return min(blocks * self.model.block_tokens, input_tokens)
