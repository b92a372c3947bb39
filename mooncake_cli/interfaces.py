"""Protocols every backend implements, and the plain records that cross process boundaries.

A *transport* moves bytes between the registered memory of two engines; a *tier* provides
memory (DRAM, SSD) that engines register and stores fill. Records here are plain frozen
dataclasses that serialise to JSON, so descriptors can live in etcd or an HTTP server.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, runtime_checkable


class MooncakeError(Exception):
    """Base of every error the CLI maps to a one-line message and an exit code."""


class ConfigError(MooncakeError):
    """A user mistake in flags, environment or config file."""


class TransferError(MooncakeError):
    """A transfer request failed (bounds, auth, dead peer, timeout)."""


class MetadataError(MooncakeError):
    """A segment descriptor could not be published or found."""


class PluginError(MooncakeError):
    """A plugin is unknown, broken or unavailable."""


@dataclass(frozen=True)
class RegionInfo:
    """One registered buffer as a peer sees it: `base` is its offset in the segment's space.
    `extra` holds each transport's opaque fields for it (e.g. `shm`: the POSIX shared-memory
    name, `nixl`: the registered address), put there by that transport's `Endpoint.register`."""

    base: int
    length: int
    location: str = "cpu:0"
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def shm(self) -> str | None:
        return self.extra.get("shm")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RegionInfo:
        extra = dict(d.get("extra") or {})
        if d.get("shm"):  # descriptors published before `extra` existed
            extra["shm"] = d["shm"]
        return cls(int(d["base"]), int(d["length"]), str(d.get("location", "cpu:0")),
                   {str(k): str(v) for k, v in extra.items()})


@dataclass(frozen=True)
class SegmentDescriptor:
    """Everything an initiator needs to reach a segment: published through metadata."""

    name: str
    host: str
    port: int
    boot_id: str
    pid: int
    auth: bool
    regions: tuple[RegionInfo, ...] = field(default_factory=tuple)
    extra: dict[str, str] = field(default_factory=dict)  # transports' segment-level fields

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, raw: bytes | str) -> SegmentDescriptor:
        try:
            d = json.loads(raw)
            regions = tuple(RegionInfo.from_dict(r) for r in d.pop("regions"))
            extra = {str(k): str(v) for k, v in (d.pop("extra", None) or {}).items()}
            return cls(regions=regions, extra=extra, **d)
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            raise MetadataError(f"malformed segment descriptor: {e}") from e

    def region_for(self, offset: int, length: int) -> RegionInfo | None:
        """The region that holds [offset, offset+length) entirely, if any."""
        for r in self.regions:
            if r.base <= offset and offset + length <= r.base + r.length:
                return r
        return None


@runtime_checkable
class Channel(Protocol):
    """A connection from this engine to one peer segment. Not thread-safe: one user at a time."""

    broken: bool  # True after an I/O error: the engine closes it and may retry once elsewhere
    spin: bool  # set by the engine: False in worker threads, which must not busy-poll

    def read(self, remote_offset: int, dst: memoryview) -> None:
        """Fill `dst` from the peer's segment at `remote_offset`; raise TransferError on failure."""

    def write(self, remote_offset: int, src: memoryview) -> None:
        """Write `src` to the peer's segment at `remote_offset`; raise TransferError on failure."""

    def close(self) -> None: ...


@dataclass(frozen=True)
class Slice:
    """One piece of work handed to a `BatchChannel`: `length` bytes between the local region
    at `start` (inside it) and the peer's segment at `remote_offset`."""

    op: str  # "read" (peer -> local) or "write" (local -> peer)
    region: Any  # the engine's local Region (host `view` or device tensor, `base`, `location`)
    start: int
    length: int
    remote_offset: int


@runtime_checkable
class BatchChannel(Channel, Protocol):
    """A channel that takes a whole batch at once (a one-sided, asynchronous transport): the
    engine hands it every slice for its peer and no Python runs per slice on its behalf."""

    def post(self, slices: Sequence[Slice], done: Callable[[int, str | None], None],
             timeout: float) -> None:
        """Start every slice; call `done(i, None)` or `done(i, reason)` exactly once per slice,
        from any thread, within `timeout` seconds (a dead peer is a reason, never a hang)."""


