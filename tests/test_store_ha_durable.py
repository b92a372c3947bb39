"""Acknowledged writes survive the HA leader: real etcd, real `python -m
mooncake_cli.store.service --ha` masters, real store nodes holding the data, and a client with
no segment of its own. The leader is killed with SIGKILL right after a put (or a remove, or a
batch put) returned; the new leader must serve every acknowledged object and none removed."""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import wait_for
from helpers.store_procs import Proc, start_ha_master, start_node

from mooncake_cli.config import TransferConfig
from mooncake_cli.registry import Registry
from mooncake_cli.store import StoreError
from mooncake_cli.store.client import StoreClient
from mooncake_cli.store.errors import ObjectNotFound
from mooncake_cli.store.leader import LeaderInfo, LeaderResolver
from mooncake_cli.transfer.engine import TransferEngine

pytestmark = pytest.mark.timeout(60)


class Cluster:
    """Two HA masters and two store nodes (32 MiB each) on one etcd cluster name."""

    def __init__(self, etcd: str) -> None:
        self.url = f"{etcd}/d{uuid.uuid4().hex[:8]}"
        self.procs: list[Proc] = []
        self.masters = [self._start(start_ha_master, self.url) for _ in range(2)]
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
    time.sleep(random.uniform(0.1, 0.5))
    killed = time.monotonic()
    cluster.kill_leader()
    all_back(client, want, 10)
    # every get works within 3 s of the kill (2 s of them are the etcd lease running out)
    assert time.monotonic() - killed < 6


def test_leader_killed_right_after_a_batch_put(cluster: Cluster, client: StoreClient) -> None:
    want = values(64, 2)
    keys = list(want)
    assert client.batch_put(keys[:32], [want[k] for k in keys[:32]]) == [None] * 32
    assert client.batch_put(keys[32:], [want[k] for k in keys[32:]]) == [None] * 32
    cluster.kill_leader()
    all_back(client, want, 10)


def test_leader_killed_right_after_a_remove(cluster: Cluster, client: StoreClient) -> None:
    want = values(40, 3)
    for key, value in want.items():
        client.put(key, value)
    time.sleep(1.5)  # the puts are settled either way; the removes are what is tested
    removed = list(want)[:20]
    for key in removed:
        client.remove(key, force=True)
    keep = {k: v for k, v in want.items() if k not in removed}
    cluster.kill_leader()
    all_back(client, keep, 10)
    for key in removed:
        with pytest.raises(ObjectNotFound):
            client.get(key)
