"""Decoding the records replies carry many of (replica lists, holdings reports) through msgspec
Structs that check, in C, what the records' own __post_init__ checks; the records are then
made without running those checks again. (Decoding a dataclass runs its __post_init__: a fifth
of a batch get, and most of a holdings report, went there.)

    replicas = DECODERS[list[Replica]].decode(raw)
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from mooncake_cli.store.records import (
    MAX_OBJECT_SIZE,
    MAX_REPLICAS,
    Replica,
    ReplicaStatus,
    ReplicateConfig,
    Tier,
    check_key,
)
from mooncake_cli.store.reports import Gone, HoldingsReport, _held

_Count = Annotated[int, msgspec.Meta(ge=0)]


class ReplicaIn(msgspec.Struct, frozen=True):
    segment: Annotated[str, msgspec.Meta(min_length=1)]
    offset: _Count
    size: Annotated[int, msgspec.Meta(ge=1, le=MAX_OBJECT_SIZE)]
    tier: Tier = "dram"
    host: str = ""
    checksum: str | None = None
    status: ReplicaStatus = ReplicaStatus.PENDING
    note_at: _Count = 0
    note_seq: _Count = 0


class ConfigIn(msgspec.Struct, frozen=True):
    replica_num: Annotated[int, msgspec.Meta(ge=1, le=MAX_REPLICAS)] = 1
    preferred_segment: str = ""
    soft_pin: bool = False
    hard_pin: bool = False
    preferred_segments: Annotated[tuple[str, ...], msgspec.Meta(max_length=64)] = ()
    soft_pin_ttl: Annotated[float, msgspec.Meta(ge=0, lt=1e9)] = 0.0


class HeldIn(msgspec.Struct, frozen=True):
    key: str
    replica: ReplicaIn
    config: ConfigIn = ConfigIn()


class GoneIn(msgspec.Struct, frozen=True):
    key: str
    offset: int


class ReportIn(msgspec.Struct, frozen=True):
    known: bool = True
    epoch: str = ""
    upto: int = 0
    reset: bool = False
    added: tuple[HeldIn, ...] = ()
    removed: tuple[GoneIn, ...] = ()
    ledger: int = 0


def _record(cls: type, fields: dict[str, Any]) -> Any:
    out: Any = object.__new__(cls)
    out.__dict__.update(fields)
    return out


def replica(r: ReplicaIn) -> Replica:
    """The record of a checked replica."""
    return _record(Replica, msgspec.structs.asdict(r))


_DEFAULT_IN, _DEFAULT_CONFIG = ConfigIn(), ReplicateConfig()


def config(c: ConfigIn) -> ReplicateConfig:
    """The record of a checked config (the default one shared)."""
    if c == _DEFAULT_IN:
        return _DEFAULT_CONFIG
    return _record(ReplicateConfig, msgspec.structs.asdict(c))


class _Replicas:
    def __init__(self) -> None:
        self._dec = msgspec.msgpack.Decoder(list[ReplicaIn])

    def decode(self, raw: Any) -> list[Replica]:
        return [replica(r) for r in self._dec.decode(raw)]


class _Report:
    def __init__(self) -> None:
        self._dec = msgspec.msgpack.Decoder(ReportIn)

    def decode(self, raw: Any) -> HoldingsReport:
        r = self._dec.decode(raw)
        added = tuple(_held(check_key(h.key), replica(h.replica), config(h.config))
                      for h in r.added)
        removed = tuple(Gone(g.key, g.offset) for g in r.removed)
        return HoldingsReport(r.known, r.epoch, r.upto, r.reset, added, removed, r.ledger)


DECODERS: dict[Any, Any] = {list[Replica]: _Replicas(), HoldingsReport: _Report()}
