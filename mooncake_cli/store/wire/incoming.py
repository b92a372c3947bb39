"""Decoding the records replies carry many of (replica lists, holdings reports). Replicas are
msgspec Structs decoded as they are (their one-expression check runs); configs go through a
Struct that checks, in C, what the dataclass's own __post_init__ checks, and are then made
without running those checks again. (Decoding a dataclass runs its __post_init__: a fifth of a
batch get, and most of a holdings report, went there.) A record refused by its own checks is a
ValidationError, as one msgspec refuses. A client that only applies a holdings report asks
for `ReportIn` (the checked Structs, no records made of them).

    replicas = DECODERS[list[Replica]].decode(raw)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import msgspec

from mooncake_cli.store.errors import StoreError
from mooncake_cli.store.records import (
    DEFAULT_CONFIG,
    MAX_REPLICAS,
    Replica,
    ReplicateConfig,
    check_key,
)
from mooncake_cli.store.reports import Gone, HoldingsReport, _held

R = TypeVar("R")


class ConfigIn(msgspec.Struct, frozen=True):
    replica_num: Annotated[int, msgspec.Meta(ge=1, le=MAX_REPLICAS)] = 1
    preferred_segment: str = ""
    soft_pin: bool = False
    hard_pin: bool = False
    preferred_segments: Annotated[tuple[str, ...], msgspec.Meta(max_length=64)] = ()
    soft_pin_ttl: Annotated[float, msgspec.Meta(ge=0, lt=1e9)] = 0.0


class HeldIn(msgspec.Struct, frozen=True):
    key: str
    replica: Replica
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


_DEFAULT_IN = ConfigIn()


def config(c: ConfigIn) -> ReplicateConfig:
    """The record of a checked config (the default one shared)."""
    if c == _DEFAULT_IN:
        return DEFAULT_CONFIG
    return _record(ReplicateConfig, msgspec.structs.asdict(c))


def _checked(decode: Callable[[Any], R], raw: Any) -> R:
    """`decode(raw)`, a record's refusal (its __post_init__) turned into a ValidationError."""
    try:
        return decode(raw)
    except StoreError as e:
        raise msgspec.ValidationError(str(e)) from None


class _Replicas:
    def __init__(self) -> None:
        self._dec = msgspec.msgpack.Decoder(list[Replica])

    def decode(self, raw: Any) -> list[Replica]:
        return _checked(self._dec.decode, raw)


class _ReportIn:
    """A report as its checked Structs (keys checked too), for a client that applies it
    straight away (Holdings.apply) and needs no records of it."""

    def __init__(self) -> None:
        self._dec = msgspec.msgpack.Decoder(ReportIn)

    def decode(self, raw: Any) -> ReportIn:
        r = _checked(self._dec.decode, raw)
        for h in r.added:
            _checked(check_key, h.key)
        return r


class _Report(_ReportIn):
    def decode(self, raw: Any) -> HoldingsReport:  # type: ignore[override]
        r = super().decode(raw)
        added = tuple(_held(h.key, h.replica, config(h.config)) for h in r.added)
        removed = tuple(Gone(g.key, g.offset) for g in r.removed)
        return HoldingsReport(r.known, r.epoch, r.upto, r.reset, added, removed, r.ledger)


DECODERS: dict[Any, Any] = {list[Replica]: _Replicas(), HoldingsReport: _Report(),
                            ReportIn: _ReportIn()}
