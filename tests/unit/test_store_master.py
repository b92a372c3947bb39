"""StoreMaster: placement, two-phase puts, leases, eviction, input checks, batches and listing.

Time is a FakeClock injected as the master's `now`: tests move it instead of sleeping.
"""

from __future__ import annotations

import dataclasses
from itertools import pairwise

import pytest

from mooncake_cli.store import (
    MAX_KEY_BYTES,
    Mount,
    ReplicaStatus,
    ReplicateConfig,
    StoreCode,
    StoreError,
    StoreMaster,
    TickReport,
)
from mooncake_cli.store.errors import (
    InvalidKey,
    InvalidParams,
    InvalidWrite,
    NoAvailableHandle,
    ObjectAlreadyExists,
    ObjectHasLease,
    ObjectNotFound,
    ReplicaNotReady,
)
from tests.helpers.clock import FakeClock

MiB = 1 << 20


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(1000.0)


@pytest.fixture
def master(clock: FakeClock) -> StoreMaster:
    """Segments a1, a2 on host A and b1 on host B, 1 MiB each."""
    m = StoreMaster(now=clock, lease_ttl=5.0, put_timeout=30.0, client_ttl=10.0)
    for name, host in (("a1", "A"), ("a2", "A"), ("b1", "B")):
        m.mount_segment(Mount(name, f"client-{name}", host, 4096, MiB))
    return m


def put(m: StoreMaster, key: str, size: int = 1000, **cfg: object) -> None:
    m.put_start(key, size, ReplicateConfig(**cfg))  # type: ignore[arg-type]
    m.put_end(key, checksum="c")


def snapshot(m: StoreMaster) -> object:
    return m.list(), m.segment_usage(), dataclasses.replace(m.stats(), clock=0.0)


def test_replicas_land_on_distinct_segments_and_hosts(master: StoreMaster) -> None:
    reps = master.put_start("k2", 5000, ReplicateConfig(replica_num=2))
    assert {r.host for r in reps} == {"A", "B"}
    reps3 = master.put_start("k3", 5000, ReplicateConfig(replica_num=3))
    assert sorted(r.segment for r in reps3) == ["a1", "a2", "b1"]
    for r in (*reps, *reps3):
        assert r.status is ReplicaStatus.PENDING and r.size == 5000
        assert r.offset >= 4096 and (r.offset - 4096) % 64 == 0  # base included, aligned
    master.put_end("k3", checksum="abc")
    got = master.get_replica_list("k3")
    assert [(r.segment, r.offset) for r in got] == [(r.segment, r.offset) for r in reps3]
    assert all(r.status is ReplicaStatus.COMPLETE and r.checksum == "abc" for r in got)


def test_preferred_segment_comes_first_and_unknown_is_only_a_hint(master: StoreMaster) -> None:
    assert master.put_start("p", 10, ReplicateConfig(preferred_segment="a2"))[0].segment == "a2"
    reps = master.put_start("q", 10, ReplicateConfig(2, preferred_segment="a1"))
    assert [r.host for r in reps] == ["A", "B"] and reps[0].segment == "a1"
    assert len(master.put_start("r", 10, ReplicateConfig(preferred_segment="nope"))) == 1


def test_not_enough_segments_or_too_big_is_refused_without_change(master: StoreMaster) -> None:
    put(master, "old")
    before = snapshot(master)
    with pytest.raises(NoAvailableHandle) as e:
        master.put_start("x", MiB + 1)  # larger than every segment: nothing is evicted for it
    assert e.value.code == StoreCode.NO_AVAILABLE_HANDLE == -200
    assert snapshot(master) == before
    with pytest.raises(NoAvailableHandle):
        StoreMaster().put_start("x", 10)  # no segment at all


def test_replica_num_is_best_effort_and_preferred_segments_come_in_order(
        master: StoreMaster) -> None:
    reps = master.put_start("x", 10, ReplicateConfig(replica_num=4))  # 3 segments mounted
    assert len({r.segment for r in reps}) == 3
    cfg = ReplicateConfig(2, preferred_segments=("nope", "b1", "a2"))
    assert [r.segment for r in master.put_start("y", 10, cfg)] == ["b1", "a2"]


