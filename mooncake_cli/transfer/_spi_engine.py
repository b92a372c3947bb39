"""The engine's half of the transport service-provider interface: what a transport is handed
about the engine it is attached to (`EngineSide`) and the objects reached through it. Private
to the SPI: transports import these names from `mooncake_cli.transfer.spi`."""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any, Protocol

from mooncake_cli.interfaces import SegmentDescriptor


class LocalRegion(Protocol):
    """One of the engine's registered regions, as a transport sees it. Host memory has a
    `view`; device memory (a CUDA tensor) has none and a flat uint8 `device` tensor instead,
    so move its bytes through `load` (out) and `sink` then `commit` (in)."""

    base: int  # its offset in the segment's space
    length: int
    location: str  # "cpu:0", "cuda:1", ...
    view: memoryview | None
    shm: str | None  # the name of a shared-memory buffer from a tier, when it is one
    keep: Any  # the registered object (a tier's buffer has an `fd` when it is a memfd)
    device: Any
    extra: dict[str, str]  # every transport's fields for it (yours included, once registered)

    def load(self, start: int, n: int) -> memoryview:
        """Bytes [start, start+n) in host memory (the region itself, or a staged copy)."""

    def sink(self, start: int, n: int) -> memoryview:
        """Host memory to receive bytes for [start, start+n); then call `commit`."""

    def commit(self, start: int, data: memoryview) -> None: ...


class Memory(Protocol):
    """The engine's registered memory (its segment)."""

    @property
    def name(self) -> str: ...

    @property
    def regions(self) -> tuple[Any, ...]: ...

    def locate(self, offset: int, length: int) -> tuple[Any, int]:
        """(region, start inside it) holding [offset, offset+length); TransferError if none."""


class LocalChannel:
    """A bounds-checked copy into and out of one engine's own memory: the engine's channel to
    its own segment, and a base for a transport whose peers' memory is in reach."""

    def __init__(self, segment: Memory) -> None:
        self._segment = segment
        self.broken = False
        self.spin = True

    def read(self, remote_offset: int, dst: memoryview) -> None:
        region, start = self._segment.locate(remote_offset, len(dst))
        dst[:] = region.load(start, len(dst))

    def write(self, remote_offset: int, src: memoryview, cap: bytes | None = None) -> None:
        region, start = self._segment.locate(remote_offset, len(src))
        view = region.sink(start, len(src))
        view[:] = src
        region.commit(start, view)

    def close(self) -> None:
        pass


class Capabilities(Protocol):
    """The engine's write capabilities (checked by its listener, never by a transport)."""

    def guarded(self, offset: int, length: int) -> bool:
        """Whether any byte of the range needs a capability to be written."""


class Link(Protocol):
    """A connection to a peer engine's listener, the secret proven (`EngineSide.link`)."""

    broken: bool
    spin: bool

    def describe(self) -> bytes:
        """The peer's current descriptor (JSON: `SegmentDescriptor.from_json`)."""

    def read(self, remote_offset: int, dst: memoryview) -> None: ...

    def write(self, remote_offset: int, src: memoryview, cap: bytes | None = None) -> None: ...

    def close(self) -> None: ...


class Connection(Protocol):
    """A connection a `Door` admitted: `conn` proved the secret; `peer` is its address."""

    @property
    def conn(self) -> socket.socket: ...

    @property
    def peer(self) -> str: ...


class Door(Protocol):
    """A transport's listening socket behind the engine's secret proof (`EngineSide.door`).
    `serve` marks each request with `claim` (False: the connection was closed to make room
    for another, stop) and `release` after answering it."""

    def claim(self, connection: Any) -> bool:
        """`connection`: the one `serve` was given."""

    def release(self, connection: Any) -> None: ...

    def close(self) -> None: ...


class EngineSide(Protocol):
    """What a transport is handed about the engine it is attached to.

    - `segment.locate(offset, length)`: the engine's own region and start for a range, bounds
      checked (TransferError outside every region): for transports that serve reads and writes.
    - `grants`: the engine's write capabilities; a region for which `guarded(base, length)` is
      true takes writes only through the engine's listener, with a capability (do not offer
      unchecked writes into it; an endpoint's optional `withdraw(region)` is called when a
      region becomes guarded after it was registered).
    - `describe()`: this engine's descriptor as JSON, for a transport that answers peers itself.
    - `link(peer, timeout)`: a connection to the peer engine's listener that has proved the
      secret: `describe()` (the peer's current descriptor, as JSON), `read`, `write` (with a
      capability for guarded memory). The `tcp` transport moves data over links; others use
      one to prove the secret before touching a peer's memory, to refresh a descriptor, or for
      what their own path cannot do.
    - `door(sock, magic, serve, name)`: the engine's secret proof (the HELLO and HMAC challenge
      of the listener, with the transport's 3-byte `magic`) in front of a transport's own
      listening socket; proven connections go to `serve(connection)` on a thread of their
      own, at most `limit` at once. `spi.prove(sock, magic, secret, what)` is its client side.
    """

    @property
    def segment(self) -> Memory: ...

    @property
    def grants(self) -> Capabilities: ...

    @property
    def secret(self) -> str | None: ...

    @property
    def timeout(self) -> float:
        """Seconds an operation may take."""

    @property
    def encrypt(self) -> bool:
        """TLS on the engine's listener and on its links."""

    def describe(self) -> bytes:
        """This engine's descriptor as JSON (the fields of every endpoint included)."""

    def link(self, peer: SegmentDescriptor, timeout: float, encrypt: bool = False) -> Link:
        """A proven connection to `peer`'s listener (TLS when the peer offers it; `encrypt`:
        refuse a peer that does not). TransferError when it cannot be reached or refuses."""

    def door(self, sock: socket.socket, magic: bytes, serve: Callable[[Any], None],
             name: str, limit: int = 64, handshake_timeout: float = 5.0) -> Door:
        """Admit connections to the listening `sock` that prove this engine's secret (the
        HELLO with `magic`); each proven one runs `serve(connection)` on its own thread."""
