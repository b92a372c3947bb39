"""Adding a replica to a complete object: the master's two phases on a fake clock, then a real
master process with two clients (reads from both replicas, refusals, a master restart)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from mooncake_cli.store import Mount, ReplicaStatus, ReplicateConfig, StoreMaster
from mooncake_cli.store.client import StoreClient
from mooncake_cli.store.errors import (
    InvalidParams,
    InvalidReplica,
    NoAvailableHandle,
    ObjectAlreadyExists,
    ObjectNotFound,
    ReplicaNotReady,
    SegmentNotFound,
    StoreError,
)
from mooncake_cli.store.wire import protocol as p
from tests.conftest import free_port, wait_for
from tests.helpers.clock import FakeClock
from tests.helpers.store_procs import Proc, start_master

pytestmark = pytest.mark.timeout(60)
MiB = 1 << 20


# -- the master alone --------------------------------------------------------------------------
@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(1000.0)


@pytest.fixture
def m(clock: FakeClock) -> StoreMaster:
    """Segments a and b, 64 KiB each; object "k" (1000 bytes, checksum "c1") complete on a."""
    master = StoreMaster(now=clock, lease_ttl=5.0, put_timeout=30.0, client_ttl=100.0)
    for name in ("a", "b"):
        master.mount_segment(Mount(name, f"client-{name}", name.upper(), 4096, 64 << 10))
    master.put_start("k", 1000, ReplicateConfig(preferred_segment="a"))
    master.put_end("k", "c1")
    return master


def used(m: StoreMaster, segment: str) -> int:
    return sum(n for s, n in m.segment_usage() if s.name == segment)


def test_start_then_end_adds_a_complete_replica(m: StoreMaster) -> None:
    r = m.add_replica_start("k", "b", 1000)
    assert r.segment == "b" and r.status is ReplicaStatus.PENDING
    assert [x.segment for x in m.get_replica_list("k")] == ["a"], "pending is never served"
    m.add_replica_end("k", "b", "c1")
    got = m.get_replica_list("k")
    assert [(x.segment, x.checksum, x.status) for x in got] == \
        [("a", "c1", ReplicaStatus.COMPLETE), ("b", "c1", ReplicaStatus.COMPLETE)]


def test_refusals_change_nothing(m: StoreMaster) -> None:
    m.put_start("half", 1000)
    before = used(m, "b")
    with pytest.raises(ObjectNotFound):
        m.add_replica_start("missing", "b", 1000)
    with pytest.raises(ObjectAlreadyExists):
        m.add_replica_start("k", "a", 1000)  # where it lives already
    with pytest.raises(InvalidParams):
        m.add_replica_start("k", "b", 999)  # not the object's size
    with pytest.raises(SegmentNotFound):
        m.add_replica_start("k", "nowhere", 1000)
    with pytest.raises(ReplicaNotReady):
        m.add_replica_start("half", "b", 1000)
    assert used(m, "b") == before and m.adds_pending() == 0
    m.add_replica_start("k", "b", 1000)
    with pytest.raises(ObjectAlreadyExists):
        m.add_replica_start("k", "b", 1000)  # one add at a time per segment
    assert m.adds_pending() == 1


def test_a_mismatch_is_revoked_and_frees_the_block(m: StoreMaster) -> None:
    before = used(m, "b")
    m.add_replica_start("k", "b", 1000)
    assert used(m, "b") > before
    with pytest.raises(InvalidReplica):
        m.add_replica_end("k", "b", "other bytes")
    assert used(m, "b") == before
    assert [x.segment for x in m.get_replica_list("k")] == ["a"]
    with pytest.raises(ObjectNotFound):
        m.add_replica_end("k", "b", "c1")  # nothing left to end


def test_an_add_never_ended_is_discarded_after_the_put_timeout(m: StoreMaster,
                                                               clock: FakeClock) -> None:
    before = used(m, "b")
    m.add_replica_start("k", "b", 1000)
    clock.t += 29
    m.tick()
    assert m.adds_pending() == 1
    clock.t += 2
    m.tick()
    assert m.adds_pending() == 0 and used(m, "b") == before
    with pytest.raises(ObjectNotFound):
        m.add_replica_end("k", "b", "c1")
    assert m.add_replica_start("k", "b", 1000).segment == "b", "a new add may start"


def test_object_or_segment_gone_meanwhile(m: StoreMaster) -> None:
    m.add_replica_start("k", "b", 1000)
    m.remove("k", force=True)
    assert m.adds_pending() == 0 and used(m, "b") == 0
    m.put_start("k2", 1000, ReplicateConfig(preferred_segment="a"))
    m.put_end("k2", "c2")
    m.add_replica_start("k2", "b", 1000)
    m.unmount_segment("b")
    with pytest.raises(ObjectNotFound):
        m.add_replica_end("k2", "b", "c2")
    assert [x.segment for x in m.get_replica_list("k2")] == ["a"]


def test_no_room_evicts_by_the_usual_rules_never_a_leased_object(clock: FakeClock) -> None:
    m = StoreMaster(now=clock, lease_ttl=5.0, high_watermark=1.0)
    m.mount_segment(Mount("a", "ca", "A", 0, 8192))
    m.mount_segment(Mount("b", "cb", "B", 0, 4096))
    m.put_start("hot", 4096, ReplicateConfig(preferred_segment="a"))
    m.put_end("hot", "h")
    m.put_start("filler", 4096, ReplicateConfig(preferred_segment="b"))
    m.put_end("filler", "f")
    assert m.exists("filler")  # leased for 5 s
    with pytest.raises(NoAvailableHandle):
        m.add_replica_start("hot", "b", 4096)
    assert m.exists("filler"), "a leased object is not evicted for a replica"
    clock.t += 6
    assert m.add_replica_start("hot", "b", 4096).segment == "b"
    assert not m.exists("filler"), "an unleased object is evicted by LRU"


def test_room_for_a_replica_is_made_on_its_segment_only(clock: FakeClock) -> None:
    """Eviction for an add frees blocks of the target segment: an older object elsewhere (the
    least recently used) is not dropped for room it cannot give."""
    m = StoreMaster(now=clock, lease_ttl=5.0, high_watermark=1.0, eviction_ratio=0.01)
    m.mount_segment(Mount("a", "ca", "A", 0, 8192))
    m.mount_segment(Mount("b", "cb", "B", 0, 4096))
    m.put_start("elsewhere", 4096, ReplicateConfig(preferred_segment="a"))  # oldest
    m.put_end("elsewhere", "e")
    clock.t += 1
    m.put_start("filler", 4096, ReplicateConfig(preferred_segment="b"))
    m.put_end("filler", "f")
    clock.t += 1
    m.put_start("hot", 4096, ReplicateConfig(preferred_segment="a"))
    m.put_end("hot", "h")
    clock.t += 6  # no lease left
    assert m.add_replica_start("hot", "b", 4096).segment == "b"
    assert not m.exists("filler")
    assert m.exists("elsewhere"), "not on b: evicting it frees nothing there"


def test_batches_answer_per_key(m: StoreMaster) -> None:
    got = m.batch_add_replica_start(["k", "missing", "k"], "b", [1000, 1000, 1000])
    assert not isinstance(got[0], StoreError)
    assert isinstance(got[1], ObjectNotFound) and isinstance(got[2], ObjectAlreadyExists)
    ends = m.batch_add_replica_end(["k", "missing"], "b", ["c1", "c1"])
    assert ends[0] is None and isinstance(ends[1], ObjectNotFound)
    assert isinstance(m.batch_add_replica_revoke(["k"], "b")[0], ObjectNotFound)


# -- a real master process and two clients ---------------------------------------------------
@pytest.fixture
def master() -> Iterator[Proc]:
    proc = start_master(free_port())
    yield proc
    assert proc.stop() == 0


@pytest.fixture
def client(master: Proc, make_engine: Callable[..., Any]) -> Iterator[Callable[..., StoreClient]]:
    made: list[StoreClient] = []

    def make(segment_size: int = 4 * MiB, **kw: Any) -> StoreClient:
        made.append(StoreClient(master.ready["address"], make_engine(timeout=3), segment_size,
                                **kw))
        return made[-1]

    yield make
    for c in made:
        c.close()


def test_a_replica_on_the_other_segment_serves_reads(client: Callable[..., StoreClient]) -> None:
    a, b = client(), client()
    data = os.urandom(100_000)
    a.put("hot", data, ReplicateConfig(preferred_segment=a.engine.name))
    assert a.add_replica("hot", data, segment=b.engine.name) is True
    reps = a.describe("hot").replicas
    assert {r.segment for r in reps} == {a.engine.name, b.engine.name}
    on_b = next(r for r in reps if r.segment == b.engine.name)
    assert on_b.checksum == reps[0].checksum
    assert a.io.read_bytes("hot", [on_b]) == data, "read over the transfer engine"
    assert b.io.read_bytes("hot", [on_b]) == data, "read with memcpy by its holder"
    a.close()  # the first replica goes with its client
    assert [r.segment for r in b.describe("hot").replicas] == [b.engine.name]
    assert b.get("hot") == data


def test_own_segment_by_default_and_refusals(client: Callable[..., StoreClient]) -> None:
    a, b = client(), client()
    data = os.urandom(5000)
    a.put("k", data, ReplicateConfig(preferred_segment=a.engine.name))
    free_before = b.stats().tiers["dram"].bytes_used
    with pytest.raises(InvalidReplica):
        b.add_replica("k", bytes(x ^ 1 for x in data))  # same size, other bytes
    with pytest.raises(InvalidParams):
        b.add_replica("k", data[:-1])
    assert b.stats().tiers["dram"].bytes_used == free_before, "the refused block is freed"
    with pytest.raises(ObjectNotFound):
        b.add_replica("missing", data)
    assert b.add_replica("k", data) is True
    assert b.add_replica("k", data) is False, "a replica lives there already"
    assert a.add_replica("k", data) is False
    errs = b.batch_add_replica(["k", "missing"], [data, data], segment=a.engine.name)
    assert isinstance(errs[0], ObjectAlreadyExists) and isinstance(errs[1], ObjectNotFound)
    assert sorted(r.segment for r in b.describe("k").replicas) == \
        sorted([a.engine.name, b.engine.name])


def test_malformed_add_requests_are_refused(client: Callable[..., StoreClient]) -> None:
    a = client()
    a.put("k", b"x" * 100)
    for request in (p.BatchAddReplicaEnd(["k"], a.engine.name, []),  # a checksum short
                    p.BatchAddReplicaStart(["k"], "", [100]),  # no segment
                    p.BatchAddReplicaStart(["k"], a.engine.name, [0])):  # no size
        with pytest.raises(InvalidParams):
            a._rpc.call(request, list[p.Reply])
    with pytest.raises(InvalidParams, match="name the segment"):
        client(segment_size=0).add_replica("k", b"x" * 100)
    assert a.get("k") == b"x" * 100 and len(a.describe("k").replicas) == 1


def test_a_restarted_master_relearns_the_added_replica(make_engine: Callable[..., Any]) -> None:
    port = free_port()
    m = start_master(port)
    a = StoreClient(m.ready["address"], make_engine(), 4 * MiB, heartbeat=0.2, timeout=1)
    b = StoreClient(m.ready["address"], make_engine(), 4 * MiB, heartbeat=0.2, timeout=1)
    data = os.urandom(70_000)
    try:
        a.put("hot", data, ReplicateConfig(preferred_segment=a.engine.name))
        assert b.add_replica("hot", data)
        a.close()  # only b's added replica is left, and only b can announce it again
        assert m.stop() == 0
        m = start_master(port)
        wait_for(lambda: _exists(b, "hot"), 10, 0.1, "b to re-register the added replica")
        assert [r.segment for r in b.describe("hot").replicas] == [b.engine.name]
        assert b.get("hot") == data
    finally:
        a.close()
        b.close()
        m.stop()


def _exists(c: StoreClient, key: str) -> bool:
    try:
        return c.exists(key)
    except StoreError:
        return False
