"""The store's SSD tier against a real master process: offload on eviction, promotion on a get,
rescan of the directory by a restarted node (`mooncake store serve --ssd-dir`) or master,
corruption caught by checksums, a client on huge pages.
The move protocol on the master alone: test_store_moves.py; the tier plugins themselves
(data file, manifest, huge pages): test_tier_ssd.py."""

from __future__ import annotations

import os
import random
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from mooncake_backends.ssd import DATA
from mooncake_backends.ssd.manifest import LOG, Manifest

from mooncake_cli.store import StoreError
from mooncake_cli.store.client import StoreClient
from mooncake_cli.store.errors import ChecksumMismatch, NoAvailableHandle, ObjectNotFound
from mooncake_cli.store.moves import Move, MoveOrders
from mooncake_cli.store.records import Replica
from tests.conftest import free_port, wait_for
from tests.helpers.store_procs import Proc, start_master
from tests.unit.test_tier_ssd import free_hugepages

pytestmark = pytest.mark.timeout(60)
KiB, MiB = 1 << 10, 1 << 20
SIZE = 100_000  # ten of these fill a 1 MiB DRAM segment


def values(n: int, seed: int = 7) -> dict[str, bytes]:
    rnd = random.Random(seed)
    return {f"obj{i:02d}": rnd.randbytes(SIZE) for i in range(n)}


def put_all(client: StoreClient, vals: dict[str, bytes]) -> None:
    """Put each value; a put that finds DRAM full while offloads are being copied is retried."""
    for key, v in vals.items():
        deadline = time.monotonic() + 10
        while True:
            try:
                client.put(key, v)
                break
            except NoAvailableHandle:
                assert time.monotonic() < deadline, f"no room for {key} for 10 s"
                time.sleep(0.02)  # sleep: poll


def tiers(client: StoreClient, key: str) -> list[str]:
    return [r.tier for r in client.describe(key).replicas]  # describe grants no lease


@pytest.fixture
def master() -> Iterator[Proc]:
    m = start_master(free_port(), "--client-ttl", "3")
    yield m
    assert m.stop() == 0


@pytest.fixture
def client(master: Proc, make_engine: Callable[..., Any]) -> Iterator[Callable[..., StoreClient]]:
    made: list[StoreClient] = []

    def make(segment_size: int = MiB, **kw: Any) -> StoreClient:
        made.append(StoreClient(master.ready["address"], make_engine(timeout=3), segment_size,
                                timeout=3, **kw))
        return made[-1]

    yield make
    for c in made:
        c.close()


def offloaded(reader: StoreClient, vals: dict[str, bytes]) -> list[str]:
    """Put `vals` (more than the DRAM holds) and wait until DRAM is back under the watermark;
    the keys then held on SSD only."""
    put_all(reader, vals)
    cap = reader.stats().tiers["dram"].capacity
    wait_for(lambda: reader.stats().tiers["dram"].bytes_used <= 0.9 * cap, 10)
    return [k for k in vals if tiers(reader, k) == ["ssd"]]


def test_evicted_objects_land_on_ssd_and_read_back_exact(
        client: Callable[..., StoreClient], tmp_path: Path) -> None:
    node = client(ssd_dir=str(tmp_path / "ssd"), ssd_size=4 * MiB)
    reader = client(0)  # contributes nothing: every read crosses the transfer engine
    vals = values(20)
    on_ssd = offloaded(reader, vals)
    stats = reader.stats()
    assert len(on_ssd) >= 10 and stats.tiers["ssd"].objects == len(on_ssd)
    assert stats.evictions == 0 and stats.offloads == len(on_ssd)  # nothing was dropped
    assert stats.moves == 0
    assert stats.tiers["ssd"].bytes_used >= len(on_ssd) * SIZE
    assert stats.tiers["ssd"].capacity == 4 * MiB
    for key, v in vals.items():
        assert reader.get(key) == v, key
    assert node.get(on_ssd[0]) == vals[on_ssd[0]]  # the owner reads its own SSD replica too


