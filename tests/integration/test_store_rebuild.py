"""Rebuilding a master's index from the owners of the bytes: the master tells each client what
completed in (or left) its DRAM segment, whoever put it, and after a master restart or an HA
failover every owner re-registers all of it. Keys put by a client contributing no memory, and
keys with replicas on two nodes, are served again, byte for byte and with every replica."""

from __future__ import annotations

import gc
import random
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import xxhash

from mooncake_cli.store import Mount, ReplicateConfig, StoreError, StoreMaster
from mooncake_cli.store.client import StoreClient
from mooncake_cli.store.client.holdings import Holdings
from mooncake_cli.store.errors import ObjectNotFound
from mooncake_cli.store.ha.leader import LeaderInfo, LeaderResolver
from mooncake_cli.store.records import Replica, ReplicaStatus
from mooncake_cli.store.reports import MAX_REPORT, Held, HoldingsReport
from tests.conftest import REPO, free_port, wait_for
from tests.helpers.procs import child_env
from tests.helpers.store_procs import Proc, start_ha_master, start_master, start_node

pytestmark = pytest.mark.timeout(120)
MiB = 1 << 20


def seg(name: str, client: str) -> Mount:
    return Mount(name, client, f"host-{name}", 0, 4 * MiB)


def content(key: str) -> bytes:
    return f"the bytes of {key}".encode()


def put(m: StoreMaster, key: str, size: int = 1000, **cfg: object) -> tuple[Replica, ...]:
    reps = m.put_start(key, size, ReplicateConfig(**cfg))  # type: ignore[arg-type]
    m.put_end(key, xxhash.xxh3_64_hexdigest(content(key)))
    return reps


def poll(m: StoreMaster, client: str, held: Holdings) -> HoldingsReport:
    report = m.poll_holdings(client, held.epoch, held.ack)
    held.apply(report)
    return report


def test_the_owner_learns_what_others_put_in_its_segment_and_what_left() -> None:
    m = StoreMaster()
    m.mount_segment(seg("A", "a"))
    m.mount_segment(seg("B", "b"))
    a, b = Holdings(), Holdings()
    first = poll(m, "a", a)
    assert first.reset and first.added == () and first.upto == 1
    poll(m, "b", b)
    put(m, "k1", preferred_segment="A", hard_pin=True)  # as a client without memory would
    put(m, "k2", replica_num=2)
    put(m, "k3", preferred_segment="B")
    put(m, "gone", preferred_segment="A")
    m.remove("gone")  # put and removed between two polls: nothing to tell but its removal

    lost = m.poll_holdings("a", a.epoch, a.ack)  # this reply is lost: the next poll repeats it
    again = m.poll_holdings("a", a.epoch, a.ack)
    assert again == lost and not again.reset
    assert {h.key for h in again.added} == {"k1", "k2"}
    assert {g.key for g in again.removed} == {"gone"}
    assert all(h.replica.segment == "A" and h.replica.checksum ==
               xxhash.xxh3_64_hexdigest(content(h.key)) for h in again.added)
    assert next(h for h in again.added if h.key == "k1").config.hard_pin
    a.apply(again)
    assert m.poll_holdings("a", a.epoch, a.ack).added == ()  # acknowledged: not sent again
    poll(m, "b", b)
    assert (a.keys(), b.keys()) == (["k1", "k2"], ["k2", "k3"])

    at = next(r.offset for r in m.get_replica_list("k2") if r.segment == "A")
    m.remove("k2", force=True)
    report = poll(m, "a", a)
    assert [(g.key, g.offset) for g in report.removed] == [("k2", at)]
    assert a.keys() == ["k1"]
    m.put_start("pending", 10)  # not complete: not the owner's business yet
    assert poll(m, "a", a).added == ()

    m.unmount_segment("A")  # a client that leaves loses its journal; a new one starts afresh
    m.mount_segment(seg("A", "a"))
    assert poll(m, "a", a).reset and a.keys() == []
    assert m.poll_holdings("nobody", "", 0) == HoldingsReport(known=False)