@dataclass(frozen=True)
class EngineSide:
    """What a transport learns about the engine it is attached to."""

    segment: Any  # the engine's Segment: `locate(offset, length)` bounds-checks every access
    describe: Callable[[], bytes]  # the engine's current SegmentDescriptor as JSON
    host: str  # where a listener binds ("127.0.0.1" unless told)
    port: int  # 0: any free port
    secret: str | None
    timeout: float
    grants: Any = None  # the engine's write capabilities (transfer.capability.Grants)
    encrypt: bool = False  # TLS on the listener and on every connection it opens


@runtime_checkable
class Endpoint(Protocol):
    """One engine's side of a transport, created by `Transport.attach`: what the transport
    keeps per engine (a listener, a NIXL agent) and the memory registered with it.

    Optional: `shown()`, called each time the engine's descriptor leaves the process (published
    to a metadata server, or answered to a peer's DESCRIBE): before that no peer can know
    this endpoint's fields, so a passive side that needs progress (NIXL's) may wait for it."""

    def register(self, region: Any) -> Mapping[str, str]:
        """Make `region` reachable through this transport; its opaque fields (often empty)."""

    def unregister(self, region: Any) -> None: ...

    def fields(self) -> Mapping[str, str]:
        """Opaque segment-level fields for the descriptor (e.g. a NIXL agent's metadata)."""

    def connect(self, peer: SegmentDescriptor, secret: str | None, timeout: float) -> Channel:
        """Open a channel; raise TransferError when the peer cannot be reached or refuses."""

    def close(self) -> None: ...


@runtime_checkable
class Transport(Protocol):
    """A way to reach peer segments. Loaded from the `mooncake.transports` entry-point group.
    One object serves every engine of a process; `attach` gives each engine its endpoint.

    Optional members the engine uses when present: `batched = True` (its channels are
    `BatchChannel`s: each batch's requests for a peer go to one `post`, never cut),
    `rank(peer, local) -> int` (its priority for that peer, e.g. below shm for same-host CPU
    memory) and `why_priority() -> str` (when `auto` picks it, for `mooncake plugins`)."""

    name: str
    priority: int  # higher wins when several transports can reach a peer
    inline_bytes: int  # batches up to this size run in the submitting thread (no hand-off)
    max_slices: int  # at most this many parallel slices per request (1: never cut)

    def available(self) -> tuple[bool, str]:
        """(True, "") when usable on this machine, else (False, why not)."""

    def reachable(self, peer: SegmentDescriptor, local: SegmentDescriptor) -> tuple[bool, str]:
        """Whether this transport reaches `peer` from the engine described by `local`, and why
        (or why not) in a few words for logs and `mooncake plugins`."""

    def attach(self, engine: EngineSide) -> Endpoint:
        """This engine's endpoint; PluginError when the transport cannot serve it."""


@runtime_checkable
class Buffer(Protocol):
    """Memory handed out by a tier: a writable memoryview plus what a peer needs to map it."""

    view: memoryview
    shm: str | None

    def close(self) -> None: ...


@runtime_checkable
class Tier(Protocol):
    """A provider of memory. Loaded from the `mooncake.tiers` entry-point group."""

    name: str

    def available(self) -> tuple[bool, str]: ...

    def allocate(self, size: int, shared: bool = True) -> Buffer:
        """A zeroed buffer of `size` bytes; `shared` asks for one a same-host peer can map."""


@runtime_checkable
class EvictionPolicy(Protocol):
    """The order in which a store master evicts its objects. Loaded by name from the
    `mooncake.eviction_policies` entry-point group (a zero-argument factory per master).

    The master tells the policy of every object that arrives, is used and leaves, and asks it for
    candidates in order. The rules that hold under every policy stay with the master: objects
    leased, hard-pinned or still being put are never chosen, soft-pinned ones only after every
    other. Not thread-safe: the master's lock guards it.
    """

    name: str

    def admit(self, key: str) -> None:
        """A new object (a put started, or a client re-registered one the master did not know)."""

    def touch(self, key: str, hit: bool) -> None:
        """`key` was used: read (`hit`: a get or an exists found it) or renewed (a put ended, a
        replica was added or re-registered)."""

    def chain(self, keys: Sequence[str]) -> None:
        """One batch named `keys` in this order: KV blocks of one prefix, each the parent of the
        next (keys the master does not hold included)."""

    def remove(self, key: str, evicted: bool) -> None:
        """`key` is gone: `evicted` to make room, else removed, dropped or lost."""

    def victims(self) -> Iterator[str]:
        """Every admitted key, the first to evict first (consumed lazily, never while the
        master changes the objects)."""
