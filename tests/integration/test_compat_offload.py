"""Client-side SSD offload through the compat API (`setup(..., enable_ssd_offload=True,
ssd_offload_path=DIR)`) under upstream's master flags on `mooncake store master`: offload on
eviction, promotion on the N-th hit (--promotion_admission_threshold), --offload_on_evict=false.
Ours only: upstream's SSD offload needs its own storage backend set up."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from mooncake_cli.compat.store import MooncakeDistributedStore
from mooncake_cli.store.records import StoreStats
from tests.conftest import free_port, wait_for
from tests.helpers.store_procs import Proc

pytestmark = pytest.mark.timeout(90)
MiB, SIZE = 1 << 20, 100_000  # ten values fill the 1 MiB DRAM segment


def master(*flags: str) -> Proc:
    return Proc([sys.executable, "-m", "mooncake_cli", "--json", "store", "master", "--port",
                 str(free_port()), "--client-ttl", "3", *flags])


@pytest.fixture
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[MooncakeDistributedStore]:
    m = master(*request.param)
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", MiB, 4 * MiB, "tcp", "",
                   str(m.ready["address"]), None, True, str(tmp_path)) == 0
    yield s
    s.close()
    m.stop()


def fill(s: MooncakeDistributedStore, n: int) -> dict[str, bytes]:
    vals = {f"obj{i:02d}": bytes([i]) * SIZE for i in range(n)}
    for key, v in vals.items():
        def stored(key: str = key, v: bytes = v) -> bool:
            rc = s.put(key, v)
            if rc != 0:  # DRAM full while offloads are copied: again
                assert rc == -200, rc
            return rc == 0
        wait_for(stored, 10, what=f"room for {key}")
    return vals


def master_stats(s: MooncakeDistributedStore) -> StoreStats:
    """The master's counters, through the store's own connection."""
    assert s._conn.client is not None
    return s._conn.client.stats()


def tiers(s: MooncakeDistributedStore, key: str) -> list[str]:
    return ["ssd" if d.is_local_disk_replica() else "dram" for d in s.get_replica_desc(key)]


@pytest.mark.parametrize("store", [("--promotion_admission_threshold", "2")], indirect=True)
def test_evicted_objects_go_to_ssd_and_come_back_on_the_second_hit(
        store: MooncakeDistributedStore) -> None:
    vals = fill(store, 25)
    wait_for(lambda: tiers(store, "obj00") == ["ssd"], 10)
    # the fill's offloads done: DRAM is below the high watermark, with room for a promotion
    wait_for(lambda: master_stats(store).moves == 0, 10, what="the offloads under way to end")
    assert store.get("obj00") == vals["obj00"]
    assert store.get_offload_rpc_read_count() == 1
    # the master decides at the get (before it answers anyone else) and a move it starts
    # stays under way until the client confirms it: none started, none done
    st = master_stats(store)
    assert (st.moves, st.promotions) == (0, 0)
    assert tiers(store, "obj00") == ["ssd"]  # one hit: not promoted yet
    assert store.get("obj00") == vals["obj00"]
    wait_for(lambda: "dram" in tiers(store, "obj00"), 10)
    assert all(store.get(k) == v for k, v in vals.items())


@pytest.mark.parametrize("store", [("--offload_on_evict=false",)], indirect=True)
def test_without_offload_on_evict_evicted_objects_are_dropped(
        store: MooncakeDistributedStore) -> None:
    vals = fill(store, 25)
    gone = [k for k in vals if store.is_exist(k) == 0]
    assert gone and all(store.get_replica_desc(k) == [] for k in gone)
    assert all(t == "dram" for k in vals for t in tiers(store, k))


def test_upstream_spellings_of_bad_flag_values_are_refused() -> None:
    import subprocess

    p = subprocess.run([sys.executable, "-m", "mooncake_cli", "store", "master", "--port", "0",
                        "--enable_offload=maybe"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "--enable-offload" in p.stderr and "Traceback" not in p.stderr