def test_a_remover_naming_its_segment_is_not_told_of_its_removal_unless_pending() -> None:
    m = StoreMaster()
    m.mount_segment(seg("A", "a"))
    a = Holdings()
    poll(m, "a", a)
    for k in ("mine", "third", "all1", "all2", "other"):
        put(m, k, preferred_segment="A")
    poll(m, "a", a)
    poll(m, "a", a)  # acknowledges them: the journal mentions none of them any more
    assert a.keys() == ["all1", "all2", "mine", "other", "third"]
    m.remove("mine", own="A")  # the remover forgets it itself: no Gone for it
    m.remove("other", own="B")  # named another segment: A is told
    assert [g.key for g in m.poll_holdings("a", a.epoch, a.ack).removed] == ["other"]
    put(m, "fresh", preferred_segment="A")  # A has not acknowledged this Held yet ...
    m.remove("fresh", force=True, own="A")  # ... so its removal is told after it, in order
    got = m.poll_holdings("a", a.epoch, a.ack)
    assert [g.key for g in got.removed] == ["other", "fresh"]
    a.apply(got)
    with pytest.raises(StoreError, match="only with force"):
        m.remove_all(own="A")
    assert m.remove_all(force=True, own="A") == 3  # third, all1, all2: none told to A
    assert m.poll_holdings("a", a.epoch, a.ack).removed == ()
    assert a.keys() == ["all1", "all2", "mine", "third"]  # what the remover forgets


def test_a_fresh_master_merges_what_every_owner_registers() -> None:
    old = StoreMaster()
    owners = {"a": Holdings(), "b": Holdings()}
    for name, client in (("A", "a"), ("B", "b")):
        old.mount_segment(seg(name, client))
    for client, held in owners.items():
        poll(old, client, held)
    put(old, "two", 5000, replica_num=2, soft_pin=True)
    put(old, "one", 7000, preferred_segment="B")
    for client, held in owners.items():
        poll(old, client, held)

    new = StoreMaster()  # the restarted master: every owner mounts and re-announces
    for name, client in (("A", "a"), ("B", "b")):
        new.mount_segment(seg(name, client))
    segment = [content(k) for k in ("one", "two")]  # the bytes in the segments
    for held in owners.values():
        items = held.verified(lambda r: memoryview(
            next(v for v in segment if xxhash.xxh3_64_hexdigest(v) == r.checksum)))
        assert len(items) == len(held) and items
        assert new.register_held(items) == [None] * len(items)
        assert new.register_held(items) == [None] * len(items)  # a repeat changes nothing
    assert new.list() == ["one", "two"]
    assert {(r.segment, r.offset) for r in new.get_replica_list("two")} == \
        {(r.segment, r.offset) for r in old.get_replica_list("two")}
    assert new.describe("two").config.soft_pin
    assert new.segment_usage() == old.segment_usage()
    assert owners["a"].verified(lambda r: memoryview(b"overwritten")) == []  # never offered
    assert len(owners["a"]) == 0  # and forgotten
    one = new.get_replica_list("one")[0]
    assert one.segment == "B"
    other = Held("one", Replica("A", 2 * MiB, one.size, checksum="0" * 16))
    assert isinstance(new.register_held([other])[0], StoreError)  # another checksum: refused
    assert len(new.get_replica_list("one")) == 1


def test_one_client_re_registers_a_dram_and_an_ssd_copy_of_one_key() -> None:
    m = StoreMaster()
    m.mount_segment(Mount("A", "a", "h", 0, MiB))
    m.mount_segment(Mount("A", "a", "h", 4 * MiB, MiB, "ssd"))  # same transfer segment
    dram, ssd = Replica("A", 4096, 100, checksum="s"), Replica("A", 4 * MiB, 100, "ssd",
                                                               checksum="s")
    m.register_existing("k", [dram])
    m.register_existing("k", [ssd])  # a promoted object: both copies kept
    assert {r.tier for r in m.describe("k").replicas} == {"dram", "ssd"}
    with pytest.raises(StoreError):  # but never two DRAM copies on one segment
        m.register_existing("k", [Replica("A", 8192, 100, checksum="s")])


