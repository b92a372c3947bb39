"""The KV indexer API on a running conductor, fed by real publishers: each a process with a ZMQ
PUB and replay ROUTER, its batches encoded by msgspec from vLLM's own structs
(tests/helpers/kv_publisher.py). /register with the cluster secret, then /query and
/query_by_hash answers checked exactly: per instance and tier, per dp rank, after removals and
clears, across block sizes, after gaps filled by replay and a publisher's restart, and after
malformed frames. (Auth and bad bodies: test_conductor_indexer_inputs.py.)"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import msgspec
import pytest

from mooncake_cli.conductor.service import ConductorService
from mooncake_cli.http import jsonhttp
from tests.helpers.indexer_calls import (
    AUTH,
    m,
    publisher_factory,
    query,
    register,
    running_conductor,
    settles,
    spec_hashes,
    streams,
    vh,
)
from tests.helpers.kv_publisher import Publisher, cleared, removed, stored

T = list(range(1000, 1200))  # a prompt's token ids
U = list(range(5000, 5200))  # another's


@pytest.fixture
def conductor() -> Iterator[ConductorService]:
    yield from running_conductor()


@pytest.fixture
def publishers() -> Iterator[Callable[..., Publisher]]:
    yield from publisher_factory()


def test_query_per_instance_tier_and_rank(conductor, publishers) -> None:
    a0, a1, b0 = publishers(), publishers(), publishers()
    register(conductor, a0, "a", dp_rank=0)
    register(conductor, a1, "a", dp_rank=1)
    register(conductor, b0, "b", lora_name=None)
    for p in (a0, a1, b0):
        p.wait_subscribers(1)
    a = [vh("a", i) for i in range(4)]
    a0.publish([stored(a, T[:64], 16)])
    a0.publish([stored(a[:2], T[:32], 16, medium="CPU")])
    a1.publish([stored(a[:2], T[:32], 16), stored(a[:3], T[:48], 16, medium="STORAGE")],
               dp_rank=1)
    b0.publish([stored([1, 2], U[:32], 16), stored([9], T[:16], 16, lora_name="sql")])
    want = {"default": {"a": m(64, 64, 32, 48, {"0": 64, "1": 48}),
                        "b": m(0, 0, 0, 0, {"0": 0})}}
    settles(lambda: query(conductor, token_ids=T[:72]), want)
    assert query(conductor, "/query_by_hash", seq_hashes=spec_hashes(T[:72], 16)) == want
    assert query(conductor, "/query_by_hash", block_hash=spec_hashes(T, 16)[:2],
                 instance_id="a") == {"default": {"a": m(32, 32, 32, 32, {"0": 32, "1": 32})}}
    # a LoRA's blocks answer only for that LoRA; other scopes see no instance
    settles(lambda: query(conductor, token_ids=T[:32], lora_name="sql", instance_id="b"),
            {"default": {"b": m(16, 16, 0, 0, {"0": 16})}})
    assert query(conductor, token_ids=U[:40], instance_id="b") == \
        {"default": {"b": m(32, 32, 0, 0, {"0": 32})}}
    assert query(conductor, token_ids=T, block_size=32) == {"default": {}}
    assert query(conductor, token_ids=T, tenant_id="t2") == {"t2": {}}
    assert query(conductor, token_ids=T, model="other") == {"default": {}}
    assert query(conductor, token_ids=T, cache_salt="s") == {"default": {}}

    a0.publish([removed([a[3]])])  # rank 0 keeps 3 blocks on GPU, 2 on CPU
    settles(lambda: query(conductor, token_ids=T[:72], instance_id="a"),
            {"default": {"a": m(48, 48, 32, 48, {"0": 48, "1": 48})}})
    a0.publish([cleared()])
    settles(lambda: query(conductor, token_ids=T[:72], instance_id="a"),
            {"default": {"a": m(48, 32, 0, 48, {"0": 0, "1": 48})}})
    a1.publish([removed(a[:3], medium="STORAGE")], dp_rank=1)
    settles(lambda: query(conductor, token_ids=T[:72], instance_id="a"),
            {"default": {"a": m(32, 32, 0, 0, {"0": 0, "1": 32})}})

    ans = jsonhttp.call(conductor.url + "/unregister",
                        {"type": "vLLM", "modelname": "m", "instance_id": "a",
                         "block_size": 16, "dp_rank": 1}, auth=AUTH)
    assert ans.body == {"status": "unregistered successfully", "removed_instances": ["a|default|1"]}
    assert query(conductor, token_ids=T[:72], instance_id="a") == \
        {"default": {"a": m(0, 0, 0, 0, {"0": 0})}}


def test_block_sizes_translated(conductor, publishers) -> None:
    """vLLM's blocks of 16 under registrations of 32, 8 and 24: a block of ours is held while
    every vLLM block its tokens lie in is; a part of one at the end is no block."""
    pub = publishers()
    for bs in (32, 8, 24):
        register(conductor, pub, f"v{bs}", block_size=bs)
    pub.wait_subscribers(3)
    h = [vh("s", i) for i in range(5)]
    pub.publish([stored(h[:3], T[:48], 16), stored(h[3:], T[48:80], 16, parent=h[2])])

    def longest() -> dict[int, int]:
        return {bs: query(conductor, token_ids=T, block_size=bs)["default"][f"v{bs}"]
                ["longest_matched"] for bs in (32, 8, 24)}

    settles(longest, {32: 64, 8: 80, 24: 72})
    assert query(conductor, "/query_by_hash", block_size=24,
                 seq_hashes=spec_hashes(T, 24)) == query(conductor, token_ids=T, block_size=24)
    pub.publish([removed([h[1]])])  # tokens 16..31
    settles(longest, {32: 0, 8: 16, 24: 0})
    pub.publish([stored([h[1]], T[16:32], 16, parent=h[0])])  # back: all of it again
    settles(longest, {32: 64, 8: 80, 24: 72})


def test_gaps_are_replayed_and_a_restart_starts_over(conductor, publishers) -> None:
    pub = publishers()
    h = [vh("g", i) for i in range(6)]
    pub.publish([stored(h[:1], T[:16], 16)])  # before anyone subscribed: the replay's
    pub.publish([stored(h[1:2], T[16:32], 16, parent=h[0])])
    register(conductor, pub, "g")
    pub.wait_subscribers(1)
    pub.publish([stored(h[2:3], T[32:48], 16, parent=h[1])])
    settles(lambda: query(conductor, token_ids=T)["default"]["g"]["GPU"], 48)
    pub.publish([stored(h[3:4], T[48:64], 16, parent=h[2])], live=False)  # lost on the wire
    pub.publish([stored(h[4:5], T[64:80], 16, parent=h[3])])
    settles(lambda: query(conductor, token_ids=T)["default"]["g"]["GPU"], 80)
    counts = streams(conductor)["g|0"]["counts"]
    assert (counts["gaps"], counts["replayed"], counts["batches"]) == (2, 3, 5)
    assert "unrecovered" not in counts and streams(conductor)["g|0"]["next_seq"] == 5

    ports = (int(pub.pub.rsplit(":", 1)[1]), int(str(pub.replay).rsplit(":", 1)[1]))
    pub.close()
    again = publishers(ports=ports)  # the engine restarted: sequence numbers from 0, no blocks
    again.wait_subscribers(1)
    again.publish([stored([vh("new", 0)], U[:16], 16)])
    settles(lambda: (query(conductor, token_ids=T)["default"]["g"]["longest_matched"],
                     query(conductor, token_ids=U)["default"]["g"]["longest_matched"]), (0, 16))
    assert streams(conductor)["g|0"]["counts"]["restarts"] == 1


def test_without_replay_endpoint_missed_batches_are_counted(conductor, publishers) -> None:
    pub = publishers(replay=False)
    register(conductor, pub, "n")
    pub.wait_subscribers(1)
    h = [vh("n", i) for i in range(2)]
    pub.publish([stored(h[:1], T[:16], 16)], live=False)
    pub.publish([stored(h[1:], T[16:32], 16, parent=h[0])])  # its parent never arrived
    settles(lambda: streams(conductor)["n|0"]["counts"].get("orphaned"), 1)
    assert streams(conductor)["n|0"]["counts"]["unrecovered"] == 1
    assert query(conductor, token_ids=T)["default"]["n"]["longest_matched"] == 0


def test_malformed_frames_are_counted_and_survived(conductor, publishers) -> None:
    pub = publishers()
    register(conductor, pub, "x")
    pub.wait_subscribers(1)
    seq0 = (0).to_bytes(8, "big")
    pub.raw([b"only one frame"])
    pub.raw([b"", b"\x00\x01", b"payload"])  # a 2-byte sequence number
    good = msgspec.msgpack.encode([1.0, [{"type": "BlockStored", "block_hashes": [7],
                                          "parent_block_hash": None, "token_ids": U[:16],
                                          "block_size": 16, "lora_id": None, "medium": "GPU",
                                          "lora_name": None}], 0])
    pub.raw([b"", seq0, b"\xc1 not msgpack"])
    pub.raw([b"", (1).to_bytes(8, "big"), msgspec.msgpack.encode({"not": "a batch"})])
    bad_events = msgspec.msgpack.encode([1.0, [{"type": "BlockMoved"}, ["BlockStored", [8]],
                                               {"type": "BlockStored", "block_hashes": [9],
                                                "parent_block_hash": None,
                                                "token_ids": [1, 2], "block_size": 16}], 0])
    pub.raw([b"", (2).to_bytes(8, "big"), bad_events])
    pub.raw([b"", (3).to_bytes(8, "big"), good])
    settles(lambda: query(conductor, token_ids=U)["default"]["x"]["GPU"], 16)
    counts = streams(conductor)["x|0"]["counts"]
    assert (counts["malformed_messages"], counts["malformed_events"], counts["batches"],
            counts["events"]) == (4, 3, 4, 1)
    # tagged arrays (SGLang's and older vLLM's encoding) are read too
    arr = msgspec.msgpack.encode([2.0, [["BlockStored", [10], 7, U[16:32], 16, None, "CPU"]], 0])
    pub.raw([b"", (4).to_bytes(8, "big"), arr])
    settles(lambda: query(conductor, token_ids=U)["default"]["x"],
            m(32, 16, 0, 0, {"0": 32}))  # the CPU holds block 1, not block 0
