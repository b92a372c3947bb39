"""Eviction: LRU order, the high watermark under a 2x-capacity fill, leases, hard and soft pins,
eviction on a failed allocation, and tiers (only DRAM replicas are evicted)."""

from __future__ import annotations

import pytest

from mooncake_cli.store import Mount, Replica, ReplicateConfig, StoreMaster
from mooncake_cli.store.errors import NoAvailableHandle
from tests.helpers.clock import FakeClock

KiB, MiB = 1 << 10, 1 << 20


def make(clock: FakeClock, size: int = 100 * KiB, n: int = 1, **kw: float) -> StoreMaster:
    m = StoreMaster(now=clock, lease_ttl=5.0, **kw)
    for i in range(n):
        m.mount_segment(Mount(f"s{i}", f"c{i}", f"h{i}", 0, size))
    return m


def put(m: StoreMaster, key: str, size: int, **cfg: object) -> None:
    m.put_start(key, size, ReplicateConfig(**cfg))  # type: ignore[arg-type]
    m.put_end(key)


def test_least_recently_used_goes_first() -> None:
    clock = FakeClock(50.0)
    m = make(clock)
    for i in range(10):  # 80 KiB of 100: under the watermark
        put(m, f"k{i}", 8 * KiB)
        clock.advance(1)
    m.get_replica_list("k0")
    clock.advance(6)  # the lease is over; k0 stays the most recently used
    assert m.evict() == ["k1"]  # 5% of 100 KiB is one 8 KiB object
    assert m.evict(20 * KiB) == ["k2", "k3", "k4"]
    assert m.exists("k0") and m.stats().evictions == 4


