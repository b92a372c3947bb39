"""KV event batches as vLLM and SGLang publish them over ZMQ, decoded and checked.

One message is three frames: topic (may be empty), sequence number (8 bytes big-endian), and
the msgpack payload `[timestamp, [events...], dp_rank]` (vLLM's `KVEventBatch`, a msgspec
struct encoded as an array). An event is vLLM's msgspec struct with `tag=True`:

    vLLM 0.32 (map):       {"type": "BlockStored", "block_hashes": [...], ...}
    SGLang, older vLLM:    ["BlockStored", block_hashes, parent_block_hash, token_ids,
                            block_size, lora_id, medium, ...]        (tagged array)

Both are read. `BlockStored` (block_hashes, parent_block_hash, token_ids, block_size, lora_id,
medium, lora_name, extra_keys, group_idx), `BlockRemoved` (block_hashes, medium, group_idx),
`AllBlocksCleared`. A block hash is vLLM's own (bytes, or an int with
VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES): opaque here, only compared. `Malformed` names what is
wrong; nothing a publisher sends raises anything else.

The shared contract's standard envelope is read for a store master's per-object events: a map
with `event_type` ("stored", "removed", "cleared"), `object_key` and `medium` ("cpu", "disk",
...) is an `ObjectStored`, `ObjectRemoved` or `Cleared` (its event_id, timestamp and
backend_id are not needed: the batch's sequence number orders). Envelope events that carry
seq_hashes instead of an object key are not read (Malformed).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

BlockHash = bytes | int
MEDIA = {"GPU": "gpu", "CPU": "cpu", "STORAGE": "disk", "DISK": "disk", "SSD": "disk"}
_STORED = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium",
           "lora_name", "extra_keys", "group_idx")
_REMOVED = ("block_hashes", "medium", "group_idx")
_DECODER = msgspec.msgpack.Decoder()


class Malformed(ValueError):
    """A frame, batch or event that does not have vLLM's shape."""


@dataclass(frozen=True)
class Stored:
    hashes: tuple[BlockHash, ...]
    parent: BlockHash | None
    token_ids: tuple[int, ...]
    block_size: int
    medium: str
    lora_name: str | None
    extra_keys: tuple[Any, ...] | None  # one entry per block, or None
    group: int


@dataclass(frozen=True)
class Removed:
    hashes: tuple[BlockHash, ...]
    medium: str
    group: int


@dataclass(frozen=True)
class Cleared:
    pass


@dataclass(frozen=True)
class ObjectStored:
    key: str
    medium: str


@dataclass(frozen=True)
class ObjectRemoved:
    key: str
    medium: str


Event = Stored | Removed | Cleared | ObjectStored | ObjectRemoved
MAX_KEY = 4096  # characters of an object key (the store's own limit is lower)


@dataclass(frozen=True)
class Batch:
    ts: float
    events: tuple[Event | Malformed, ...]  # a bad event is kept as its Malformed, in place
    dp_rank: int | None


def sequence_number(frame: bytes) -> int:
    if len(frame) != 8:
        raise Malformed(f"sequence number of {len(frame)} bytes (8 expected)")
    return int.from_bytes(frame, "big")


def medium_of(raw: Any) -> str:
    """vLLM's medium ("GPU", "CPU", "STORAGE"; None: GPU) as a tier: gpu, cpu, disk or other."""
    if raw is None:
        return "gpu"
    if not isinstance(raw, str):
        raise Malformed(f"medium {raw!r} is not a string")
    return MEDIA.get(raw.upper(), "other")


def decode_batch(payload: bytes) -> Batch:
    try:
        raw = _DECODER.decode(payload)
    except (msgspec.DecodeError, ValueError) as e:
        raise Malformed(f"payload is not msgpack: {e}") from None
    if not isinstance(raw, list) or len(raw) not in (2, 3):
        raise Malformed("payload is not [timestamp, [events...], dp_rank]")
    ts, events = raw[0], raw[1]
    rank = raw[2] if len(raw) == 3 else None
    if not isinstance(ts, (int, float)) or isinstance(ts, bool) or not isinstance(events, list):
        raise Malformed("payload is not [timestamp, [events...], dp_rank]")
    if rank is not None and (not isinstance(rank, int) or isinstance(rank, bool) or rank < 0):
        raise Malformed(f"dp_rank {rank!r} is not a rank")
    return Batch(float(ts), tuple(_event_or_error(e) for e in events), rank)


