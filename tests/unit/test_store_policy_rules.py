"""The rules every eviction policy keeps, through a real master: hard pins and leases are never
evicted, soft pins go last, unfinished puts stay, eviction to the SSD tier works the same, and
the policy tracks exactly the master's objects as they come and go."""

from __future__ import annotations

from typing import Any

import pytest

from mooncake_cli.store import Mount, ReplicateConfig, StoreMaster
from mooncake_cli.store.errors import NoAvailableHandle
from mooncake_cli.store.eviction import BUILTIN
from mooncake_cli.store.moves import MoveResult
from tests.helpers.clock import FakeClock

KiB = 1 << 10
POLICIES = sorted(BUILTIN)


def master(policy: str, clock: FakeClock, ssd: bool = False) -> StoreMaster:
    m = StoreMaster(now=clock, lease_ttl=5.0, eviction=policy, high_watermark=1.0,
                    eviction_ratio=0.01)
    m.mount_segment(Mount("n0", "c0", "h", 0, 64 * KiB))
    if ssd:
        m.mount_segment(Mount("n0", "c0", "h", 1 << 20, 256 * KiB, tier="ssd"))
    return m


def put(m: StoreMaster, key: str, **cfg: Any) -> None:
    m.put_start(key, 4 * KiB, ReplicateConfig(**cfg))
    m.put_end(key, "sum-" + key)


def tracked(m: StoreMaster) -> set[str]:
    return set(m.policy.victims())


@pytest.mark.parametrize("policy", POLICIES)
def test_pins_leases_and_unfinished_puts_under_every_policy(policy: str) -> None:
    clock = FakeClock(10.0)
    m = master(policy, clock)
    put(m, "hard", hard_pin=True)
    put(m, "soft", soft_pin=True)
    m.put_start("pending", 4 * KiB)  # never ended: not evictable
    for i in range(10):
        put(m, f"k{i}")
        m.get_replica_list(f"k{i}")  # reads, for the policies that count them
    clock.t += 6  # every lease so far is over
    assert m.exists("k3")  # leased for 5 s
    # 13 of 16 slots taken: 6 more puts must evict unpinned, unleased objects
    for i in range(6):
        put(m, f"new{i}")
    held = set(m.list())
    assert {"hard", "soft", "k3"} <= held
    assert m.describe("pending").put_deadline is not None
    assert m.stats().evictions == 3 and m.stats().evicted_by == {"room": 3}
    # everything unpinned and unleased goes before the soft pin, the hard pin never
    clock.t += 6
    evicted = m.evict(1 << 30)
    assert "hard" not in evicted and evicted[-1] == "soft"
    assert set(m.list()) == {"hard"}
    assert tracked(m) == {"hard", "pending"}


@pytest.mark.parametrize("policy", POLICIES)
def test_eviction_to_ssd_works_the_same_under_every_policy(policy: str) -> None:
    clock = FakeClock(10.0)
    m = master(policy, clock, ssd=True)
    for i in range(16):  # DRAM full
        put(m, f"k{i}")
    with pytest.raises(NoAvailableHandle):  # room wanted: the first victim is offloaded,
        put(m, "one-more")  # not dropped, and its DRAM is free only once copied
    orders = m.poll_moves("c0")
    assert len(orders.moves) >= 1 and all(mv.kind == "offload" for mv in orders.moves)
    assert m.moves_done("c0", [MoveResult(mv.id, True) for mv in orders.moves]) == \
        len(orders.moves)
    moved = {mv.key for mv in orders.moves}
    for key in moved:
        assert [r.tier for r in m.describe(key).replicas] == ["ssd"]
    put(m, "one-more")
    assert m.stats().offloads == len(moved)
    assert m.stats().copied_bytes == {"offload": 4 * KiB * len(moved)}
    key = sorted(moved)[0]
    kinds = []
    for _ in range(3):  # an SSD-only hit is promoted back once its node has DRAM room again
        clock.t += 6
        m.get_replica_list(key)
        done = m.poll_moves("c0").moves
        kinds += [(mv.kind, mv.key) for mv in done]
        m.moves_done("c0", [MoveResult(mv.id, True) for mv in done])
        if ("promote", key) in kinds:
            break
    assert ("promote", key) in kinds
    assert [r.tier for r in m.describe(key).replicas] == ["dram", "ssd"]
    assert tracked(m) == set(m.list())


@pytest.mark.parametrize("policy", POLICIES)
def test_the_policy_tracks_exactly_the_objects(policy: str) -> None:
    clock = FakeClock(10.0)
    m = master(policy, clock)
    for i in range(40):  # more than fits: evictions along the way
        clock.t += 1
        put(m, f"k{i}")
        if i % 3 == 0:
            m.batch_exists([f"k{j}" for j in range(max(0, i - 5), i + 1)])
    m.remove("k39", force=True)
    m.put_start("gone", KiB)
    m.put_revoke("gone")
    m.unmount_segment("n0")  # every object lost with its segment
    assert tracked(m) == set() and m.list() == []
    m.mount_segment(Mount("n0", "c0", "h", 0, 64 * KiB))
    put(m, "again")
    assert tracked(m) == {"again"}