def test_two_phase_put_states(master: StoreMaster) -> None:
    master.put_start("k", 100)
    with pytest.raises(ReplicaNotReady) as e:
        master.get_replica_list("k")
    assert e.value.code == -703
    assert not master.exists("k") and master.list() == []
    with pytest.raises(ObjectAlreadyExists) as e2:
        master.put_start("k", 100)
    assert e2.value.code == -705
    with pytest.raises(ReplicaNotReady):
        master.remove("k")
    master.put_end("k")
    master.put_end("k")  # a repeated put_end is harmless
    assert master.exists("k") and master.list() == ["k"]
    with pytest.raises(InvalidWrite):
        master.put_revoke("k")
    with pytest.raises(ObjectNotFound) as e3:
        master.put_end("never-started")
    assert e3.value.code == -704


def test_put_revoke_frees_the_space(master: StoreMaster) -> None:
    master.put_start("k", 300_000, ReplicateConfig(replica_num=3))
    assert master.stats().tiers["dram"].bytes_used > 0
    master.put_revoke("k")
    assert master.stats().tiers["dram"].bytes_used == 0
    with pytest.raises(ObjectNotFound):
        master.describe("k")


def test_put_never_ended_is_discarded_after_timeout(master: StoreMaster, clock: FakeClock
                                                    ) -> None:
    master.put_start("slow", 1000)
    master.put_start("lazy", 1000)
    for _ in range(3):  # the clients stay alive (heartbeats) while nobody ends the puts
        clock.advance(9.9)
        assert all(master.heartbeat(f"client-{n}") for n in ("a1", "a2", "b1"))
        assert master.tick() == TickReport()
    clock.advance(0.4)
    report = master.tick()
    assert set(report.discarded_puts) == {"slow", "lazy"} and report.lost_keys == ()
    assert master.stats().tiers["dram"].bytes_used == 0
    with pytest.raises(ObjectNotFound):
        master.put_end("slow")
    master.put_start("lazy", 10)  # the key is free again


def test_timed_out_put_is_discarded_even_without_tick(master: StoreMaster, clock: FakeClock
                                                      ) -> None:
    master.put_start("k", 1000)
    clock.advance(31)
    with pytest.raises(ObjectNotFound):
        master.put_end("k")
    master.put_start("k", 2000)
    assert master.describe("k").size == 2000


def test_lease_blocks_remove_until_it_expires(master: StoreMaster, clock: FakeClock) -> None:
    put(master, "k")
    master.get_replica_list("k")
    clock.advance(4)
    with pytest.raises(ObjectHasLease) as e:
        master.remove("k")
    assert e.value.code == StoreCode.OBJECT_HAS_LEASE == -706
    assert master.exists("k")  # exists renews the lease too: now until t+4+5
    clock.advance(4.5)
    with pytest.raises(ObjectHasLease):
        master.remove("k")
    clock.advance(0.6)
    master.remove("k")
    assert not master.exists("k")


def test_force_remove_and_remove_all(master: StoreMaster) -> None:
    for k in ("a", "b", "c"):
        put(master, k)
    master.put_start("pending", 10)
    master.get_replica_list("b")
    assert master.remove_all() == 2  # leased b and the pending put stay
    assert master.list() == ["b"]
    master.remove("b", force=True)
    put(master, "d")
    master.exists("d")
    assert master.remove_all(force=True) == 2
    assert master.stats().tiers["dram"].bytes_used == 0


def test_list_by_prefix(master: StoreMaster) -> None:
    for k in ("m/b", "m/a", "n/a", "m"):
        put(master, k, 10)
    master.put_start("m/pending", 10)
    assert master.list("m/") == ["m/a", "m/b"]
    assert master.list() == ["m", "m/a", "m/b", "n/a"]
    assert master.list("zzz") == []
    with pytest.raises(InvalidParams):
        master.list("p" * (MAX_KEY_BYTES + 1))