def test_fill_to_twice_capacity_respects_watermark_leases_and_pins() -> None:
    clock = FakeClock(50.0)
    m = make(clock, size=1 * MiB, n=3)
    cap = m.stats().tiers["dram"].capacity
    lease_until: dict[str, float] = {}
    kind: dict[str, str] = {}  # hard + soft pins alone come to more than the capacity
    present: set[str] = set()
    evicted: list[str] = []
    size = 64 * KiB
    for i in range(2 * cap // size):
        key = f"obj{i:03d}"
        kind[key] = "hard" if i % 7 == 0 else "soft" if i % 2 == 0 else "plain"
        m.put_start(key, size, ReplicateConfig(hard_pin=kind[key] == "hard",
                                               soft_pin=kind[key] == "soft"))
        assert m.stats().tiers["dram"].bytes_used <= 0.90 * cap
        m.put_end(key)
        if i % 4 == 0:
            m.get_replica_list(key)
            lease_until[key] = clock.t + 5.0
        gone = present - set(m.list())
        evicted += gone
        for g in gone:
            assert kind[g] != "hard", f"hard-pinned {g} was evicted"
            assert lease_until.get(g, 0) <= clock.t, f"leased {g} was evicted"
        if any(kind[g] == "soft" for g in gone):  # soft-pinned only once no plain one is left
            plain_left = [k for k in m.list() if kind[k] == "plain" and k != key
                          and lease_until.get(k, 0) <= clock.t]
            assert plain_left == []
        present = set(m.list())
        clock.advance(0.25)
    s = m.stats()
    assert s.evictions == len(evicted) and s.puts == 2 * cap // size
    assert {kind[k] for k in evicted} == {"plain", "soft"}
    assert all(k in present for k, v in kind.items() if v == "hard")
    assert s.tiers["dram"].bytes_used <= 0.90 * cap


def test_soft_pinned_are_evicted_last() -> None:
    clock = FakeClock(50.0)
    m = make(clock, high_watermark=1.0)
    put(m, "soft-old", 8 * KiB, soft_pin=True)
    for i in range(5):
        put(m, f"plain{i}", 8 * KiB)
    assert m.evict(40 * KiB) == [f"plain{i}" for i in range(5)]
    assert m.evict(1) == ["soft-old"]


def test_failed_allocation_evicts_then_retries_once() -> None:
    clock = FakeClock(50.0)
    m = make(clock, high_watermark=1.0)  # never relieved early: only a failed put evicts
    for i in range(10):
        put(m, f"k{i}", 10 * KiB)
    assert m.stats().tiers["dram"].bytes_used == 100 * KiB
    m.put_start("new", 15 * KiB)
    assert not m.exists("k0") and not m.exists("k1") and m.exists("k2")
    assert m.stats().evictions == 2


def test_nothing_evictable_means_no_room() -> None:
    clock = FakeClock(50.0)
    m = make(clock, high_watermark=1.0)
    for i in range(5):
        put(m, f"leased{i}", 10 * KiB)
        m.exists(f"leased{i}")
    for i in range(4):
        put(m, f"hard{i}", 10 * KiB, hard_pin=True)
    m.put_start("pending", 10 * KiB)
    with pytest.raises(NoAvailableHandle):
        m.put_start("one-too-many", 10 * KiB)
    assert m.stats().evictions == 0 and len(m.list()) == 9
    clock.advance(5.1)  # leases over: now the leased ones can go
    m.put_start("one-too-many", 10 * KiB)
    assert m.stats().evictions == 1 and not m.exists("leased0")


def test_eviction_drops_only_dram_replicas() -> None:
    clock = FakeClock(50.0)
    m = make(clock, high_watermark=1.0)
    m.mount_segment(Mount("disk", "c9", "h9", 0, MiB, tier="ssd"))
    m.register_existing("both", [Replica("s0", 0, 8 * KiB), Replica("disk", 0, 8 * KiB, "ssd")])
    clock.t += 6.0  # a re-registered key starts leased (readers of the old master): let it end
    put(m, "dram-only", 8 * KiB)
    assert m.evict(16 * KiB) == ["both", "dram-only"]
    assert [r.tier for r in m.get_replica_list("both")] == ["ssd"]
    assert not m.exists("dram-only")
    s = m.stats()
    assert s.tiers["dram"].bytes_used == 0 and s.tiers["ssd"].objects == 1


def test_ssd_tier_puts_never_evict() -> None:
    clock = FakeClock(50.0)
    m = make(clock)
    m.mount_segment(Mount("disk", "c9", "h9", 0, 64 * KiB, tier="ssd"))
    reps = m.put_start("cold", 60 * KiB, tier="ssd")
    assert reps[0].tier == "ssd" and reps[0].segment == "disk"
    m.put_end("cold")
    with pytest.raises(NoAvailableHandle):
        m.put_start("colder", 8 * KiB, tier="ssd")
    assert m.exists("cold") and m.stats().evictions == 0


def test_tick_relieves_once_leases_expire() -> None:
    clock = FakeClock(50.0)
    m = make(clock)
    for i in range(12):  # 96 KiB of 100: every object leased, so put_start cannot relieve
        put(m, f"k{i}", 8 * KiB)
        m.exists(f"k{i}")
    assert m.stats().tiers["dram"].bytes_used == 96 * KiB
    assert m.tick().evicted == ()
    clock.advance(5.1)
    m.heartbeat("c0")
    report = m.tick()
    assert report.evicted == ("k0",) and report.dead_clients == ()
    assert m.stats().tiers["dram"].bytes_used <= 0.90 * 100 * KiB


def test_a_soft_pin_lasts_its_ttl_after_the_last_use() -> None:
    clock = FakeClock(50.0)
    m = make(clock, soft_pin_ttl=100.0)
    put(m, "short", 8 * KiB, soft_pin=True, soft_pin_ttl=10.0)  # oldest
    put(m, "default", 8 * KiB, soft_pin=True)  # the master's 100 s
    put(m, "plain", 8 * KiB)
    clock.advance(6)  # leases over, every pin still on
    assert m.evict() == ["plain"]
    clock.advance(5)  # "short" is 11 s past its put: unpinned, evicted like any other
    assert m.evict() == ["short"]
    m.get_replica_list("default")  # a use renews the pin for another 100 s
    clock.advance(90)
    put(m, "newer", 8 * KiB)
    clock.advance(6)
    assert m.evict() == ["newer"]  # "default": 107 s after its put, 96 s after its use
    clock.advance(10)
    assert m.evict() == ["default"]


def _walk_counted(clock: FakeClock):
    """A 4 MiB master; and how many keys its policy has yielded so far."""
    m = make(clock, size=4 * MiB)
    walked = 0
    victims = m.state.policy.victims

    def counted():
        nonlocal walked
        for key in victims():
            walked += 1
            yield key
    m.state.policy.victims = counted  # type: ignore[method-assign]
    return m, lambda: walked


def test_eviction_without_ssd_walks_the_policy_order_once() -> None:
    """With no SSD mount there is nowhere to offload to: evicting k objects must not look for
    SSD room among all n objects once per victim (that made every eviction O(n x k): 0.4 s
    pauses of a 16 MiB segment of 4 KiB blocks)."""
    clock = FakeClock(50.0)
    m, walks = _walk_counted(clock)
    n = 0
    while m.stats().evictions == 0:  # fill to the watermark: the put over it evicts
        put(m, f"k{n}", 4 * KiB)
        clock.advance(0.001)
        n += 1
    evicted = m.stats().evictions
    assert n > 900 and evicted >= 40  # 5% of 1024 blocks
    assert walks() <= 2 * evicted + 10, (walks(), evicted, n)


def test_a_fruitless_eviction_is_not_retried_by_every_put_at_once() -> None:
    """Every object leased (read within lease_ttl): a put over the watermark finds nothing to
    evict. The next puts must not each walk every object again (that made each put of a full
    segment 6-12 ms); a while later, or on request, the master looks again."""
    from mooncake_cli.store.master.eviction import DRY_RETRY
    clock = FakeClock(50.0)
    m, walks = _walk_counted(clock)
    n = 0

    def put_read(key: str) -> None:
        put(m, key, 4 * KiB)
        m.get_replica_list(key)  # leased for 5 s
    while m.stats().tiers["dram"].bytes_used < 0.95 * m.stats().tiers["dram"].capacity:
        put_read(f"k{n}")
        n += 1
    assert m.stats().evictions == 0  # over the watermark, yet nothing could go
    before = walks()
    for i in range(10):
        put_read(f"more{i}")  # room is left: the puts succeed, none walks
    assert walks() == before
    clock.advance(DRY_RETRY * 1.01)
    put_read("later")
    assert walks() >= before + n  # looked again (everything still leased)
    again = walks()
    assert m.evict() == [] and walks() >= again + n  # a request always looks
    clock.advance(5.0)  # the leases are over
    put(m, "after-leases", 4 * KiB)
    assert m.stats().evictions > 0 and not m.exists("k0")
