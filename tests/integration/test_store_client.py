"""StoreClient against a real master process, with clients in this process and in another:
round trips, replica placement, zero-copy reads, checksums, a killed client, a restarted
master."""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import torch

from mooncake_cli.store import Replica, ReplicateConfig, StoreCode, StoreError
from mooncake_cli.store.client import StoreClient, batch_reads
from mooncake_cli.store.errors import ChecksumMismatch, ObjectNotFound, TransferFailed
from mooncake_cli.store.wire import protocol as p
from tests.conftest import free_port, wait_for
from tests.helpers.store_node import value
from tests.helpers.store_procs import Proc, start_master, start_node

pytestmark = pytest.mark.timeout(60)
MiB = 1 << 20


@pytest.fixture
def master() -> Iterator[Proc]:
    m = start_master(free_port(), "--client-ttl", "2")
    yield m
    assert m.stop() == 0


@pytest.fixture
def nodes(master: Proc) -> Iterator[Callable[..., Proc]]:
    started: list[Proc] = []

    def start(**kw: Any) -> Proc:
        started.append(start_node(master.ready["address"], **kw))
        return started[-1]

    yield start
    for n in started:
        n.stop()


@pytest.fixture
def client(master: Proc, make_engine: Callable[..., Any]) -> Iterator[Callable[..., StoreClient]]:
    made: list[StoreClient] = []

    def make(segment_size: int = 16 * MiB, **kw: Any) -> StoreClient:
        made.append(StoreClient(master.ready["address"], make_engine(timeout=3), segment_size,
                                **kw))
        return made[-1]

    yield make
    for c in made:
        c.close()


def replicas(c: StoreClient, key: str) -> list[Replica]:
    return list(c._rpc.call(p.GetReplicaList(key), list[Replica]))


def corrupt(holder: StoreClient, r: Replica, at: int = 0) -> None:
    """Flip a byte of replica `r` straight in the holding client's memory."""
    assert holder.owner.region is not None and holder.owner.region.view is not None
    holder.owner.region.view[r.offset - holder.owner.region.base + at] ^= 0xFF


def test_round_trips_of_random_sizes(client: Callable[..., StoreClient]) -> None:
    a, b = client(), client()
    rng = random.Random(7)
    sizes = [1, 63, 64, 4095, 4096, 65537, *(rng.randrange(1, 3 * MiB) for _ in range(8))]
    for i, n in enumerate(sizes):
        data = os.urandom(n)
        (a if i % 2 else b).put(f"k{i}", data, ReplicateConfig(replica_num=1 + i % 2))
        assert a.get(f"k{i}") == data and b.get(f"k{i}") == data
        assert a.size(f"k{i}") == n and b.exists(f"k{i}")
    assert a.list("k1") == sorted(k for k in (f"k{i}" for i in range(len(sizes)))
                                  if k.startswith("k1"))
    errors = a.batch_put(["b0", "b1", "k0"], [b"x" * 10, bytearray(b"y" * 20), b"z"])
    assert errors[:2] == [None, None]
    assert isinstance(errors[2], StoreError) and errors[2].code == StoreCode.OBJECT_ALREADY_EXISTS
    got = b.batch_get(["b0", "b1", "nope"])
    assert got[:2] == [b"x" * 10, b"y" * 20] and isinstance(got[2], ObjectNotFound)
    with pytest.raises(StoreError) as e:  # just read: leased
        a.remove("b0")
    assert e.value.code == StoreCode.OBJECT_HAS_LEASE
    a.remove("b0", force=True)
    assert not b.exists("b0")


def test_replicas_land_on_distinct_segments(client: Callable[..., StoreClient]) -> None:
    a, b = client(), client()
    a.put("two", b"v" * 1000, ReplicateConfig(replica_num=2))
    segs = [r.segment for r in replicas(a, "two")]
    assert sorted(segs) == sorted([a.engine.name, b.engine.name])
    a.put("three", b"v", ReplicateConfig(replica_num=3))  # best effort, as upstream
    assert sorted(r.segment for r in replicas(a, "three")) == sorted(segs)


def test_get_into_numpy_and_torch(client: Callable[..., StoreClient]) -> None:
    a, b = client(), client()
    data = os.urandom(3 * MiB + 5)
    a.put("t", data, ReplicateConfig(preferred_segment=a.engine.name))
    arr = np.zeros(4 * MiB, dtype=np.uint8)
    assert b.get_into("t", arr) == len(data) and arr[:len(data)].tobytes() == data
    ten = torch.zeros(len(data), dtype=torch.uint8)
    assert a.get_into("t", ten) == len(data) and ten.numpy().tobytes() == data
    with pytest.raises(StoreError) as e:
        b.get_into("t", bytearray(10))
    assert e.value.code == StoreCode.BUFFER_OVERFLOW
    b.put("from-tensor", torch.arange(256, dtype=torch.uint8))
    assert a.get("from-tensor") == bytes(range(256))