def test_batch_forms_give_one_result_per_key(master: StoreMaster) -> None:
    res = master.batch_put_start(["a", "b", "", "a"], [10, 20, 30, 40])
    assert isinstance(res[0], tuple) and isinstance(res[1], tuple)
    assert isinstance(res[2], InvalidKey) and isinstance(res[3], ObjectAlreadyExists)
    assert master.batch_put_end(["a", "b", "zz"], ["x", None, None])[:2] == [None, None]
    assert isinstance(master.batch_put_end(["zz"])[0], ObjectNotFound)
    got = master.batch_get_replica_list(["a", "zz"])
    assert isinstance(got[0], tuple) and got[0][0].checksum == "x"
    assert isinstance(got[1], ObjectNotFound)
    assert master.batch_exists(["a", "b", "zz"]) == [True, True, False]
    rm = master.batch_remove(["a", "zz"])
    assert isinstance(rm[0], ObjectHasLease) and isinstance(rm[1], ObjectNotFound)
    assert master.batch_remove(["a", "b"], force=True) == [None, None]
    master.batch_put_start(["r"], [10])
    assert master.batch_put_revoke(["r", "r"])[0] is None
    with pytest.raises(InvalidParams):
        master.batch_put_start(["a"], [1, 2])
    with pytest.raises(InvalidParams):
        master.batch_exists("abc")  # a str is not a list of keys
    assert master.list() == []


def test_counters(master: StoreMaster) -> None:
    put(master, "k")
    master.get_replica_list("k")
    for key in ("missing", "k"):
        try:
            master.get_replica_list(key)
        except StoreError:
            pass
    s = master.stats()
    assert (s.puts, s.gets, s.hits, s.misses, s.objects, s.pending) == (1, 3, 2, 1, 1, 0)
    assert s.tiers["dram"].capacity == 3 * MiB and s.tiers["dram"].objects == 1
    assert s.tiers["ssd"].capacity == 0


def test_a_batch_on_one_segment_is_cut_at_once_and_refused_keys_keep_no_block(
        clock: FakeClock) -> None:
    m = StoreMaster(now=clock, put_timeout=30.0)
    m.mount_segment(Mount("only", "client-only", "A", 4096, MiB))
    put(m, "old", 1000)
    used = m.stats().tiers["dram"].bytes_used
    keys = ["k0", "old", "k2", "", "k4", "k0"]
    res = m.batch_put_start(keys, [1000] * len(keys))
    assert isinstance(res[1], ObjectAlreadyExists) and isinstance(res[3], InvalidKey)
    assert isinstance(res[5], ObjectAlreadyExists)  # the same key twice in one batch
    placed = [r[0] for r in res if isinstance(r, tuple)]
    assert [r.offset for r in placed] == sorted({r.offset for r in placed})  # one run, in order
    assert len(placed) == 3 and all(b.offset - a.offset == 1024 for a, b in pairwise(placed))
    assert m.stats().tiers["dram"].bytes_used == used + 3 * 1024  # the three refused: no block
    assert m.batch_put_end(["k0", "k2", "k4"], ["c"] * 3) == [None] * 3
    assert m.batch_remove(["k0", "k2", "k4", "old"]) == [None] * 4
    assert m.stats().tiers["dram"].bytes_used == 0
    mixed = m.batch_put_start(["m0", "m1"], [1000, 3000])  # sizes differ: one at a time
    assert [r[0].size for r in mixed if isinstance(r, tuple)] == [1000, 3000]
    fresh = m.batch_put_start(["f0", "f1", "f2"], [1000] * 3)  # all new: placed at once
    offs = [r[0].offset for r in fresh]  # type: ignore[index]
    assert all(b - a == 1024 for a, b in pairwise(offs))  # one run, in the keys' order
    assert m.batch_put_end(["f0", "f1", "f2"], ["c"] * 3) == [None] * 3  # admitted as by
    assert all(m.exists(k) for k in ("f0", "f1", "f2"))  # `_start`, each its own block
    again = m.batch_put_start(["f3", "f1", "ü"], [1000] * 3)  # not all plain and new
    assert isinstance(again[1], ObjectAlreadyExists) and isinstance(again[2], tuple)
