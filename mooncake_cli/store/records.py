"""The store's plain records and the limits every request is checked against.

Records are frozen dataclasses or msgspec Structs (those the master makes per put: Replica,
ObjectMeta) of plain values, so the RPC layer can serialise them as they are.
Constructing one checks its fields and raises InvalidParams (or InvalidKey) on nonsense, so a
malformed message turns into an error reply before it reaches the master's state.

Limits:
    MAX_KEY_BYTES    4096   a key is a non-empty str of at most this many UTF-8 bytes
    MAX_OBJECT_SIZE  1 TiB  an object's size is an int in [1, MAX_OBJECT_SIZE]
    MAX_REPLICAS     16     replica_num is in [1, MAX_REPLICAS]
    MAX_SEGMENT_SIZE 256 TiB a mounted segment's size (a 48-bit address space), base+size < 2^64
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import msgspec

from mooncake_cli.store.errors import InvalidKey, InvalidParams

MAX_KEY_BYTES = 4096
MAX_OBJECT_SIZE = 1 << 40
MAX_REPLICAS = 16
MAX_SEGMENT_SIZE = 1 << 48  # what a 48-bit virtual address space can map
MAX_OFFSET = 1 << 64  # offsets travel as u64

Tier = Literal["dram", "ssd"]
R = TypeVar("R")
TIERS: tuple[Tier, ...] = ("dram", "ssd")


def check_key(key: object) -> str:
    """`key` itself when it is a valid object key; InvalidKey saying why otherwise."""
    if type(key) is str and key.isascii() and 0 < len(key) <= MAX_KEY_BYTES:
        return key  # the common case, without encoding it
    if not isinstance(key, str):
        raise InvalidKey(f"key must be a string, not {type(key).__name__}")
    if not key:
        raise InvalidKey("key is empty")
    try:
        n = len(key.encode("utf-8"))
    except UnicodeEncodeError as e:
        raise InvalidKey(f"key is not valid UTF-8: {e.reason}") from None
    if n > MAX_KEY_BYTES:
        raise InvalidKey(f"key is {n} bytes; the limit is {MAX_KEY_BYTES} UTF-8 bytes")
    return key


def check_size(size: object, what: str = "size") -> int:
    """`size` when it is an int in [1, MAX_OBJECT_SIZE]; InvalidParams otherwise."""
    if not isinstance(size, int) or isinstance(size, bool):
        raise InvalidParams(f"{what} must be an integer, not {type(size).__name__}")
    if size <= 0:
        raise InvalidParams(f"{what} {size} must be positive")
    if size > MAX_OBJECT_SIZE:
        raise InvalidParams(f"{what} {size} exceeds the limit of {MAX_OBJECT_SIZE} bytes")
    return size


def _check_int(value: object, what: str, low: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise InvalidParams(f"{what} must be an integer >= {low}, got {value!r}")


def check_tier(tier: object) -> None:
    if tier not in TIERS:
        raise InvalidParams(f"tier must be one of {', '.join(TIERS)}, got {tier!r}")


def _check_name(name: object, what: str) -> None:
    if not isinstance(name, str) or not name:
        raise InvalidParams(f"{what} must be a non-empty string, got {name!r}")


def evolve(record: R, **changes: Any) -> R:
    """`dataclasses.replace` without re-running the checks (the master's hot path): for changes
    the master itself makes to a record that was checked when it was made. (A Struct's
    __post_init__ runs again: Replica's is one expression.)"""
    if isinstance(record, msgspec.Struct):
        return msgspec.structs.replace(record, **changes)
    new = object.__new__(type(record))
    new.__dict__.update(record.__dict__)
    new.__dict__.update(changes)
    return new


def moved_to(first: Replica, offsets: Iterable[int]) -> list[Replica]:
    """Copies of the checked replica `first` at each of `offsets` (offsets the caller checked:
    an allocator's, or decoded as >= 0), no check run again: a third of the cost of making
    each (Replica's __post_init__ runs for every one made or `replace`d)."""
    copy, force = first.__copy__, msgspec.structs.force_setattr  # type: ignore[attr-defined]
    out = []
    for offset in offsets:
        r = copy()
        force(r, "offset", offset)
        out.append(r)
    return out


class ReplicaStatus(str, enum.Enum):
    PENDING = "pending"  # allocated by put_start, being written
    COMPLETE = "complete"  # put_end said the bytes are in place


@dataclass(frozen=True)
class Mount:
    """Memory a client contributes: bytes [base, base+size) of its transfer-engine segment `name`.

    One client may mount several ranges of one transfer segment; each mount is identified by
    (name, base) and ranges of one name never overlap. `ledger`, `ledger_slots`: where in
    the transfer segment its put ledger lives (store/ledger.py; 0 slots: none, not HA).
    """

    name: str
    client_id: str
    host: str
    base: int
    size: int
    tier: Tier = "dram"
    ledger: int = 0
    ledger_slots: int = 0

    def __post_init__(self) -> None:
        _check_name(self.name, "segment name")
        _check_name(self.client_id, "client id")
        if not isinstance(self.host, str):
            raise InvalidParams(f"host must be a string, got {self.host!r}")
        _check_int(self.base, "segment base", 0)
        _check_int(self.size, "segment size", 1)
        if self.size > MAX_SEGMENT_SIZE:
            raise InvalidParams(f"segment size {self.size} exceeds the limit of "
                                f"{MAX_SEGMENT_SIZE} bytes (256 TiB)")
        if self.base + self.size > MAX_OFFSET:
            raise InvalidParams(f"segment [{self.base}, {self.base + self.size}) ends past the "
                                "64-bit offset space")
        check_tier(self.tier)
        _check_int(self.ledger, "ledger offset", 0)
        _check_int(self.ledger_slots, "ledger slots", 0)
        if self.ledger >= MAX_OFFSET or self.ledger_slots > 1 << 16:
            raise InvalidParams("ledger: an offset and at most 65536 slots")

    def holds(self, offset: int, size: int) -> bool:
        """Whether [offset, offset+size) of the transfer segment lies inside this mount."""
        return self.base <= offset and offset + size <= self.base + self.size


class Replica(msgspec.Struct, frozen=True, gc=False, array_like=True):
    """One copy of an object: `size` bytes at `offset` of transfer segment `segment` on `host`.

    `offset` is absolute in the transfer segment (the mount's base included), ready for a
    transfer request. `checksum` is whatever the client computed (None until put_end gives one).
    `note_at`, `note_seq` (put_start answers of an HA leader only): where the writer leaves its
    ledger record of this replica, and the record's sequence number (0: no record).

    A msgspec Struct (the master makes several per put: a third of the cost of a dataclass),
    never tracked by the garbage collector; its checks are one expression when all is well.
    """

    segment: str
    offset: int
    size: int
    tier: Tier = "dram"
    host: str = ""
    checksum: str | None = None
    status: ReplicaStatus = ReplicaStatus.PENDING
    note_at: int = 0
    note_seq: int = 0

    def __post_init__(self) -> None:
        if not (type(self.segment) is str and self.segment and type(self.offset) is int
                and self.offset >= 0 and type(self.size) is int
                and 0 < self.size <= MAX_OBJECT_SIZE and self.tier in TIERS
                and type(self.host) is str
                and (self.checksum is None or type(self.checksum) is str)
                and type(self.status) is ReplicaStatus and type(self.note_at) is int
                and type(self.note_seq) is int and self.note_at >= 0 and self.note_seq >= 0):
            self._refuse()

    def _refuse(self) -> None:
        """InvalidParams naming the first bad field (a status given as its value is taken)."""
        _check_name(self.segment, "replica segment")
        _check_int(self.offset, "replica offset", 0)
        check_size(self.size, "replica size")
        _check_int(self.note_at, "ledger record offset", 0)
        _check_int(self.note_seq, "ledger record seq", 0)
        check_tier(self.tier)
        if not isinstance(self.host, str):
            raise InvalidParams(f"host must be a string, got {self.host!r}")
        if self.checksum is not None and not isinstance(self.checksum, str):
            raise InvalidParams(f"checksum must be a string, got {self.checksum!r}")
        if type(self.status) is not ReplicaStatus:
            try:
                msgspec.structs.force_setattr(self, "status", ReplicaStatus(self.status))
            except ValueError:
                raise InvalidParams(f"replica status {self.status!r} is unknown") from None


@dataclass(frozen=True)
class ReplicateConfig:
    """How a put is placed: replica count, preferred segments (hints, in order), pins.

    A hard-pinned object is never evicted; a soft-pinned one only after every unpinned one, and
    only while its soft pin lasts: `soft_pin_ttl` seconds after its last use (0: the master's
    default). `replica_num` is best effort: as many as there are segments, at least one.
    """

    replica_num: int = 1
    preferred_segment: str = ""
    soft_pin: bool = False
    hard_pin: bool = False
    preferred_segments: tuple[str, ...] = ()
    soft_pin_ttl: float = 0.0

    def __post_init__(self) -> None:
        _check_int(self.replica_num, "replica_num", 1)
        if self.replica_num > MAX_REPLICAS:
            raise InvalidParams(f"replica_num {self.replica_num} exceeds {MAX_REPLICAS}")
        if not isinstance(self.preferred_segment, str):
            raise InvalidParams("preferred_segment must be a string")
        if not isinstance(self.soft_pin, bool) or not isinstance(self.hard_pin, bool):
            raise InvalidParams("soft_pin and hard_pin must be booleans")
        segs = self.preferred_segments
        if not isinstance(segs, (tuple, list)) or len(segs) > 64 or \
                not all(isinstance(s, str) for s in segs):
            raise InvalidParams("preferred_segments must be at most 64 segment names")
        object.__setattr__(self, "preferred_segments", tuple(segs))
        ttl = self.soft_pin_ttl
        if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not 0 <= ttl < 1e9:
            raise InvalidParams(f"soft_pin_ttl must be seconds in [0, 1e9), got {ttl!r}")

    @property
    def preferred(self) -> tuple[str, ...]:
        """The preferred segments in order: `preferred_segment` first, then the list."""
        first = (self.preferred_segment,) if self.preferred_segment else ()
        return first + tuple(s for s in self.preferred_segments if s != self.preferred_segment)


DEFAULT_CONFIG = ReplicateConfig()  # the one default: compared by identity (`is`) on hot paths


class ObjectMeta(msgspec.Struct, frozen=True, gc=False):
    """What the master knows of one key. `put_deadline` is None once the put has ended.

    A msgspec Struct (the master makes one for every change of an object: a tenth of the
    cost of a dataclass), never tracked by the garbage collector (it holds no cycle)."""

    key: str
    size: int
    replicas: tuple[Replica, ...]
    config: ReplicateConfig
    created: float
    last_access: float
    lease_until: float = 0.0
    put_deadline: float | None = None
    soft_pin_until: float = 0.0  # a soft pin lasts until then (renewed by each use)

    @property
    def complete(self) -> bool:
        return self.put_deadline is None

    def leased(self, now: float) -> bool:
        return self.lease_until > now

    def soft_pinned(self, now: float) -> bool:
        return self.config.soft_pin and self.soft_pin_until > now


@dataclass(frozen=True)
class TierStats:
    segments: int
    objects: int  # objects with at least one complete replica on this tier
    bytes_used: int  # allocated bytes (alignment included, pending puts included)
    capacity: int
    resident_bytes: int = 0  # bytes of the complete replicas on this tier


@dataclass(frozen=True)
class StoreStats:
    """A snapshot for `stat` and /metrics; counters run from the master's start."""

    tiers: Mapping[Tier, TierStats]
    objects: int
    pending: int
    clients: int
    hits: int
    misses: int
    evictions: int
    puts: int
    gets: int
    offloads: int = 0  # objects moved from DRAM to SSD instead of being evicted
    promotions: int = 0  # SSD-only objects copied back into DRAM after a get
    moves: int = 0  # offloads and promotions under way
    clock: float = 0.0  # the master's wall clock (Unix seconds) at the snapshot; 0: unknown
    policy: str = ""  # the eviction policy's name ("" from a master that does not say)
    evicted_by: Mapping[str, int] = field(default_factory=dict)  # see EVICTION_CAUSES
    copied_bytes: Mapping[str, int] = field(default_factory=dict)  # see COPY_KINDS


# Why an object was evicted: room for a put (`room`), above the high watermark (`watermark`), an
# `evict` call (`request`), room on one segment for a promotion or an added replica
# (`promotion`, `replica`), room on a full SSD tier (`ssd`). Bytes the master had copied, by
# kind: `replica` (added on another segment: between nodes), `offload` and `promote` (between the
# tiers of one node).
EVICTION_CAUSES = ("room", "watermark", "request", "promotion", "replica", "ssd")
COPY_KINDS = ("replica", "offload", "promote")


@dataclass(frozen=True)
class TickReport:
    """What one `tick` did: clients declared dead, puts discarded, keys lost or evicted."""

    dead_clients: tuple[str, ...] = ()
    discarded_puts: tuple[str, ...] = ()
    lost_keys: tuple[str, ...] = ()
    evicted: tuple[str, ...] = ()