def test_missing_key(client: Callable[..., StoreClient]) -> None:
    a = client()
    for op in (lambda: a.get("nope"), lambda: a.get_into("nope", bytearray(8)),
               lambda: a.size("nope"), lambda: a.remove("nope")):
        with pytest.raises(ObjectNotFound) as e:
            op()
        assert e.value.code == -704
    assert not a.exists("nope")


def test_replicas_in_another_process(client: Callable[..., StoreClient],
                                     nodes: Callable[..., Proc]) -> None:
    a, node = client(), nodes()
    seg = node.ready["segment"]
    data = os.urandom(5 * MiB + 3)
    a.put("remote", data, ReplicateConfig(preferred_segment=seg))
    assert [r.segment for r in replicas(a, "remote")] == [seg]
    assert a.get("remote") == data  # read from the other process
    assert node.ask(cmd="get", key="remote", size=len(data), seed=0)["ok"]
    assert node.ask(cmd="put", key="n", size=MiB + 7, seed=3, replicas=2) == {"ok": True}
    assert {r.segment for r in replicas(a, "n")} == {seg, a.engine.name}
    assert a.get("n") == value(3, MiB + 7)
    assert node.ask(cmd="put", key="na", size=999, seed=4, preferred=a.engine.name)["ok"]
    assert node.ask(cmd="get", key="na", size=999, seed=4) == {"ok": True, "match": True}


def test_checksum_catches_a_flipped_byte(client: Callable[..., StoreClient]) -> None:
    a, b = client(), client()
    data = os.urandom(100_000)
    a.put("k", data, ReplicateConfig(replica_num=2))
    mine = next(r for r in replicas(a, "k") if r.segment == a.engine.name)
    corrupt(a, mine, 777)
    assert a.get("k") == data  # its own replica is bad: the other one is served
    assert b.get("k") == data
    a.put("one", data, ReplicateConfig(preferred_segment=a.engine.name))
    corrupt(a, replicas(a, "one")[0], 99_999)
    for c in (a, b):
        with pytest.raises(ChecksumMismatch):
            c.get("one")
        with pytest.raises(ChecksumMismatch):
            c.get_into("one", bytearray(len(data)))
        got = c.batch_get_into(["one", "k"], [bytearray(len(data)), bytearray(len(data))])
        assert isinstance(got[0], ChecksumMismatch) and got[1] == len(data)


def test_batch_of_big_mapped_reads_is_shared_out_and_still_verified(
        client: Callable[..., StoreClient]) -> None:
    """Enough mapped bytes in one batch go to the copier threads; each copy is still checked."""
    a, b = client(64 * MiB), client(0)
    values = [os.urandom(2 * MiB + k) for k in range(4)]
    names = [f"big{k}" for k in range(4)]
    for name, data in zip(names, values, strict=True):
        a.put(name, data, ReplicateConfig(preferred_segment=a.engine.name))
    assert sum(map(len, values)) >= batch_reads.PARALLEL and batch_reads.COPIERS >= 2
    corrupt(a, replicas(a, "big2")[0], MiB)
    for c in (a, b):  # its own segment, and a same-host peer's mapped memory
        bufs = [bytearray(len(v)) for v in values]
        got = c.batch_get_into(names, bufs)
        assert isinstance(got[2], ChecksumMismatch)
        for k in (0, 1, 3):
            assert got[k] == len(values[k]) and bufs[k] == values[k]


def test_killed_client(client: Callable[..., StoreClient], nodes: Callable[..., Proc]) -> None:
    a, node = client(), nodes()
    b = client(0)  # contributes nothing: every read is remote
    seg = node.ready["segment"]
    both, only = os.urandom(300_000), os.urandom(200_000)
    a.put("both", both, ReplicateConfig(replica_num=2))
    a.put("only", only, ReplicateConfig(preferred_segment=seg))
    node.kill()  # its shared memory is unlinked too: nothing of it can be read any more
    for _ in range(3):  # before the TTL: a surviving replica, or a clean error
        t = time.monotonic()
        assert b.get("both") == both
        with pytest.raises(TransferFailed, match="cannot connect"):  # its one replica is gone
            b.get("only")
        assert time.monotonic() - t < 8
    wait_for(lambda: not a.exists("only"), 10, 0.2, "the dead client's objects to go")
    with pytest.raises(ObjectNotFound):
        b.get("only")
    assert [r.segment for r in replicas(b, "both")] == [a.engine.name]
    assert b.get("both") == both


