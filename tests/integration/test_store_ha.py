"""The store's HA through a real etcd: masters as real processes campaign for the leadership,
standbys refuse and name the leader, clients follow the leader published in etcd, and after the
leader is killed a standby leads and serves the keys put before, rebuilt from the clients."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import etcd3gw
import pytest
import zmq

from mooncake_cli.compat.store import MooncakeDistributedStore
from mooncake_cli.compat.store import ReplicateConfig as CompatConfig
from mooncake_cli.config import TransferConfig, load
from mooncake_cli.config.store import StoreConfig
from mooncake_cli.interfaces import ConfigError
from mooncake_cli.registry import Registry
from mooncake_cli.store import Mount, ReplicateConfig, StoreError, StoreMaster
from mooncake_cli.store.client import StoreClient
from mooncake_cli.store.ha.election import HaMaster
from mooncake_cli.store.ha.leader import NOT_LEADER, HaAddress, LeaderInfo, LeaderResolver
from mooncake_cli.store.service import MasterService
from mooncake_cli.store.wire import protocol as p
from mooncake_cli.transfer.engine import TransferEngine
from tests.conftest import REPO, wait_for
from tests.helpers.procs import child_env
from tests.helpers.store_procs import Proc, start_ha_master, start_node

pytestmark = pytest.mark.timeout(90)


def cluster(etcd: str) -> str:
    return f"{etcd}/t{uuid.uuid4().hex[:8]}"  # a cluster of its own per test


def ask(address: str, request: Any) -> p.Reply:
    """One request sent straight to a master's port."""
    ctx: zmq.Context[Any] = zmq.Context()
    try:
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.RCVTIMEO, 5000)
        s.connect(f"tcp://{address}")
        s.send(p.encode(request))
        return p.decode_reply(s.recv_multipart()[0])
    finally:
        ctx.destroy(linger=0)


def leader_other_than(resolver: LeaderResolver, old: str) -> LeaderInfo | None:
    info = resolver.lookup()
    return info if info is not None and info.address != old else None


@pytest.fixture
def procs() -> Iterator[list[Proc]]:
    started: list[Proc] = []
    yield started
    for proc in started:
        proc.stop()


def test_leader_killed_standby_leads_and_clients_follow(etcd: str, procs: list[Proc]) -> None:
    url = cluster(etcd)
    masters = [start_ha_master(url, "--client-ttl", "4") for _ in range(3)]
    procs.extend(masters)
    by_address = {m.ready["address"]: m for m in masters}
    resolver = LeaderResolver(url)
    first = wait_for(resolver.lookup, 15, what="a leader")
    assert isinstance(first, LeaderInfo) and first.address in by_address and first.ha

    for address in by_address:  # standbys refuse, naming the leader; all know who leads
        wait_for(lambda a=address: p.result(ask(a, p.WhoLeads()), LeaderInfo) == first, 5,
                 what="every master to know the leader")
        if address != first.address:
            wait_for(lambda a=address: first.address in ask(a, p.Exists("k")).message, 5,
                     what="the standby to name the leader")
            reply = ask(address, p.Exists("k"))
            assert not reply.ok and reply.code == NOT_LEADER
    wait_for(lambda: ask(first.address, p.Exists("k")).ok, 5, what="the leader to serve")

    node = start_node(url)  # a client process following the leader through etcd
    procs.append(node)
    engine = TransferEngine(TransferConfig(timeout=3), Registry())
    client = StoreClient(url, engine, 8 << 20, timeout=3)
    compat = MooncakeDistributedStore(timeout=3)  # upstream's API given the etcd address
    try:
        assert compat.setup("localhost", "P2PHANDSHAKE", "8MB", "8MB", "tcp", "", url) == 0
        own = CompatConfig()
        own.preferred_segment = compat.get_hostname()
        assert compat.put("compat", b"upstream-style value", own) == 0
        rng = random.Random(7)
        values = {f"mine-{i}": rng.randbytes(rng.randint(1, 200_000)) for i in range(5)}
        for key, value in values.items():
            client.put(key, value, ReplicateConfig(preferred_segment=engine.name))
        theirs = {f"theirs-{i}": (i + 100, 1000 * i + 17) for i in range(5)}
        for key, (seed, size) in theirs.items():
            assert node.ask(cmd="put", key=key, seed=seed, size=size,
                            preferred=node.ready["segment"])["ok"]

        killed = time.monotonic()
        by_address[first.address].kill()
        second = wait_for(lambda: leader_other_than(resolver, first.address), 5,
                          what="a standby to lead")
        assert isinstance(second, LeaderInfo) and second.term > first.term

        def all_served() -> bool:
            if compat.get("compat") != b"upstream-style value":
                return False
            try:
                return all(client.get(k) == v for k, v in values.items()) and all(
                    node.ask(cmd="get", key=k, seed=s, size=n).get("match")
                    for k, (s, n) in theirs.items())
            except StoreError:
                return False

        wait_for(all_served, max(0.1, killed + 5 - time.monotonic()),
                 what="the keys put before the failover to be served again within 5 s")
        assert sorted(client.list()) == sorted(["compat", *values, *theirs])

        stat = subprocess.run([sys.executable, "-m", "mooncake_cli", "--json", "store", "stat",
                               "--master", url], capture_output=True, cwd=REPO, env=child_env(),
                              timeout=60)
        assert stat.returncode == 0, stat.stderr.decode()
        data = json.loads(stat.stdout)
        assert data["leader"] == {"address": second.address, "ha": True, "term": second.term,
                                  "id": second.id}
        assert data["objects"] == len(values) + len(theirs) + 1

        by_address[second.address].stop()  # a clean stop revokes the lease: the last one leads
        third = wait_for(lambda: leader_other_than(resolver, second.address), 5,
                         what="the last master to lead")
        assert isinstance(third, LeaderInfo) and third.term > second.term
        wait_for(all_served, 10, what="the keys to be served by the third leader")
        assert client.leader() == third
    finally:
        compat.close()
        client.close()
        engine.close()