def test_a_get_promotes_an_ssd_object_back_to_dram(
        client: Callable[..., StoreClient], tmp_path: Path) -> None:
    node = client(ssd_dir=str(tmp_path / "ssd"), ssd_size=4 * MiB)
    reader = client(0)
    vals = values(14)
    key = offloaded(reader, vals)[0]
    assert reader.get(key) == vals[key]  # served from SSD; starts the promotion
    wait_for(lambda: tiers(reader, key)[0] == "dram", 10)
    assert tiers(reader, key) == ["dram", "ssd"]  # the SSD copy stays: re-eviction is free
    assert reader.stats().promotions == 1
    assert reader.get(key) == vals[key]
    assert node.get(key) == vals[key]


def test_a_full_ssd_evicts_its_least_recently_used_objects(
        client: Callable[..., StoreClient], tmp_path: Path) -> None:
    node = client(ssd_dir=str(tmp_path / "ssd"), ssd_size=256 * KiB)  # room for two
    vals = values(16)
    for key, v in vals.items():  # one at a time: every offload finishes before the next put
        node.put(key, v)
        wait_for(lambda: node.stats().moves == 0, 10)
    stats = node.stats()
    assert stats.offloads == 16 - 9  # DRAM holds nine under the watermark
    assert stats.tiers["ssd"].objects == 2
    assert stats.evictions == stats.offloads - 2  # each later offload displaced an older one
    assert stats.objects == 16 - stats.evictions
    assert not node.exists("obj00")
    held = node.list()
    in_dram = [k for k in held if tiers(node, k) == ["dram"]]
    for key in in_dram + [k for k in held if k not in in_dram]:  # the DRAM ones get leased
        assert node.get(key) == vals[key]  # first, so promotions find nothing to displace


def serve(master: str, ssd: Path) -> Proc:
    return Proc([sys.executable, "-m", "mooncake_cli", "--json", "store", "serve", "--master",
                 master, "--segment-size", "1MiB", "--ssd-dir", str(ssd), "--ssd-size", "4MiB",
                 "--timeout", "3"])


def test_a_restarted_node_serves_its_ssd_objects_again(
        master: Proc, client: Callable[..., StoreClient], tmp_path: Path) -> None:
    address = master.ready["address"]
    node = serve(address, tmp_path / "ssd")
    try:
        assert node.ready["ssd"]["registered"] == 0
        reader = client(0)
        vals = values(16)
        on_ssd = offloaded(reader, vals)
        assert len(on_ssd) >= 6
        assert node.stop() == 0  # unmounts: the master forgets every object
        assert reader.list() == []
        node = serve(address, tmp_path / "ssd")
        assert node.ready["ssd"]["registered"] == len(on_ssd)
        assert node.ready["ssd"]["skipped"] == []
        assert sorted(reader.list()) == sorted(on_ssd)
        ssd_tier = reader.stats().tiers["ssd"]
        assert ssd_tier.objects == len(on_ssd) and ssd_tier.capacity == 4 * MiB
        assert ssd_tier.bytes_used >= len(on_ssd) * SIZE
        for key in on_ssd:
            assert tiers(reader, key) == ["ssd"]
            assert reader.get(key) == vals[key]
    finally:
        node.stop()


def test_a_restarted_master_relearns_what_the_ssd_holds(
        make_engine: Callable[..., Any], tmp_path: Path) -> None:
    port = free_port()
    m = start_master(port)
    c = StoreClient(m.ready["address"], make_engine(timeout=3), MiB, heartbeat=0.2, timeout=1,
                    ssd_dir=str(tmp_path / "ssd"), ssd_size=4 * MiB)
    try:
        vals = values(14)
        on_ssd = offloaded(c, vals)
        assert m.stop() == 0
        m = start_master(port)  # knows nothing: the client re-mounts both tiers on a heartbeat

        def relearnt() -> bool:
            try:
                return sorted(c.list()) == sorted(vals)
            except StoreError:
                return False

        wait_for(relearnt, 10, 0.1, "the client to re-register its objects")
        for key in on_ssd:
            assert tiers(c, key) == ["ssd"] and c.get(key) == vals[key]
    finally:
        c.close()
        m.stop()