def test_restarted_master_relearns_objects(make_engine: Callable[..., Any]) -> None:
    port = free_port()
    m = start_master(port)
    c = StoreClient(m.ready["address"], make_engine(), 4 * MiB, heartbeat=0.2, timeout=1)
    try:
        c.put("kept", b"still here" * 100)
        assert m.stop() == 0
        m = start_master(port)
        wait_for(lambda: _exists(c, "kept"), 10, 0.1, "the client to re-register its objects")
        assert c.get("kept") == b"still here" * 100
    finally:
        c.close()
        m.stop()


def _exists(c: StoreClient, key: str) -> bool:
    try:
        return c.exists(key)
    except StoreError:
        return False


@pytest.mark.parametrize("address", ["nohost:abc", "bad host:1", "no-port"])
def test_malformed_master_address_fails_at_once(address: str, make_engine) -> None:
    t0 = time.monotonic()
    with pytest.raises(StoreError) as info:
        StoreClient(address, make_engine(), 0, timeout=1.0)
    assert info.value.code == StoreCode.RPC_FAIL
    assert time.monotonic() - t0 < 2, "a malformed address must not wait for a timeout"


def test_a_put_the_engine_cannot_send_is_revoked(client: Callable[..., StoreClient]) -> None:
    holder = client()
    writer = client(0)  # contributes nothing: its puts go to holder's segment
    writer.engine.close()  # submit now raises the engine's own TransferError
    with pytest.raises(TransferFailed):
        writer.put("k", b"x" * 5000)
    assert writer.batch_put(["k2"], [b"y" * 10])[0] is not None
    assert not holder.exists("k") and not holder.exists("k2")  # revoked, not left half-put
    holder.put("k", b"z" * 10)
    assert holder.get("k") == b"z" * 10


def test_a_client_with_no_segment_beats_at_its_interval(client: Callable[..., StoreClient],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The master never knows a client that mounts nothing; that is no news, so its heartbeat
    keeps its interval instead of asking again at once (it once spun at ~20,000 beats/s,
    a core on each side)."""
    reader = client(segment_size=0, heartbeat=0.2)
    beats: list[float] = []
    beat = reader.owner.keeper.beat

    def counted(wait: float = 0.0) -> bool:
        beats.append(time.monotonic())
        return beat(wait)

    monkeypatch.setattr(reader.owner.keeper, "beat", counted)
    wait_for(lambda: len(beats) >= 4, 10, what="four heartbeats")
    got = beats[:4]
    gaps = [b - a for a, b in zip(got, got[1:], strict=False)]
    assert min(gaps) >= 0.1, f"heartbeats {gaps} s apart at a 0.2 s interval"  # not spinning
    writer = client()
    writer.put("k", b"v" * 100)
    assert reader.get("k") == b"v" * 100


def test_scattered_reads_land_in_registered_parts_without_staging(
        master: Proc, make_engine: Callable[..., Any], nodes: Callable[..., Proc]) -> None:
    """A tcp reader (no mapping of the holder's memory) reads each object straight into its
    parts, as vLLM's store connector asks for a KV block's layers: no staging region made, the
    bytes verified over the parts; a part outside registered memory, a missing key or a bad
    checksum is None (read another way)."""
    node = nodes()
    a = StoreClient(master.ready["address"], make_engine(timeout=3), 16 * MiB)
    b = StoreClient(master.ready["address"], make_engine(timeout=3, transport="tcp"), 0)
    try:
        data = [os.urandom(3 * 65536 + i) for i in range(3)]
        seg = ReplicateConfig(preferred_segment=node.ready["segment"])
        for i, d in enumerate(data):
            a.put(f"s{i}", d, seg)
        a.put("mine", data[0], ReplicateConfig(preferred_segment=a.engine.name))
        dest = np.zeros(1 << 20, np.uint8)
        b.engine.register(dest)
        view = dest.data  # memoryview(dest), as numpy types it
        parts = [[view[i * 300_000 + j * 70_000:][:65536] for j in range(3)] for i in range(3)]
        for i in range(3):
            parts[i].append(view[i * 300_000 + 250_000:][:i])  # the remainder (0..2 bytes)
        got = b.batch_get_scattered(["s0", "s1", "s2", "nope"], [*parts, [view[:10]]])
        assert got == [len(d) for d in data] + [None]
        for i, d in enumerate(data):
            assert b"".join(bytes(p) for p in parts[i]) == d
        assert b.io._stage._region is None  # nothing staged
        outside = [memoryview(bytearray(65536)) for _ in range(3)] + [memoryview(bytearray(0))]
        assert b.batch_get_scattered(["s0"], [outside]) == [None]
        corrupt(a, replicas(a, "mine")[0], 5)
        assert b.batch_get_scattered(["mine"], [parts[0]]) == [None]  # failed its checksum
    finally:
        b.close()
        a.close()