def test_a_leader_that_loses_its_lease_steps_down(etcd: str) -> None:
    url = cluster(etcd)
    changes: list[tuple[str, bool]] = []
    services = [MasterService(StoreMaster(), port=0) for _ in range(2)]
    has = [HaMaster(s, url, StoreMaster,
                    on_change=lambda leading, info, a=s.address: changes.append((a, leading)))
           for s in services]
    try:
        resolver = LeaderResolver(url)
        first = wait_for(resolver.lookup, 10, what="a leader")
        assert isinstance(first, LeaderInfo)
        leader = next(s for s in services if s.address == first.address)
        wait_for(lambda: leader.standby is None, 5, what="the leader to serve")
        leader.master.mount_segment(Mount("seg", "c", "h", 0, 1 << 20))

        where = HaAddress.parse(url)
        gw = etcd3gw.client(host=where.endpoints[0][0], port=where.endpoints[0][1])
        lease_id = int(gw.get(where.key, metadata=True)[0][1]["lease"])
        etcd3gw.Lease(lease_id, gw).revoke()  # as if etcd expired it

        wait_for(lambda: (first.address, False) in changes, 5, what="the leader to step down")
        now = wait_for(lambda: (i := resolver.lookup()) and i.term > first.term and i, 5,
                       what="a new term")
        assert isinstance(now, LeaderInfo)
        serving = wait_for(lambda: [s for s in services if s.standby is None], 5,
                           what="the new leader to serve")
        assert [s.address for s in serving] == [now.address]  # never two leaders
        assert serving[0].master.stats().tiers["dram"].segments == 0  # a term starts empty
        for s in services:
            if s is not serving[0]:
                assert not ask(s.address, p.Exists("k")).ok
    finally:
        for ha in has:
            ha.close()
        for s in services:
            s.close()


def test_ha_and_metrics_port_settings(tmp_path: Any) -> None:
    toml = tmp_path / "store.toml"
    toml.write_text('[store]\nha = "etcd://10.0.0.1:2379,10.0.0.2:2379/prod"\n'
                    'metrics_port = 9100\n')
    cfg = load(StoreConfig, "store", str(toml), env={})
    assert (cfg.ha, cfg.metrics_port) == ("etcd://10.0.0.1:2379,10.0.0.2:2379/prod", 9100)
    where = HaAddress.parse(cfg.ha)
    assert where.endpoints == (("10.0.0.1", 2379), ("10.0.0.2", 2379))
    assert where.key == "/mooncake/store/prod/leader"
    cfg = load(StoreConfig, "store", str(toml), env={"MOONCAKE_STORE_METRICS_PORT": "0"}, ha="")
    assert (cfg.ha, cfg.metrics_port) == ("", 0)
    assert load(StoreConfig, "store", None, env={}).metrics_port == -1  # off
    for bad in ({"ha": "etcd://nohost"}, {"ha": "etcd://h:2379/bad name"},
                {"ha": "http://h:2379"}, {"master": "etcd://h:99999"},
                {"metrics_port": 70000}):
        with pytest.raises(ConfigError):
            load(StoreConfig, "store", None, env={}, **bad)


def test_master_cli_rejects_a_bad_ha_address() -> None:
    run = subprocess.run([sys.executable, "-m", "mooncake_cli", "store", "master", "--port", "0",
                          "--ha", "etcd://localhost"], capture_output=True, cwd=REPO,
                         env=child_env(), timeout=60)
    assert run.returncode == 2
    assert b"etcd://HOST:PORT" in run.stderr


def test_a_master_without_ha_names_itself_leader(make_engine: Any) -> None:
    with MasterService(StoreMaster(), port=0) as service, \
            StoreClient(service.address, make_engine(), 0, timeout=3) as client:
        assert client.leader() == LeaderInfo(service.address, 0, "", False)
