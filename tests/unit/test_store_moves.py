"""Offloads and promotions on the master alone (no network, an injected clock): a move changes
nothing until its client confirms it, a destination block stays held while a client may still
write it, failed moves free their block, and a get of an SSD-only object starts a promotion."""

from __future__ import annotations

from mooncake_cli.store import Mount, Replica, ReplicateConfig, StoreMaster
from mooncake_cli.store.moves import MoveOrders, MoveResult
from tests.helpers.clock import FakeClock

KiB, MiB = 1 << 10, 1 << 20


def small_master() -> StoreMaster:
    m = StoreMaster(now=FakeClock(100.0), high_watermark=0.5, eviction_ratio=0.01)
    m.mount_segment(Mount("n0", "c0", "h", 0, 100 * KiB))
    m.mount_segment(Mount("n0", "c0", "h", 1 * MiB, 100 * KiB, tier="ssd"))
    return m


def test_offload_waits_for_the_client_and_survives_a_remove_midway() -> None:
    m = small_master()
    for k in ("a", "b", "c"):
        m.put_start(k, 20 * KiB)
        m.put_end(k, "sum-" + k)
    orders = m.poll_moves("c0")
    assert [mv.kind for mv in orders.moves] == ["offload"] and orders.moves[0].key == "a"
    assert m.poll_moves("c0").moves == ()  # handed out once
    mv = orders.moves[0]
    assert [r.tier for r in m.describe("a").replicas] == ["dram"]  # nothing moves before done
    assert m.moves_done("c1", [MoveResult(mv.id, True)]) == 0  # not its move: ignored
    assert m.moves_done("c0", [MoveResult(mv.id, True)]) == 1
    assert m.moves_done("c0", [MoveResult(mv.id, True)]) == 0  # a repeat changes nothing
    assert [(r.tier, r.checksum) for r in m.describe("a").replicas] == [("ssd", "sum-a")]
    assert m.stats().tiers["dram"].bytes_used == 40 * KiB  # b and c

    m.put_start("d", 20 * KiB)
    m.put_end("d", "sum-d")
    mv = m.poll_moves("c0").moves[0]
    assert mv.key == "b"
    m.remove("b")  # while the client copies: its SSD block stays held until it answers
    ssd_used = m.stats().tiers["ssd"].bytes_used
    assert m.moves_done("c0", [MoveResult(mv.id, True)]) == 0
    assert m.stats().tiers["ssd"].bytes_used < ssd_used
    assert m.poll_moves("c0").forget == (mv.dst.offset,)  # drop it from the manifest


def test_failed_move_frees_its_block_and_gets_promote() -> None:
    m = small_master()
    m.register_existing("cold", [Replica("n0", 1 * MiB, 10 * KiB, "ssd", "h", "sum")])
    m.get_replica_list("cold")
    mv = m.poll_moves("c0").moves[0]
    assert (mv.kind, mv.src.tier, mv.dst.tier) == ("promote", "ssd", "dram")
    assert m.moves_done("c0", [MoveResult(mv.id, False, "disk error")]) == 0
    assert m.stats().tiers["dram"].bytes_used == 0
    m.get_replica_list("cold")
    mv = m.poll_moves("c0").moves[0]
    assert m.moves_done("c0", [MoveResult(mv.id, True)]) == 1
    assert [r.tier for r in m.get_replica_list("cold")] == ["dram", "ssd"]
    assert m.poll_moves("nobody").known is False


def test_a_client_gone_takes_its_moves_with_it() -> None:
    m = small_master()
    for k in ("a", "b", "c"):
        m.put_start(k, 20 * KiB)
        m.put_end(k, "sum-" + k)
    mv = m.poll_moves("c0").moves[0]
    assert m.stats().moves == 1
    assert set(m.unmount_client("c0")) == {"a", "b", "c"}
    assert m.stats().moves == 0 and m.stats().objects == 0
    assert m.moves_done("c0", [MoveResult(mv.id, True)]) == 0
    m.mount_segment(Mount("n0", "c0", "h", 0, 100 * KiB))  # back, with a fresh segment
    assert m.poll_moves("c0") == MoveOrders(True, (), ())


def test_an_unanswered_move_is_handed_out_again_and_forgets_wait_for_their_ack() -> None:
    m = small_master()
    clock = m.now
    assert isinstance(clock, FakeClock)
    for k in ("a", "b", "c"):
        m.put_start(k, 20 * KiB)
        m.put_end(k, "sum-" + k)
    mv = m.poll_moves("c0").moves[0]
    assert m.poll_moves("c0").moves == ()
    clock.t += m.put_timeout  # the answer (or the orders) got lost: hand it out again
    assert m.poll_moves("c0").moves == (mv,)
    assert m.moves_done("c0", [MoveResult(mv.id, True)]) == 1
    m.remove("a")  # on SSD now: the client must drop the block from its manifest
    first = m.poll_moves("c0")
    assert first.forget == (mv.dst.offset,) and first.ack > 0
    again = m.poll_moves("c0")  # not acknowledged (the answer may have been lost)
    assert again.forget == first.forget and again.ack == first.ack
    assert m.poll_moves("c0", first.ack) == MoveOrders(True, (), ())
    assert m.poll_moves("c0", first.ack) == MoveOrders(True, (), ())  # a repeat is harmless


def test_move_ids_differ_between_master_terms() -> None:
    ids = []
    for _ in range(2):
        m = small_master()
        for k in ("a", "b", "c"):
            m.put_start(k, 20 * KiB)
            m.put_end(k, "sum-" + k)
        ids.append(m.poll_moves("c0").moves[0].id)
    assert ids[0] != ids[1] and min(ids) > 1  # a late answer to the old term matches nothing


def test_a_promotion_makes_room_on_its_own_client_only() -> None:
    m = StoreMaster(now=FakeClock(100.0), high_watermark=1.0, eviction_ratio=0.01)
    m.mount_segment(Mount("n0", "c0", "h", 0, 40 * KiB))
    m.mount_segment(Mount("n0", "c0", "h", 1 * MiB, 100 * KiB, tier="ssd"))
    m.mount_segment(Mount("n1", "c1", "h", 0, 40 * KiB))
    m.put_start("other", 20 * KiB, ReplicateConfig(preferred_segment="n1"))  # oldest
    m.put_end("other", "sum-o")
    m.register_existing("cold", [Replica("n0", 1 * MiB, 20 * KiB, "ssd", "h", "sum")])
    for k in ("x", "y"):  # n0's DRAM full
        m.put_start(k, 20 * KiB, ReplicateConfig(preferred_segment="n0"))
        m.put_end(k, "sum-" + k)
    assert {r.segment for k in ("x", "y") for r in m.describe(k).replicas} == {"n0"}
    m.now.t += 10  # type: ignore[attr-defined]
    m.get_replica_list("cold")  # promotes: n0's DRAM is to make room, not n1's
    assert m.exists("other") and m.describe("other").replicas[0].tier == "dram"
    assert [mv.key for mv in m.poll_moves("c0").moves] == ["x"]  # offloaded to make room
