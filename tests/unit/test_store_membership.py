"""Mounts, client heartbeats and death, re-registration after a failover, records' checks, and
many threads at once."""

from __future__ import annotations

import random
import threading
from itertools import pairwise

import pytest

from mooncake_cli.store import Mount, Replica, ReplicateConfig, StoreError, StoreMaster
from mooncake_cli.store.errors import (
    InvalidParams,
    InvalidReplica,
    ObjectAlreadyExists,
    SegmentAlreadyExists,
    SegmentNotFound,
    StoreCode,
)
from tests.helpers.clock import FakeClock

KiB, MiB = 1 << 10, 1 << 20


def seg(name: str, client: str = "", host: str = "h", base: int = 0, size: int = MiB,
        tier: str = "dram") -> Mount:
    return Mount(name, client or f"c-{name}", host, base, size, tier)  # type: ignore[arg-type]


def assert_no_overlap(m: StoreMaster) -> None:
    spans = sorted((r.segment, r.offset, r.offset + r.size)
                   for k in m.list() for r in m.describe(k).replicas)
    for (s1, _, e1), (s2, b2, _) in pairwise(spans):
        assert s1 != s2 or e1 <= b2


def put(m: StoreMaster, key: str, size: int = 1000, n: int = 1, **cfg: object) -> None:
    m.put_start(key, size, ReplicateConfig(n, **cfg))  # type: ignore[arg-type]
    m.put_end(key)


