"""The put ledger: a small region beside each DRAM segment of an HA store, where the writer of
a replica leaves a record of it (key, place, checksum, config) in the same transfer batch as the
bytes. Once that batch is done the owner's memory knows the replica, so an HA leader answers
put_end at once instead of waiting for the owner's confirmation (store/ha/acks.py); if the
leader dies first, the owner re-registers what its ledger records (client/keeper.py).

Layout: `slots` slots of SLOT bytes; the record of ledger sequence number `seq` (1, 2, ...)
lives in slot (seq - 1) % slots. A slot is MAGIC, the payload length (u16), two spare bytes, the
payload's xxh3_64 (u64), then the msgpack payload. A torn or stale slot fails its checksum and
is skipped; a record whose object bytes no longer match its checksum is dropped when the owner
verifies what it holds.

Which records count: the owner's holdings follow the master's journal, and each report says up
to which ledger seq the journal has told the owner (`HoldingsReport.ledger`); records at or
below that are superseded by the holdings (a later remove included), records above it are
puts the owner has not been told of yet.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import msgspec
import xxhash

from mooncake_cli.store.errors import InvalidParams
from mooncake_cli.store.records import DEFAULT_CONFIG, Replica, ReplicaStatus, ReplicateConfig

SLOT = 512  # bytes per record; a put whose record does not fit waits for the owner instead
SLOTS = 2048  # records per ledger (1 MiB), puts under way and not yet confirmed by the owner
MAGIC = b"MCL1"
_HEAD = struct.Struct("<4sHxxQ")


class Record(msgspec.Struct, array_like=True, frozen=True):
    """One ledger record: replica `offset`/`size` of `key` in the owner's segment."""

    seq: int
    key: str
    offset: int
    size: int
    checksum: str
    config: ReplicateConfig

    def replica(self, segment: str, host: str) -> Replica:
        return Replica(segment, self.offset, self.size, "dram", host, self.checksum,
                       ReplicaStatus.COMPLETE)


Note = tuple[str, int, bytes]  # a record to write: the owner's segment, offset, slot bytes


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Record)


def encode(seq: int, key: str, r: Replica, checksum: str,
           config: ReplicateConfig | None) -> bytes | None:
    """The slot bytes of the record of replica `r` of `key`; None if it does not fit a slot."""
    payload = _encoder.encode(Record(seq, key, r.offset, r.size, checksum,
                                     config or DEFAULT_CONFIG))
    if _HEAD.size + len(payload) > SLOT:
        return None
    return _HEAD.pack(MAGIC, len(payload), xxhash.xxh3_64_intdigest(payload)) + payload


def notes(key: str, replicas: Sequence[Replica], checksum: str,
          config: ReplicateConfig | None) -> list[Note]:
    """The records a writer leaves for the replicas an HA leader gave ledger slots to."""
    out: list[Note] = []
    for r in replicas:
        if r.note_seq and (rec := encode(r.note_seq, key, r, checksum, config)) is not None:
            out.append((r.segment, r.note_at, rec))  # None: too big, but the leader checked
    return out


def fits(key: str, config: ReplicateConfig | None) -> bool:
    """Whether the record of a put of `key` fits a slot (cheap for the usual keys)."""
    plain = config is None or (not config.preferred_segments and len(config.preferred_segment) < 32)
    if plain and len(key.encode()) <= 240:  # 16 + 264 bytes of the rest at most
        return True
    r = Replica("x", 1 << 62, 1 << 40)
    return encode(1 << 62, key, r, "f" * 16, config) is not None


def slot_offset(base: int, slots: int, seq: int) -> int:
    """Where the record of `seq` lives in a ledger of `slots` slots at `base`."""
    return base + ((seq - 1) % slots) * SLOT


def scan(view: memoryview, after: int = 0) -> list[Record]:
    """The intact records in a ledger's bytes with seq > `after`, oldest first."""
    out: list[Record] = []
    for at in range(0, len(view) - SLOT + 1, SLOT):
        magic, n, digest = _HEAD.unpack_from(view, at)
        if magic != MAGIC or n > SLOT - _HEAD.size:
            continue
        payload = view[at + _HEAD.size:at + _HEAD.size + n]
        if xxhash.xxh3_64_intdigest(payload) != digest:
            continue
        try:
            rec = _decoder.decode(payload)
        except (msgspec.DecodeError, msgspec.ValidationError, InvalidParams, TypeError):
            continue
        if rec.seq > after:
            out.append(rec)
    out.sort(key=lambda r: r.seq)
    return out
