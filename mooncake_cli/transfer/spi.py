"""The transport service-provider interface: the one module of mooncake_cli a transport imports.

A transport moves bytes between the registered memory of two engines. The engine keeps
everything else: it registers memory as a segment, publishes its `SegmentDescriptor`, runs
the engine's listener (the secret proof, HMAC or TLS; DESCRIBE; READ and WRITE of registered
memory with bounds and write-capability checks), slices and schedules requests, and picks a
transport per peer. A transport is a class with a no-argument constructor in the
`mooncake.transports` entry-point group; one object serves every engine of a process:

    Transport.available() -> (ok, why not)
    Transport.reachable(peer, local) -> (ok, why)        # descriptors of the peer and of us
    Transport.attach(engine: EngineSide) -> Endpoint     # once per engine
    Endpoint.register(region) -> fields                  # each region, before it is published
    Endpoint.fields() -> fields                          # segment-level, in the descriptor
    Endpoint.connect(peer, secret, timeout) -> Channel   # the engine pools and reuses channels
    Channel.read(remote_offset, dst) / write(remote_offset, src) / close()
    BatchChannel.post(slices, done, timeout)             # when the transport sets `batched`

Fields a transport publishes (per region and per segment) are strings named after it (`shm`,
`shm.lane`, `nixl.agent`); the engine drops any other name. Remote offsets are in the peer's
segment space; a channel must refuse (TransferError) what lies outside the regions the peer
describes, and must never touch local memory outside the `Slice` or view it was given.

The protocols a transport implements are here; what the engine hands it (`EngineSide`: its
memory, write capabilities, descriptor, links to peers' listeners, doors on a transport's own
sockets) is defined in the SPI's private `_spi_engine` and named here. Helpers: `prove`, the
client side of a door; `LocalChannel(memory)`, a bounds-checked copy into and out of memory in
reach (the engine's channel to its own segment); `stream_copy(dest, src)`, the engine's host
memory copy (non-temporal stores on x86-64, without the GIL from 64 KiB), for transports that
copy between mapped memory.

Optional members the engine uses when present: `Transport.batched`, `rank(peer, local)`,
`why_priority()`; `Endpoint.shown()`, `withdraw(region)`, `private_fields`, `audit`;
`Channel.dropped()`, `view(remote_offset, length)`. See each protocol below.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from mooncake_cli.interfaces import (
    ConfigError,
    PluginError,
    RegionInfo,
    SegmentDescriptor,
    TransferError,
)
from mooncake_cli.native import stream_copy
from mooncake_cli.transfer._spi_engine import (
    Capabilities,
    Connection,
    Door,
    EngineSide,
    Link,
    LocalChannel,
    LocalRegion,
    Memory,
)
from mooncake_cli.transfer.admission import prove

__all__ = ["BatchChannel", "Capabilities", "Channel", "ConfigError", "Connection", "Door",
           "EngineSide", "Endpoint", "Link", "LocalChannel", "LocalRegion", "Memory", "PluginError",
           "RegionInfo", "SegmentDescriptor", "Slice", "TransferError", "Transport", "prove",
           "stream_copy"]


@runtime_checkable
class Channel(Protocol):
    """A connection from this engine to one peer segment. Not thread-safe: one user at a time.

    Optional: `dropped() -> bool` (the peer closed it while idle: the pool opens another),
    `view(remote_offset, n) -> memoryview | None` (the peer's bytes mapped in this process)."""

    broken: bool  # True after an I/O error: the engine closes it and may retry once elsewhere
    spin: bool  # set by the engine: False in worker threads, which must not busy-poll

    def read(self, remote_offset: int, dst: memoryview) -> None:
        """Fill `dst` from the peer's segment at `remote_offset`; raise TransferError on failure."""

    def write(self, remote_offset: int, src: memoryview) -> None:
        """Write `src` to the peer's segment at `remote_offset`; raise TransferError on failure.
        A write into guarded memory carries a capability: `write(remote_offset, src, cap)`;
        a channel that cannot pass it on must send it over `EngineSide.link`."""

    def close(self) -> None: ...


@dataclass(frozen=True)
class Slice:
    """One piece of work handed to a `BatchChannel`: `length` bytes between the local region
    at `start` (inside it) and the peer's segment at `remote_offset`."""

    op: str  # "read" (peer -> local) or "write" (local -> peer)
    region: Any  # a LocalRegion of this engine
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


@runtime_checkable
class Endpoint(Protocol):
    """One engine's side of a transport, created by `Transport.attach`: what the transport
    keeps per engine (a listener, a NIXL agent) and the memory registered with it.

    Optional: `shown()`, called each time the engine's descriptor leaves the process (published
    to a metadata server, or answered to a peer's DESCRIBE): before that no peer can know
    this endpoint's fields, so a passive side that needs progress (NIXL's) may wait for it;
    `withdraw(region)` (the region is guarded now); `private_fields = True` (its segment
    fields go only to peers that proved the secret, never to a metadata server)."""

    def register(self, region: Any) -> Mapping[str, str]:
        """Make `region` (a LocalRegion) reachable through this transport; its fields (often
        none). Raising leaves the region unreachable through this transport only."""

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
