"""Acknowledged writes survive the HA leader: real etcd, real `python -m
mooncake_cli.store.service --ha` masters, real store nodes holding the data, and a client with
no segment of its own. The leader is killed with SIGKILL right after a put (or a remove, or a
batch put) returned; the new leader must serve every acknowledged object and none removed."""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from mooncake_cli.config import TransferConfig
from mooncake_cli.registry import Registry
from mooncake_cli.store import StoreError
from mooncake_cli.store.client import StoreClient
from mooncake_cli.store.errors import ObjectHasLease, ObjectNotFound
from mooncake_cli.store.ha.leader import LeaderInfo, LeaderResolver
from mooncake_cli.transfer.engine import TransferEngine
from tests.conftest import wait_for
from tests.helpers.store_procs import Proc, start_ha_master, start_node

pytestmark = pytest.mark.timeout(60)


class Cluster:
    """Two HA masters and two store nodes (32 MiB each) on one etcd cluster name."""

    def __init__(self, etcd: str, *master_args: str) -> None:
        self.url = f"{etcd}/d{uuid.uuid4().hex[:8]}"
        self.procs: list[Proc] = []
        self.masters = [self._start(start_ha_master, self.url, *master_args) for _ in range(2)]
        self.resolver = LeaderResolver(self.url)
        wait_for(self.resolver.lookup, 15, what="a leader")
        self.nodes = [self._start(start_node, self.url, 32 << 20) for _ in range(2)]

    def _start(self, fn: Any, *args: Any) -> Proc:
        proc = fn(*args)
        self.procs.append(proc)
        return proc

    def leader(self) -> LeaderInfo:
        info = self.resolver.lookup()
        assert info is not None
        return info

    def kill_leader(self) -> LeaderInfo:
        """SIGKILL the leader; the leader that follows it (once elected)."""
        old = self.leader()
        next(m for m in self.masters if m.ready["address"] == old.address).kill()
        new = wait_for(lambda: (i := self.resolver.lookup()) is not None
                       and i.address != old.address and i, 10, what="a new leader")
        assert isinstance(new, LeaderInfo) and new.term > old.term
        return new

    def close(self) -> None:
        for p in self.procs:
            p.stop()


@pytest.fixture
def cluster(etcd: str) -> Iterator[Cluster]:
    c = Cluster(etcd)
    yield c
    c.close()


@pytest.fixture
def client(cluster: Cluster) -> Iterator[StoreClient]:
    engine = TransferEngine(TransferConfig(timeout=3), Registry())
    store = StoreClient(cluster.url, engine, 0, timeout=5)  # no segment: the nodes hold it all
    yield store
    store.close()
    engine.close()


def values(n: int, seed: int) -> dict[str, bytes]:
    rng = random.Random(seed)
    return {f"k{seed}-{i}": rng.randbytes(rng.choice((1, 100, 4096, rng.randint(1, 200_000))))
            for i in range(n)}


def readable(client: StoreClient, want: dict[str, bytes]) -> int:
    """How many of `want` read back with their bytes (a wrong value fails the test)."""
    n = 0
    for key, value in want.items():
        try:
            got = client.get(key)
        except StoreError:
            continue
        assert got == value, f"wrong bytes for {key}"
        n += 1
    return n


def all_back(client: StoreClient, want: dict[str, bytes], within: float) -> None:
    wait_for(lambda: readable(client, want) == len(want), within, interval=0.1,
             what=f"all {len(want)} acknowledged objects to be readable")


def test_leader_killed_right_after_puts_returned(cluster: Cluster, client: StoreClient) -> None:
    want = values(200, 1)
    for key, value in want.items():
        client.put(key, value)
    time.sleep(random.uniform(0.1, 0.5))  # sleep: behaviour - the kill comes at a random moment
    cluster.kill_leader()
    all_back(client, want, 10)


def test_leader_killed_during_batch_puts(cluster: Cluster, client: StoreClient) -> None:
    acked: dict[str, bytes] = {}
    stop = threading.Event()

    def writer() -> None:
        for n in range(10_000):
            if stop.is_set():
                return
            batch = values(16, 100 + n)
            try:
                out = client.batch_put(list(batch), list(batch.values()))
            except StoreError:
                continue  # nothing acknowledged
            acked.update((k, v) for (k, v), err in zip(batch.items(), out, strict=True)
                         if err is None)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        wait_for(lambda: len(acked) >= 48, 20, what="three batches put")
        cluster.kill_leader()  # batches keep going: one is in flight at the kill, or close
        before = len(acked)
        wait_for(lambda: len(acked) >= before + 32, 20, what="batches put by the new leader")
    finally:
        stop.set()
        thread.join(30)
    all_back(client, dict(acked), 10)


def test_leader_killed_right_after_a_remove(cluster: Cluster, client: StoreClient) -> None:
    want = values(40, 3)
    for key, value in want.items():
        client.put(key, value)
    # the puts settled (their owners were told of them): the removes are what is tested
    wait_for(lambda: set(want) <= {k for n in cluster.nodes for k in n.ask(cmd="held")["keys"]},
             10, what="the nodes to hold every put")
    removed = list(want)[:20]
    for key in removed:
        client.remove(key, force=True)
    keep = {k: v for k, v in want.items() if k not in removed}
    cluster.kill_leader()
    all_back(client, keep, 10)
    for key in removed:
        with pytest.raises(ObjectNotFound):
            client.get(key)


def test_a_standby_leads_while_a_reader_holds_a_lease(etcd: str) -> None:
    cluster = Cluster(etcd, "--lease-ttl", "3")
    engine = TransferEngine(TransferConfig(timeout=3), Registry())
    reader = StoreClient(cluster.url, engine, 0, timeout=5)
    try:
        want = values(8, 4)
        for key, value in want.items():
            reader.put(key, value)
        key = next(iter(want))
        replicas = reader.describe(key).replicas
        assert reader.get(key) == want[key]  # the reader holds a lease of the first leader
        cluster.kill_leader()
        # listing grants no lease: wait until the owners refilled the new leader
        wait_for(lambda: _listed(reader) == sorted(want), 10, what="the keys to be back")
        # it honours the lease the old leader granted: a key learnt from its owner is leased
        # for --lease-ttl from then, so it is not removed while the reader may still read it
        with pytest.raises(ObjectHasLease):
            reader.remove(key)
        assert reader.describe(key).replicas == replicas  # same bytes, same place
        assert reader.io.read_bytes(key, replicas) == want[key]  # the lease's replicas read
        wait_for(lambda: _removed(reader, key), 10, what="the lease to run out")
        with pytest.raises(ObjectNotFound):
            reader.get(key)
        assert readable(reader, want) == len(want) - 1
    finally:
        reader.close()
        engine.close()
        cluster.close()


def _listed(client: StoreClient) -> list[str]:
    try:
        return client.list()
    except StoreError:
        return []


def _removed(client: StoreClient, key: str) -> bool:
    try:
        client.remove(key)
    except ObjectHasLease:
        return False
    return True
