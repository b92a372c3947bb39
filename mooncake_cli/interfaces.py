"""Protocols every backend implements, and the plain records that cross process boundaries.

A *transport* moves bytes between the registered memory of two engines; a *tier* provides
memory (DRAM, SSD) that engines register and stores fill. Records here are plain frozen
dataclasses that serialise to JSON, so descriptors can live in etcd or an HTTP server.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Protocol, runtime_checkable


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
    """One registered buffer as a peer sees it: `base` is its offset in the segment's space."""

    base: int
    length: int
    location: str = "cpu:0"
    shm: str | None = None  # POSIX shared-memory name when the buffer is shm-backed


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

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, raw: bytes | str) -> SegmentDescriptor:
        try:
            d = json.loads(raw)
            regions = tuple(RegionInfo(**r) for r in d.pop("regions"))
            return cls(regions=regions, **d)
        except (ValueError, TypeError, KeyError) as e:
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

    def read(self, remote_offset: int, dst: memoryview) -> None:
        """Fill `dst` from the peer's segment at `remote_offset`; raise TransferError on failure."""

    def write(self, remote_offset: int, src: memoryview) -> None:
        """Write `src` to the peer's segment at `remote_offset`; raise TransferError on failure."""

    def close(self) -> None: ...


@runtime_checkable
class Transport(Protocol):
    """A way to reach peer segments. Loaded from the `mooncake.transports` entry-point group."""

    name: str
    priority: int  # higher wins when several transports can reach a peer
    inline_bytes: int  # batches up to this size run in the submitting thread (no hand-off)
    max_slices: int  # at most this many parallel slices per request (1: never cut)

    def available(self) -> tuple[bool, str]:
        """(True, "") when usable on this machine, else (False, why not)."""

    def reachable(self, peer: SegmentDescriptor, local: SegmentDescriptor) -> bool:
        """Whether this transport reaches `peer` from the engine described by `local`."""

    def connect(self, peer: SegmentDescriptor, secret: str | None, timeout: float) -> Channel:
        """Open a channel; raise TransferError when the peer cannot be reached or refuses."""


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