def _event_or_error(raw: Any) -> Event | Malformed:
    try:
        return decode_event(raw)
    except Malformed as e:
        return e


def _fields(raw: Any, names: tuple[str, ...]) -> tuple[str, dict[str, Any]]:
    if isinstance(raw, dict):
        tag = raw.get("type")
        fields = {k: v for k, v in raw.items() if k != "type"}
    elif isinstance(raw, list) and raw:
        tag = raw[0]
        fields = dict(zip(names, raw[1:], strict=False))
    else:
        raise Malformed("an event is neither a tagged map nor a tagged array")
    if not isinstance(tag, str):
        raise Malformed("an event has no type tag")
    return tag, fields


def decode_event(raw: Any) -> Event:
    if isinstance(raw, dict) and "event_type" in raw:
        return _envelope(raw)
    tag, _ = _fields(raw, ())
    if tag == "AllBlocksCleared":
        return Cleared()
    if tag == "BlockRemoved":
        _, f = _fields(raw, _REMOVED)
        return Removed(_hashes(f.get("block_hashes")), medium_of(f.get("medium")),
                       _group(f.get("group_idx")))
    if tag != "BlockStored":
        raise Malformed(f"unknown event type {tag[:40]!r}")
    _, f = _fields(raw, _STORED)
    hashes = _hashes(f.get("block_hashes"))
    parent = f.get("parent_block_hash")
    if parent is not None and not _is_hash(parent):
        raise Malformed("parent_block_hash is not a block hash")
    tokens, size = f.get("token_ids"), f.get("block_size")
    if not isinstance(tokens, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 1 << 32 for t in tokens):
        raise Malformed("token_ids is not a list of token ids")
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise Malformed(f"block_size {size!r} is not a positive integer")
    if len(tokens) != size * len(hashes):
        raise Malformed(f"{len(tokens)} token_ids for {len(hashes)} blocks of {size}")
    lora = f.get("lora_name")
    if lora is not None and not isinstance(lora, str):
        raise Malformed("lora_name is not a string")
    extra = f.get("extra_keys")
    if extra is not None and (not isinstance(extra, list) or len(extra) != len(hashes)):
        raise Malformed("extra_keys is not one entry per block")
    return Stored(hashes, parent, tuple(tokens), size, medium_of(f.get("medium")), lora,
                  None if extra is None else tuple(extra), _group(f.get("group_idx")))


def _envelope(raw: dict[Any, Any]) -> Event:
    """A standard-envelope event of a store master (object_key)."""
    kind = raw["event_type"]
    if kind == "cleared":
        return Cleared()
    if kind not in ("stored", "removed"):
        raise Malformed(f"unknown event_type {str(kind)[:40]!r}")
    key = raw.get("object_key")
    if key is None:
        raise Malformed("a standard-envelope event without object_key (seq_hashes are not "
                        "read)")
    if not isinstance(key, str) or not 0 < len(key) <= MAX_KEY:
        raise Malformed("object_key is not a key")
    medium = medium_of(raw.get("medium"))
    return ObjectStored(key, medium) if kind == "stored" else ObjectRemoved(key, medium)


def _is_hash(h: Any) -> bool:
    return isinstance(h, bytes) or (isinstance(h, int) and not isinstance(h, bool))


def _hashes(raw: Any) -> tuple[BlockHash, ...]:
    if not isinstance(raw, list) or not all(_is_hash(h) for h in raw):
        raise Malformed("block_hashes is not a list of block hashes")
    return tuple(raw)


def _group(raw: Any) -> int:
    if raw is None:
        return 0
    if not isinstance(raw, int) or isinstance(raw, bool):
        raise Malformed(f"group_idx {raw!r} is not an integer")
    return raw
