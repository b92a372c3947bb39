"""Upstream `mooncake.store`'s public API as a specification, held against our compat module
and, where upstream's wheel is installed (the `upstream` extra), against upstream's own class in
the same session: idempotent puts in every form, upserts, soft pins with a TTL, best-effort
replicas, preferred segments, tensors (every dtype, batches, tensor parallelism), buffers,
ranges, replica descriptors and clearing, two clients sharing a local_hostname, setup's
parameters and its failures."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from tests.conftest import free_port, wait_for
from tests.helpers.store_procs import start_master

os.environ.setdefault("GLOG_minloglevel", "2")
pytestmark = pytest.mark.timeout(120)
MiB = 1 << 20
LEASE_S = 0.5


def _upstream_skip() -> str:
    from mooncake_cli.bench import store_upstream

    ok, why = store_upstream.available()
    return "" if ok else why


class Side:
    """One implementation: its module, its master, and stores set up against it."""

    def __init__(self, name: str, module: Any, master: str) -> None:
        self.name, self.m, self.master = name, module, master
        self.stores: list[Any] = []

    def store(self, hostname: str = "127.0.0.1", segment: int = 64 * MiB,
              buffer: int = 64 * MiB, protocol: str = "tcp") -> Any:
        s = self.m.MooncakeDistributedStore()
        rc = s.setup(hostname, "P2PHANDSHAKE", segment, buffer, protocol, "", self.master)
        assert rc == 0, f"{self.name} setup returned {rc}"
        self.stores.append(s)
        return s

    def close(self) -> None:
        for s in reversed(self.stores):
            s.close()
        self.stores.clear()


@pytest.fixture(scope="module", params=["ours", "upstream"])
def side(request: pytest.FixtureRequest) -> Iterator[Side]:
    if request.param == "ours":
        from mooncake_cli.compat import store as ours

        m = start_master(free_port(), "--lease-ttl", str(LEASE_S))
        yield Side("ours", ours, str(m.ready["address"]))
        m.stop()
        return
    why = _upstream_skip()
    if why:
        pytest.skip(why)
    import mooncake.store as theirs

    from mooncake_cli.bench.store_upstream import UpstreamMaster

    um = UpstreamMaster(f"--default_kv_lease_ttl={int(LEASE_S * 1000)}")
    yield Side("upstream", theirs, um.address)
    um.close()


@pytest.fixture
def make(side: Side) -> Iterator[Callable[..., Any]]:
    yield side.store
    if side.stores:
        side.stores[0].remove_all(True)
    side.close()


def test_every_put_form_of_an_existing_key_is_a_success_that_keeps_the_value(
        make: Callable[..., Any]) -> None:
    s = make()
    buf = np.frombuffer(b"B" * 64, dtype=np.uint8).copy()
    assert s.register_buffer(buf.ctypes.data, buf.nbytes) == 0
    assert s.put("k", b"first") == 0
    assert s.put("k", b"second") == 0
    assert s.put_batch(["k", "k2"], [b"x", b"two"]) == 0
    assert s.put_from("k", buf.ctypes.data, 8) == 0
    assert s.batch_put_from(["k", "k3"], [buf.ctypes.data] * 2, [8, 8]) == [0, 0]
    assert s.get("k") == b"first" and s.get("k2") == b"two" and s.get("k3") == b"B" * 8
    assert s.unregister_buffer(buf.ctypes.data) == 0


def test_upserts_replace_or_insert(make: Callable[..., Any]) -> None:
    s = make()
    assert s.put("u", b"old") == 0
    assert s.upsert("u", b"new value") == 0 and s.get("u") == b"new value"
    assert s.upsert("fresh", b"q") == 0 and s.get("fresh") == b"q"
    assert s.upsert_batch(["u", "v"], [b"AA", b"BB"]) == 0
    assert (s.get("u"), s.get("v")) == (b"AA", b"BB")
    buf = np.arange(16, dtype=np.uint8)
    assert s.upsert_from("u", buf.ctypes.data, 16) == 0 and s.get("u") == buf.tobytes()
    assert s.batch_upsert_from(["u", "w"], [buf.ctypes.data] * 2, [4, 4]) == [0, 0]
    assert s.get("u") == s.get("w") == buf.tobytes()[:4]


def test_replicate_config_as_upstream(side: Side) -> None:
    m = side.m
    assert [a.name for a in m.SoftPinAction.__members__.values()] == \
        ["PRESERVE", "ENABLE", "DISABLE"]
    rc = m.ReplicateConfig()
    assert (rc.replica_num, rc.with_hard_pin, rc.soft_pin_ttl_ms, rc.preferred_segment,
            rc.preferred_segments) == (1, False, None, "", [])
    assert rc.soft_pin_action == m.SoftPinAction.PRESERVE
    rc.soft_pin_action, rc.soft_pin_ttl_ms = m.SoftPinAction.ENABLE, 100
    rc.preferred_segments = ["a:1", "b:2"]
    text = str(rc)
    assert "soft_pin_action: ENABLE" in text and "soft_pin_ttl_ms: 100" in text
    assert "preferred_segments: [a:1, b:2]" in text


def test_replica_num_is_best_effort_and_preferred_segments_are_honoured(
        side: Side, make: Callable[..., Any]) -> None:
    a, b = make(), make()
    rc = side.m.ReplicateConfig()
    rc.replica_num = 5
    assert a.put("five", b"x" * 1000, rc) == 0
    descs = a.get_replica_desc("five")
    assert len(descs) == 2 and all(d.is_memory_replica() for d in descs)
    assert len({d.get_memory_descriptor().buffer_descriptor.transport_endpoint
                for d in descs}) == 2
    one = side.m.ReplicateConfig()
    one.preferred_segments = [b.get_hostname()]
    for i in range(4):
        assert a.put(f"on-b-{i}", b"y" * 100, one) == 0
    ends = {d.get_memory_descriptor().buffer_descriptor.transport_endpoint
            for i in range(4) for d in a.get_replica_desc(f"on-b-{i}")}
    assert len(ends) == 1  # every replica on the one preferred segment
    assert a.get_replica_desc("on-b-0")[0].status == side.m.ReplicaStatus.COMPLETE


def test_a_soft_pin_outlives_plain_objects_until_its_ttl(side: Side,
                                                         make: Callable[..., Any]) -> None:
    s = make(segment=16 * MiB, buffer=4 * MiB)
    pin = side.m.ReplicateConfig()
    pin.soft_pin_action = side.m.SoftPinAction.ENABLE
    pin.soft_pin_ttl_ms = 60_000
    short = side.m.ReplicateConfig()
    short.soft_pin_action = side.m.SoftPinAction.ENABLE
    short.soft_pin_ttl_ms = 1_000
    value = b"p" * MiB
    assert s.put("pinned", value, pin) == 0 and s.put("short", value, short) == 0
    time.sleep(1.5)  # sleep: behaviour - "short"'s 1 s pin runs out; "pinned" keeps its own
    for i in range(48):  # three times the segment: plain objects make room for plain ones
        deadline = time.monotonic() + 10  # upstream evicts in the background: -200 meanwhile
        while (rc := s.put(f"plain-{i}", value)) != 0:
            assert rc == -200 and time.monotonic() < deadline, rc
            time.sleep(0.05)  # sleep: poll
        time.sleep(0.01)  # sleep: pace - spaces the fill; the loop above retries a full store
    wait_for(lambda: s.is_exist("short") == 0, 10, what='"short" (its pin run out) evicted')
    assert s.is_exist("pinned") == 1 and s.get("pinned") == value


def test_tensors_of_every_dtype_round_trip(make: Callable[..., Any]) -> None:
    torch = pytest.importorskip("torch")
    s = make()
    dtypes = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8,
              torch.uint8, torch.int16, torch.int32, torch.int64, torch.bool,
              torch.float8_e4m3fn, torch.float8_e5m2]
    for i, dt in enumerate(dtypes):
        t = (torch.arange(60) % 7).to(dt).reshape(3, 4, 5)
        assert s.put_tensor(f"t{i}", t) == 0, dt
        assert s.put_tensor(f"t{i}", t) == 0  # again: a success
        got = s.get_tensor(f"t{i}")
        assert got.dtype == dt and got.shape == t.shape
        assert torch.equal(got.view(torch.uint8), t.view(torch.uint8))
    assert s.get_tensor("no-such") is None
    nc = torch.arange(24, dtype=torch.float32).reshape(4, 6).t()  # not contiguous
    assert s.put_tensor("nc", nc) == 0 and torch.equal(s.get_tensor("nc"), nc)
    ts = [torch.randn(8, 3), torch.ones(2, dtype=torch.int32)]
    assert s.batch_put_tensor(["b0", "b1"], ts) == [0, 0]
    got = s.batch_get_tensor(["b0", "b1", "missing"])
    assert torch.equal(got[0], ts[0]) and torch.equal(got[1], ts[1]) and got[2] is None
    assert s.upsert_tensor("b0", ts[1]) == 0 and torch.equal(s.get_tensor("b0"), ts[1])


def test_large_tensors_round_trip_from_either_store(make: Callable[..., Any]) -> None:
    """Tensors past the size that is hashed as it is copied into the putter's own segment,
    put by a store with a segment and by one without (the replica lands on the other store):
    each reads back equal, stored as upstream's header then the tensor's bytes."""
    torch = pytest.importorskip("torch")
    holder, writer = make(), make(segment=0)
    t = torch.randn(512, 1024).to(torch.bfloat16)  # 1 MiB
    for i, s in enumerate((holder, writer)):
        assert s.put_tensor(f"big{i}", t) == 0
        for reader in (holder, writer):
            assert torch.equal(reader.get_tensor(f"big{i}").view(torch.uint8),
                               t.view(torch.uint8))
        raw = holder.get(f"big{i}")
        assert raw[:4] == b"NOOM" and raw[304:] == t.view(torch.uint8).numpy().tobytes()
    parts = [t[:256], t[256:]]
    assert writer.batch_put_tensor(["p0", "p1"], parts) == [0, 0]
    got = holder.batch_get_tensor(["p0", "p1"])
    assert all(torch.equal(g, p) for g, p in zip(got, parts, strict=True))


def test_tensor_parallel_shards_as_upstream(make: Callable[..., Any]) -> None:
    torch = pytest.importorskip("torch")
    s = make()
    t = torch.arange(48, dtype=torch.float32).reshape(4, 12)
    assert s.put_tensor_with_tp("w", t, tp_rank=0, tp_size=4, split_dim=1) == 0
    assert [s.is_exist(f"w_tp_{r}") for r in range(4)] == [1, 1, 1, 1] and s.is_exist("w") == 0
    for r in range(4):
        shard = s.get_tensor_with_tp("w", tp_rank=r, tp_size=4, split_dim=1)
        assert torch.equal(shard, t[:, 3 * r:3 * r + 3])
    assert s.put_tensor_with_tp("odd", torch.arange(10.0), 0, 3, 0) < 0  # 10 does not split
    assert s.batch_put_tensor_with_tp(["x", "y"], [t, t * 2], 0, 2, 0) == [0, 0]
    got = s.batch_get_tensor_with_tp(["x", "y", "z"], 1, 2)
    assert torch.equal(got[0], t[2:]) and torch.equal(got[1], t[2:] * 2) and got[2] is None
    assert s.put_tensor("whole", t) == 0
    assert torch.equal(s.get_tensor_with_tp("whole", 0, 1, 0), t)
    raw = s.get("w_tp_1")  # the serialisation: header of 304 bytes, then the shard
    assert raw[:4] == b"NOOM" and len(raw) == 304 + 4 * 3 * 4


def test_buffers_and_ranges(side: Side, make: Callable[..., Any]) -> None:
    s = make()
    assert s.put("r1", bytes(range(100))) == 0 and s.put("r2", bytes(range(100, 200))) == 0
    h = s.get_buffer("r1")
    assert h.size() == 100 and bytes(h) == bytes(range(100)) and isinstance(h.ptr(), int)
    assert s.get_buffer("none") is None
    handles = s.batch_get_buffer(["r2", "none"])
    assert bytes(handles[0]) == bytes(range(100, 200)) and handles[1] is None
    buf = np.zeros(64, dtype=np.uint8)
    assert s.register_buffer(buf.ctypes.data, buf.nbytes) == 0
    out = s.get_into_ranges([buf.ctypes.data], [["r1", "r2"]], [[[0, 10], [20]]],
                            [[[5, 50], [0]]], [[[4, 4], [3]]])
    assert out == [[[4, 4], [3]]]
    assert buf[:4].tolist() == [5, 6, 7, 8] and buf[10:14].tolist() == [50, 51, 52, 53]
    assert buf[20:23].tolist() == [100, 101, 102]
    bad = s.get_into_ranges([buf.ctypes.data], [["r1", "none"]], [[[0], [0]]], [[[5], [0]]],
                            [[[400], [3]]])
    assert bad == [[[-600], [-704]]]
    assert s.get_into("r1", buf.ctypes.data, 10) == -600  # too small, as upstream
    assert s.unregister_buffer(buf.ctypes.data) == 0


def test_batch_get_into_reads_every_key(make: Callable[..., Any]) -> None:
    a, b = make(), make()
    rc_values = [np.random.default_rng(i).bytes(4096 + i) for i in range(16)]
    keys = [f"bg{i}" for i in range(16)]
    assert b.put_batch(keys, rc_values) == 0
    bufs = [np.zeros(8192, dtype=np.uint8) for _ in keys]
    got = a.batch_get_into(keys + ["none"], [x.ctypes.data for x in bufs] + [bufs[0].ctypes.data],
                           [8192] * 17)
    assert got[:16] == [len(v) for v in rc_values] and got[16] < 0
    assert all(x[:len(v)].tobytes() == v for x, v in zip(bufs, rc_values, strict=True))


def test_replica_descriptors_and_clearing(side: Side, make: Callable[..., Any]) -> None:
    s = make()
    assert s.put("c1", b"a" * 10) == 0 and s.put("c2", b"b" * 20) == 0
    descs = s.batch_get_replica_desc(["c1", "c2", "none"])
    assert sorted(descs) == ["c1", "c2"]
    assert descs["c2"][0].get_memory_descriptor().buffer_descriptor.size == 20
    time.sleep(LEASE_S + 0.5)  # sleep: behaviour - the gets' leases run out in real time
    assert sorted(s.batch_replica_clear(["c1", "c2", "none"], "")) == ["c1", "c2"]
    assert s.is_exist("c1") == 0 and s.get("c2") == b""


def test_two_clients_share_a_local_hostname(make: Callable[..., Any]) -> None:
    a = make("127.0.0.1:7777")
    b = make("127.0.0.1:7777")
    assert a.put("from-a", b"hello") == 0
    assert b.get("from-a") == b"hello"
    assert b.put("from-b", b"there") == 0 and a.get("from-b") == b"there"


def test_setup_takes_upstreams_thirteen_parameters(side: Side) -> None:
    s = side.m.MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 16 * MiB, 16 * MiB, "tcp", "", side.master,
                   None, False, "", "default", False, 9300) == 0
    assert s.health_check() == 0 and s.put("thirteen", b"ok") == 0
    assert s.remove("thirteen", True) == 0 and s.close() == 0
    with pytest.raises(TypeError):
        side.m.MooncakeDistributedStore().setup("127.0.0.1", "P2PHANDSHAKE", 16 * MiB,
                                                16 * MiB, "tcp", "", side.master,
                                                no_such_argument=1)


def test_no_local_buffer_fails_the_copying_calls_and_rdma_falls_back(side: Side) -> None:
    s = side.m.MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 16 * MiB, 0, "tcp", "", side.master) == 0
    try:
        assert s.put("nobuf", b"abc") == -600 and s.get("nobuf") == b""
    finally:
        s.close()
    r = side.m.MooncakeDistributedStore()  # no RDMA device here: TCP, as upstream
    assert r.setup("127.0.0.1", "P2PHANDSHAKE", 16 * MiB, 16 * MiB, "rdma", "",
                   side.master) == 0
    try:
        assert r.put("rdma-k", b"abc") == 0 and r.get("rdma-k") == b"abc"
        assert r.remove("rdma-k", True) == 0
    finally:
        r.close()


def test_removal_forms(make: Callable[..., Any]) -> None:
    s = make()
    assert s.put_batch([f"re/{i}" for i in range(5)] + ["keep"], [b"v"] * 6) == 0
    assert s.remove_by_regex("^re/[0-2]$", True) == 3
    assert s.batch_remove(["re/3", "none"], True) == [0, -704]
    assert [s.is_exist(k) for k in ("re/0", "re/3", "re/4", "keep")] == [0, 0, 1, 1]
    assert s.remove("none") == -704 and s.get_size("none") == -704