def test_a_large_snapshot_comes_in_pages() -> None:
    m = StoreMaster()
    m.mount_segment(Mount("A", "a", "h", 0, 64 * MiB))
    for i in range(MAX_REPORT + 10):
        put(m, f"k{i}", 64, preferred_segment="A")
    held = Holdings()
    first = poll(m, "a", held)
    assert first.reset and len(first.added) == MAX_REPORT
    second = poll(m, "a", held)
    assert not second.reset and len(second.added) == 10
    assert len(held) == MAX_REPORT + 10


# -- real processes -------------------------------------------------------------------------
@pytest.fixture
def procs() -> Iterator[list[Proc]]:
    started: list[Proc] = []
    yield started
    for proc in started:
        proc.stop()


def cli(*args: str) -> None:
    run = subprocess.run([sys.executable, "-m", "mooncake_cli", "store", *args],
                         capture_output=True, cwd=REPO, env=child_env(), timeout=60)
    assert run.returncode == 0, run.stderr.decode()


class Scene:
    """Two store nodes; `one` (1 replica) and `two` (2 replicas) put and `dead` put then
    removed by `mooncake store` commands, whose clients contribute no memory."""

    def __init__(self, master: str, nodes: list[Proc], tmp: Path) -> None:
        self.master, self.nodes = master, nodes
        rng = random.Random(11)
        self.values = {"one": rng.randbytes(300_001), "two": rng.randbytes(1_000_003),
                       "dead": rng.randbytes(5000)}
        for key, value in self.values.items():
            (tmp / key).write_bytes(value)
            cli("put", key, str(tmp / key), "--master", master, "--replicas",
                "2" if key == "two" else "1")
        cli("rm", key, "--master", master)  # "dead"
        del self.values["dead"]

        def owners_know() -> bool:  # each owner learns within a heartbeat
            held = [set(n.ask(cmd="held")["keys"]) for n in nodes]
            return all("two" in h and "dead" not in h for h in held) and \
                sum("one" in h for h in held) == 1

        wait_for(owners_know, 10, what="the owners to learn what their segments hold")

    def served(self, reader: StoreClient) -> bool:
        try:
            if any(reader.get(k) != v for k, v in self.values.items()):
                return False
            twos = {r.segment for r in reader.describe("two").replicas}
        except StoreError:
            return False
        if twos != {n.ready["segment"] for n in self.nodes}:
            return False
        with pytest.raises(ObjectNotFound):
            reader.get("dead")
        return sorted(reader.list()) == ["one", "two"]


def test_a_restarted_master_serves_what_others_put_in_the_nodes(
        procs: list[Proc], make_engine: object, tmp_path: Path) -> None:
    port = free_port()
    address = f"127.0.0.1:{port}"
    master = start_master(port, "--client-ttl", "4")
    procs.append(master)
    nodes = [start_node(address) for _ in range(2)]
    procs.extend(nodes)
    scene = Scene(address, nodes, tmp_path)
    master.kill()
    procs.append(start_master(port, "--client-ttl", "4"))  # empty: the nodes re-mount
    with StoreClient(address, make_engine(), 0, timeout=3) as reader:  # type: ignore[operator]
        wait_for(lambda: scene.served(reader), 15,
                 what="the keys to be served by the restarted master")


