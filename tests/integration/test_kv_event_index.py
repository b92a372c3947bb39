"""The event index on its own: vLLM's batches (encoded by msgspec from vLLM's structs) decoded
and applied, its bounds, and the blocks it refuses to index (salted, other KV groups)."""

from __future__ import annotations

import struct
from typing import Any

import msgspec
import pytest
import xxhash

from mooncake_cli.conductor.event_index import StreamIndex
from mooncake_cli.conductor.kv_events import Cleared, Malformed, Stored, decode_batch
from mooncake_cli.conductor.seqhash import seq_hashes
from tests.helpers.kv_publisher import BlockRemoved, BlockStored, KVEventBatch

T = list(range(300, 400))


def stored(hashes: list[bytes | int], tokens: list[int], parent: int | None = None,
           medium: str = "GPU", extra: list[tuple[Any, ...] | None] | None = None,
           group: int | None = None, lora: str | None = None) -> BlockStored:
    return BlockStored(hashes, parent, tokens, 16, None, medium, lora, extra_keys=extra,
                       group_idx=group)


def apply(ix: StreamIndex, *events: BlockStored | BlockRemoved) -> None:
    batch = decode_batch(msgspec.msgpack.encode(KVEventBatch(1.0, list(events), 0)))
    assert not [e for e in batch.events if isinstance(e, Malformed)]
    ix.apply([e for e in batch.events if not isinstance(e, Malformed)])


def longest(ix: StreamIndex, tokens: list[int] = T, lora: str | None = None) -> int:
    return ix.match(lora, seq_hashes(tokens, ix.block_size)).longest


def test_seq_hashes_are_the_spec_formula() -> None:
    local = [xxhash.xxh3_64_intdigest(struct.pack("<4I", *T[i:i + 4]), 1337) for i in (0, 4)]
    second = xxhash.xxh3_64_intdigest(struct.pack("<QQ", local[0], local[1]), 1337)
    assert seq_hashes(T[:11], 4) == [local[0], second]


def test_decoded_fields() -> None:
    raw = KVEventBatch(2.5, [stored([5], T[:16], parent=4, medium="STORAGE")], 3)
    batch = decode_batch(msgspec.msgpack.encode(raw))
    assert (batch.ts, batch.dp_rank) == (2.5, 3)
    assert batch.events[0] == Stored((5,), 4, tuple(T[:16]), 16, "disk", None, None, 0)
    none_rank = decode_batch(msgspec.msgpack.encode([1, [{"type": "AllBlocksCleared"}]]))
    assert none_rank.events == (Cleared(),) and none_rank.dp_rank is None
    for bad in (b"", msgspec.msgpack.encode([1.0, "x", 0]), msgspec.msgpack.encode([1.0])):
        with pytest.raises(Malformed):
            decode_batch(bad)


def test_bounded_nodes_forget_what_is_held_nowhere_first() -> None:
    ix = StreamIndex(16, max_nodes=3)
    apply(ix, stored([1, 2, 3], T[:48]))
    apply(ix, BlockRemoved([3], "GPU"))
    apply(ix, stored([9], T[50:66]))  # block 3 is held nowhere: forgotten to make room
    assert ix.held() == {"gpu": 3} and ix.counts["dropped"] == 0
    apply(ix, stored([10], T[70:86]))  # all three held: refused
    assert ix.counts["dropped"] == 1 and ix.held() == {"gpu": 3}
    assert longest(ix) == 2 and longest(ix, T[50:66]) == 1 and longest(ix, T[70:86]) == 0


def test_salted_blocks_and_other_groups_are_not_indexed() -> None:
    ix = StreamIndex(16)
    apply(ix, stored([1, 2], T[:32], extra=[("salt-a",), None]))  # cache_salt on block 0
    assert longest(ix) == 0 and ix.counts["tainted"] == 2
    apply(ix, stored([5], T[:16], extra=[("sql",)], lora="sql"))  # the LoRA name only
    assert longest(ix, lora="sql") == 1 and longest(ix) == 0
    apply(ix, stored([7], T[:16], group=1))
    assert longest(ix) == 0 and ix.counts["other_groups"] == 1
    apply(ix, stored([8], T[:16], group=0), BlockRemoved([8], "GPU"))
    assert longest(ix) == 0 and ix.counts["removed"] == 1
