"""The errors every role maps to a message, the plain records that cross process boundaries,
and the protocols of tiers and eviction policies.

A *tier* provides memory (DRAM, SSD) that engines register and stores fill. Records here are
plain frozen dataclasses that serialise to JSON, so descriptors can live in etcd or an HTTP
server. A *transport* (moving bytes between the registered memory of two engines) implements
the service-provider interface of mooncake_cli/transfer/spi.py, and imports only that.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
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