def test_what_a_client_removes_itself_it_forgets_at_once_and_no_restart_brings_back(
        procs: list[Proc], make_engine: object) -> None:
    port = free_port()
    address = f"127.0.0.1:{port}"
    master = start_master(port, "--client-ttl", "4")
    procs.append(master)
    with StoreClient(address, make_engine(), 4 * MiB, timeout=3) as a, \
            StoreClient(address, make_engine(), 0, timeout=3) as other:  # type: ignore[operator]
        a.batch_put(["x1", "x2"], [b"1" * 100, b"2" * 100])
        assert a.remove_all(force=True) == 2
        a.batch_put(["kept", "gone", "theirs"], [b"k" * 100, b"g" * 100, b"t" * 100])
        a.remove("gone")
        assert a.owner.holdings.keys() == ["kept", "theirs"]  # no report needed for our own
        other.remove("theirs")  # removed by someone else: a report tells us
        wait_for(lambda: a.owner.holdings.keys() == ["kept"], 5, what="the removal to be reported")
        master.kill()
        procs.append(start_master(port, "--client-ttl", "4"))  # empty: `a` re-registers
        wait_for(lambda: a.exists("kept"), 15, what="the kept key to be registered again")
        assert a.get("kept") == b"k" * 100
        assert not any(a.exists(k) for k in ("x1", "x2", "gone", "theirs"))


def test_an_ha_failover_serves_what_others_put_with_every_replica(
        etcd: str, procs: list[Proc], make_engine: object, tmp_path: Path) -> None:
    url = f"{etcd}/r{uuid.uuid4().hex[:8]}"
    masters = [start_ha_master(url, "--client-ttl", "4") for _ in range(2)]
    procs.extend(masters)
    resolver = LeaderResolver(url)
    first = wait_for(resolver.lookup, 15, what="a leader")
    assert isinstance(first, LeaderInfo)
    nodes = [start_node(url) for _ in range(2)]
    procs.extend(nodes)
    scene = Scene(url, nodes, tmp_path)
    next(m for m in masters if m.ready["address"] == first.address).kill()
    second = wait_for(lambda: (i := resolver.lookup()) and i.address != first.address and i,
                      10, what="the standby to lead")
    assert isinstance(second, LeaderInfo) and second.term > first.term
    with StoreClient(url, make_engine(), 0, timeout=3) as reader:  # type: ignore[operator]
        wait_for(lambda: scene.served(reader), 15,
                 what="the keys to be served by the new leader, both replicas of 'two'")
        assert reader.leader() == second


def test_holdings_keep_no_objects_the_garbage_collector_walks_and_give_back_whole_records(
) -> None:
    """A client holding many keys adds nothing to its process's full collections: each held
    replica is a tuple of plain values, which CPython stops tracking; what `verified` hands
    back for a re-mount is the whole record (checksum, config) as it was taken in."""
    m = StoreMaster()
    m.mount_segment(seg("A", "a"))
    held = Holdings()
    poll(m, "a", held)
    put(m, "pinned", preferred_segment="A", hard_pin=True)
    put(m, "plain", preferred_segment="A")
    poll(m, "a", held)
    own = Replica("A", 4096 * 7, 1000, host="127.0.0.1", checksum="ignored")
    held.add("mine", own, xxhash.xxh3_64_hexdigest(content("mine")),
             ReplicateConfig(replica_num=2, soft_pin=True))
    gc.collect()
    assert not any(gc.is_tracked(e) for e in held._held.values())
    views = {(r.segment, r.offset): content(k) for k, r in
             [("pinned", m.get_replica_list("pinned")[0]),
              ("plain", m.get_replica_list("plain")[0]), ("mine", own)]}
    got = {h.key: h for h in held.verified(lambda r: memoryview(views[(r.segment, r.offset)]))}
    assert sorted(got) == ["mine", "pinned", "plain"]
    assert got["pinned"].config == ReplicateConfig(preferred_segment="A", hard_pin=True)
    assert got["plain"].config == ReplicateConfig(preferred_segment="A")
    assert got["mine"].config == ReplicateConfig(replica_num=2, soft_pin=True)
    assert got["mine"].replica == Replica("A", 4096 * 7, 1000, host="127.0.0.1",
                                          checksum=xxhash.xxh3_64_hexdigest(content("mine")),
                                          status=ReplicaStatus.COMPLETE)
    assert all(h.replica.status is ReplicaStatus.COMPLETE for h in got.values())