def test_mount_rules() -> None:
    m = StoreMaster()
    assert m.mount_segment(seg("x", base=0, size=MiB))
    assert not m.mount_segment(seg("x", base=0, size=MiB))  # the same mount again: no change
    assert m.mount_segment(seg("x", base=MiB, size=MiB))  # a second range of the same segment
    with pytest.raises(SegmentAlreadyExists) as e:
        m.mount_segment(seg("x", base=MiB // 2, size=MiB))  # overlaps both
    assert e.value.code == -102
    with pytest.raises(SegmentAlreadyExists):
        m.mount_segment(seg("x", client="intruder", base=4 * MiB))
    # two mounts of one segment are not two segments: one replica (replica_num is best effort)
    assert len(m.put_start("k", 10, ReplicateConfig(2))) == 1
    assert m.stats().tiers["dram"].capacity == 2 * MiB
    with pytest.raises(InvalidParams):
        m.mount_segment(("x", "c", "h", 0, 10))  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [dict(name=""), dict(size=0), dict(base=-1), dict(tier="tape"),
                                 dict(size=1.5)])
def test_bad_segments_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(InvalidParams):
        seg(**{"name": "x", **bad})  # type: ignore[arg-type]


def test_unmount_drops_replicas_and_objects_left_without_any() -> None:
    m = StoreMaster()
    for name, host in (("a", "A"), ("b", "B")):
        m.mount_segment(seg(name, host=host))
    put(m, "both", n=2)
    put(m, "only-a", preferred_segment="a")
    assert m.unmount_segment("a") == ("only-a",)
    assert [r.segment for r in m.get_replica_list("both")] == ["b"]
    assert m.list() == ["both"]
    with pytest.raises(SegmentNotFound) as e:
        m.unmount_segment("a")
    assert e.value.code == StoreCode.SEGMENT_NOT_FOUND == -101
    assert m.stats().tiers["dram"].capacity == MiB


def test_dead_client_loses_segments_surviving_replicas_stay() -> None:
    clock = FakeClock()
    m = StoreMaster(now=clock, client_ttl=10.0)
    for name, host in (("a", "A"), ("b", "B"), ("c", "C")):
        m.mount_segment(seg(name, client=f"client-{name}", host=host))
    put(m, "ab", n=2, preferred_segment="a")
    put(m, "a-only", preferred_segment="a")
    put(m, "c-only", preferred_segment="c")
    for _ in range(2):
        clock.advance(4)
        assert m.heartbeat("client-b") and m.heartbeat("client-c")
        assert m.tick().dead_clients == ()
    clock.advance(2.5)
    report = m.tick()  # client-a last spoke 10.5 s ago
    assert report.dead_clients == ("client-a",) and report.lost_keys == ("a-only",)
    assert sorted(m.list()) == ["ab", "c-only"]
    assert all(r.segment != "a" for r in m.get_replica_list("ab"))
    assert {s.name for s, _ in m.segment_usage()} == {"b", "c"}
    assert not m.heartbeat("client-a")  # unknown now: it must mount again
    m.mount_segment(seg("a", client="client-a", host="A"))
    assert m.heartbeat("client-a")
    put(m, "abc", n=3)


def test_unmount_client_is_a_graceful_leave() -> None:
    m = StoreMaster()
    m.mount_segment(seg("a", client="one"))
    m.mount_segment(seg("a", client="one", base=MiB))
    put(m, "k")
    assert m.unmount_client("one") == ("k",)
    assert m.segment_usage() == [] and m.stats().clients == 0


def test_register_existing_rebuilds_a_new_masters_index() -> None:
    old, new = StoreMaster(), StoreMaster()
    segs = [seg("a", host="A"), seg("b", host="B")]
    for s in segs:
        old.mount_segment(s)
    put(old, "x", 5000, n=2)
    put(old, "y", 7000)
    old.put_end("x", "ignored: already complete")
    held = {k: old.get_replica_list(k) for k in old.list()}
    for s in segs:  # failover: the clients mount again on the new leader and re-announce
        new.mount_segment(s)
    for key, reps in held.items():
        by_segment: dict[str, list[Replica]] = {}
        for r in reps:
            by_segment.setdefault(r.segment, []).append(r)
        for rs in by_segment.values():  # each client announces only its own replicas
            new.register_existing(key, rs)
    assert new.list() == ["x", "y"]
    assert {(r.segment, r.offset) for r in new.get_replica_list("x")} == \
           {(r.segment, r.offset) for r in held["x"]}
    assert new.segment_usage() == old.segment_usage()
    for i in range(20):  # fresh puts never overlap the re-registered replicas
        put(new, f"fresh{i}", 4000, n=2)
    assert_no_overlap(new)


def test_register_existing_refusals_change_nothing() -> None:
    m = StoreMaster()
    m.mount_segment(seg("a"))
    m.mount_segment(seg("b"))
    put(m, "k", 1000, preferred_segment="a")
    at = m.get_replica_list("k")[0].offset
    before = (m.list(), m.segment_usage())
    cases = [
        ("dup", [Replica("b", 0, 100), Replica("a", at, 100)], InvalidReplica),  # overlap on a
        ("gone", [Replica("zzz", 0, 100)], SegmentNotFound),
        ("k", [Replica("b", 0, 999)], ObjectAlreadyExists),  # another size
        ("tier", [Replica("b", 0, 100, "ssd")], InvalidReplica),
        ("odd", [Replica("b", 32, 100)], InvalidReplica),  # unaligned
        ("over", [Replica("b", MiB - 64, 100)], SegmentNotFound),  # runs past the mount
        ("sizes", [Replica("a", 4096, 100), Replica("b", 0, 200)], InvalidReplica),
        ("two-on-b", [Replica("b", 0, 100), Replica("b", 4096, 100)], InvalidReplica),
        ("none", [], InvalidParams),
    ]
    for key, reps, exc in cases:
        with pytest.raises(exc):
            m.register_existing(key, reps)
        assert (m.list(), m.segment_usage()) == before, key
    m.register_existing("c1", [Replica("b", 0, 100, checksum="s1")])
    with pytest.raises(InvalidReplica):
        m.register_existing("c1", [Replica("a", 8192, 100, checksum="s2")])
    m.register_existing("c1", [Replica("a", 8192, 100, checksum="s1")])
    m.register_existing("c1", [Replica("a", 8192, 100)])  # a repeat is harmless
    assert len(m.get_replica_list("c1")) == 2
    res = m.batch_register_existing([("c2", [Replica("b", 4096, 10)]), ("", [])])
    assert res[0].key == "c2" and isinstance(res[1], StoreError)  # type: ignore[union-attr]


def test_many_threads_keep_the_books_straight() -> None:
    m = StoreMaster(lease_ttl=0.001)
    for i in range(4):
        m.mount_segment(seg(f"s{i}", host=f"h{i % 2}", size=256 * KiB))
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        rnd = random.Random(seed)
        try:
            for _ in range(300):
                key = f"k{rnd.randrange(40)}"
                op = rnd.random()
                try:
                    if op < 0.4:
                        m.put_start(key, rnd.randrange(1, 20 * KiB), ReplicateConfig(
                            rnd.randint(1, 3)))
                        if rnd.random() < 0.8:
                            m.put_end(key)
                        else:
                            m.put_revoke(key)
                    elif op < 0.8:
                        m.get_replica_list(key)
                    else:
                        m.remove(key, force=rnd.random() < 0.5)
                except StoreError:
                    pass
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    used = sum(u for _, u in m.segment_usage())
    booked = sum(-(-r.size // 64) * 64 for k in m.list() for r in m.describe(k).replicas)
    assert m.stats().pending == 0 and used == booked
    assert_no_overlap(m)
