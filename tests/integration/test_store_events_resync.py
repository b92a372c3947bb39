"""The store master's event publisher (store/master/events.py) when a subscriber cannot get
every event: its queue overflows, or a subscriber joins after the replay buffer has moved on.
A real StoreMaster (in this process, no service: its changes are the request path's) with
the publisher attached, and the conductor's indexer subscribed over real ZMQ sockets; each
case ends with the index holding exactly what the master holds. Also the envelope's decoding
and the store index's refusals on their own."""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial

import msgspec
import pytest

from mooncake_cli.api.kv_events import replay_of
from mooncake_cli.conductor.event_index import Match
from mooncake_cli.conductor.indexer import Indexer
from mooncake_cli.conductor.kv_events import (
    Cleared,
    Malformed,
    ObjectRemoved,
    ObjectStored,
    decode_batch,
)
from mooncake_cli.conductor.store_index import StoreIndex
from mooncake_cli.kvkeys import KVNamespace, block_keys
from mooncake_cli.store.master import StoreMaster
from mooncake_cli.store.master.events import ObjectEvents
from mooncake_cli.store.records import Mount
from tests.conftest import wait_for

NS = KVNamespace("m", "float16", 16, 1, 1, 8)
KEYS = block_keys(list(range(20 * 16)), NS)  # 20 blocks


@pytest.fixture
def master() -> StoreMaster:
    mst = StoreMaster()
    mst.mount_segment(Mount("seg", "client", "host", 4096, 1 << 20))
    return mst


@pytest.fixture
def indexer() -> Iterator[Indexer]:
    ix = Indexer()
    yield ix
    ix.close()


def put(mst: StoreMaster, keys: list[str]) -> None:
    for key in keys:
        mst.put_start(key, 1024)
        mst.put_end(key)


def follow(ix: Indexer, ev: ObjectEvents) -> None:
    ix.follow_store(ev.endpoint, ev.replay_endpoint)


def test_an_overflowing_queue_resyncs(master, indexer) -> None:
    ev = ObjectEvents("tcp://127.0.0.1:0", "tcp://127.0.0.1:0", queue_size=0)  # every change
    try:
        ev.attach(master)
        follow(indexer, ev)
        wait_for(lambda: ev.counts["subscribed"] >= 1, 10, 0.02, "the subscription")
        put(master, KEYS)
        wait_for(lambda: indexer.store_depth(KEYS)["cpu"] == 20, 20, 0.05, "the resync")
        assert ev.counts["dropped"] > 0 and ev.counts["resyncs"] >= 1, ev.counts
        master.remove(KEYS[7])
        wait_for(lambda: indexer.store_depth(KEYS)["cpu"] == 7, 20, 0.05, "the removal")
        assert indexer.store_depth(KEYS) == {"longest": 7, "cpu": 7, "disk": 0}
    finally:
        ev.close()


def test_a_subscriber_behind_the_buffer_gets_a_resync(master, indexer) -> None:
    ev = ObjectEvents("tcp://127.0.0.1:0", "tcp://127.0.0.1:0", buffer=4)
    try:
        ev.attach(master)
        for i, key in enumerate(KEYS):  # one batch each, none heard: the buffer keeps 4
            put(master, [key])
            wait_for(partial(lambda n: ev.counts["stored"] == n, i + 1), 10, 0.01, "the batch")
        assert ev.counts["batches"] == 21
        follow(indexer, ev)
        wait_for(lambda: indexer.store_depth(KEYS)["cpu"] == 20, 20, 0.05, "the resync")
        counts = indexer.snapshot()[0]["counts"]
        assert counts["unrecovered"] > 0 and counts["cleared_on_loss"] >= 1, counts
        assert ev.counts["resyncs"] >= 1 and ev.counts["replays"] >= 1, ev.counts
        assert indexer.store_depth(KEYS) == {"longest": 20, "cpu": 20, "disk": 0}
    finally:
        ev.close()


def test_a_new_master_state_is_cleared(master, indexer) -> None:
    """An HA term won or lost replaces the master's state: subscribers forget the old one."""
    ev = ObjectEvents("tcp://127.0.0.1:0", "tcp://127.0.0.1:0")
    try:
        ev.attach(master)
        follow(indexer, ev)
        put(master, KEYS[:5])
        wait_for(lambda: indexer.store_depth(KEYS)["cpu"] == 5, 20, 0.05, "the puts")
        fresh = StoreMaster()
        fresh.mount_segment(Mount("seg", "client", "host", 4096, 1 << 20))
        ev.attach(fresh)
        wait_for(lambda: indexer.store_depth(KEYS)["longest"] == 0, 20, 0.05, "the clear")
        put(master, KEYS[5:8])  # the old state's changes are no longer published
        put(fresh, KEYS[:2])
        wait_for(lambda: indexer.store_depth(KEYS)["cpu"] == 2, 20, 0.05, "the new puts")
        assert indexer.snapshot()[0]["blocks"] == {"cpu": 2}
    finally:
        ev.close()


def test_envelope_events_are_read_and_bad_ones_named() -> None:
    """The standard envelope with object_key as the store publishes it, and what is refused."""
    base = {"event_id": 0, "timestamp": 1, "backend_id": "m:1"}
    good = [{**base, "event_type": "cleared"},
            {**base, "event_type": "stored", "object_key": KEYS[0], "medium": "cpu"},
            {**base, "event_type": "removed", "object_key": KEYS[0], "medium": "disk"}]
    bad = [({**base, "event_type": "stored", "seq_hashes": [1]}, "without object_key"),
           ({**base, "event_type": "stored", "object_key": 7}, "not a key"),
           ({**base, "event_type": "moved", "object_key": "k"}, "unknown event_type"),
           ({**base, "event_type": "stored", "object_key": "k", "medium": 3}, "medium")]
    batch = decode_batch(msgspec.msgpack.encode([1.0, good + [b for b, _ in bad], 0]))
    assert batch.events[:3] == (Cleared(), ObjectStored(KEYS[0], "cpu"),
                                ObjectRemoved(KEYS[0], "disk"))
    for got, (_, why) in zip(batch.events[3:], bad, strict=True):
        assert isinstance(got, Malformed) and why in str(got), got
    ix = StoreIndex()
    ix.apply([ObjectStored(KEYS[0], "cpu"), ObjectStored("vllm@key", "cpu"),
              ObjectStored("kv/bad", "cpu"), ObjectRemoved(KEYS[1], "cpu")])
    assert (ix.counts["stored"], ix.counts["foreign"], ix.counts["removed_unknown"]) == (1, 2, 1)
    assert ix.depth(KEYS) == Match(1, {"gpu": 0, "cpu": 1, "disk": 0})


def test_replay_endpoints_are_derived() -> None:
    assert replay_of("tcp://127.0.0.1:5557") == "tcp://127.0.0.1:5558"
    assert replay_of("tcp://127.0.0.1:0") == "tcp://127.0.0.1:0"
    assert replay_of("ipc:///tmp/ev") == "ipc:///tmp/ev.replay"