def test_corruption_on_ssd_is_caught_and_never_returned(
        client: Callable[..., StoreClient], tmp_path: Path) -> None:
    ssd = tmp_path / "ssd"
    node = client(ssd_dir=str(ssd), ssd_size=4 * MiB)
    vals = values(16)
    on_ssd = offloaded(node, vals)
    bad_data, bad_entry, live, *good = on_ssd
    node.close()
    entries = {e.key: e for e in Manifest(str(ssd)).entries()}
    with open(ssd / DATA, "r+b") as f:  # flip one byte of one object
        f.seek(entries[bad_data].offset + 1234)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x01]))
    log = (ssd / LOG).read_bytes().splitlines(keepends=True)
    hit = [i for i, line in enumerate(log) if f'"key":"{bad_entry}"'.encode() in line]
    log[hit[0]] = log[hit[0]].replace(b'"size":100000', b'"size":100001')  # CRC now wrong
    (ssd / LOG).write_bytes(b"".join(log))

    node = client(ssd_dir=str(ssd))  # size 0: the data file's own
    scan = node.owner.ssd.rescan if node.owner.ssd else None
    assert scan is not None
    assert sorted(scan.registered) == sorted([live, *good])
    assert any(bad_data in s and "checksum" in s for s in scan.skipped)
    assert any("CRC mismatch" in s for s in scan.skipped)
    for key in (bad_data, bad_entry):
        with pytest.raises(ObjectNotFound):
            node.get(key)
    assert node.get(good[0]) == vals[good[0]]
    # a byte flipped under a live object: the checksum refuses it at read time
    replica = node.describe(live).replicas[0]
    assert replica.tier == "ssd" and node.owner.ssd is not None
    node.owner.ssd.buf.view[replica.offset - node.owner.ssd.segment.base] ^= 0xFF
    with pytest.raises(ChecksumMismatch):
        node.get(live)


def test_a_client_on_hugepages_stores_and_reads(client: Callable[..., StoreClient]) -> None:
    c = client(4 * MiB, hugepages=True)
    assert c.owner.hugepages == (free_hugepages() >= 2)  # else: the warning, normal pages
    c.put("k", b"v" * 5000)
    assert c.get("k") == b"v" * 5000


def test_an_ssd_only_client_mounts_again_after_a_master_restart(
        make_engine: Callable[..., Any], tmp_path: Path) -> None:
    port = free_port()
    m = start_master(port)
    ssd = str(tmp_path / "ssd")
    try:
        with StoreClient(m.ready["address"], make_engine(timeout=3), MiB, timeout=3,
                         ssd_dir=ssd, ssd_size=4 * MiB) as first:
            vals = values(14)
            on_ssd = offloaded(first, vals)
        assert on_ssd
        c = StoreClient(m.ready["address"], make_engine(timeout=3), 0, heartbeat=0.2,
                        timeout=1, ssd_dir=ssd)  # no DRAM segment: the SSD one alone
        try:
            assert sorted(c.list()) == sorted(on_ssd)
            assert m.stop() == 0
            m = start_master(port)

            def relearnt() -> bool:
                try:
                    return sorted(c.list()) == sorted(on_ssd)
                except StoreError:
                    return False

            wait_for(relearnt, 10, 0.1, "the SSD-only client to mount again")
            assert c.get(on_ssd[0]) == vals[on_ssd[0]]
        finally:
            c.close()
    finally:
        m.stop()


def test_a_move_that_raises_is_answered_as_failed(client: Callable[..., StoreClient],
                                                  tmp_path: Path) -> None:
    node = client(ssd_dir=str(tmp_path / "ssd"), ssd_size=MiB)
    assert node.owner.ssd is not None and node.owner.region is not None
    name, host = node.engine.name, node.owner.host
    bad = Move(2**40, "offload", "odd", Replica(name, node.owner.region.base, 10, "dram", host),
               Replica(name, node.owner.ssd.segment.base, 20, "ssd", host))  # sizes disagree
    with node.owner.ssd._lock:
        node.owner.ssd._apply(MoveOrders(True, (bad,)))
        unsent = list(node.owner.ssd._unsent)
    assert [(r.id, r.ok) for r in unsent] == [(bad.id, False)]
    assert "ValueError" in unsent[0].message
    node.put("after", b"still serving")
    assert node.get("after") == b"still serving"
