"""Object events under HA: two `mooncake store master --ha ... --kv-events` processes against a
real etcd, a store client following the leader, the conductor's indexer registered on both
masters' streams. The leader's stream holds what was put; when it is killed, the new leader's
stream (cleared when it won the term) fills again as the client re-registers its holdings."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator

import pytest

from mooncake_cli.conductor.service import ConductorService
from mooncake_cli.store.ha.leader import LeaderInfo, LeaderResolver
from tests.conftest import wait_for
from tests.helpers.indexer_calls import m, running_conductor, settles, streams
from tests.helpers.store_procs import Proc, proc_list
from tests.integration.test_store_kv_events import KEYS, NS, T, ask, node, query, register

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def conductor() -> Iterator[ConductorService]:
    yield from running_conductor()


@pytest.fixture
def procs() -> Iterator[list[Proc]]:
    yield from proc_list()


def test_a_new_leader_starts_its_stream_over_and_refills_it(etcd, conductor, procs) -> None:
    url = f"{etcd}/t{uuid.uuid4().hex[:8]}"
    masters = [Proc([sys.executable, "-m", "mooncake_cli", "--json", "store", "master",
                     "--port", "0", "--ha", url, "--client-ttl", "4", "--kv-events",
                     "tcp://127.0.0.1:0"]) for _ in range(2)]
    procs.extend(masters)
    for i, mst in enumerate(masters):
        register(conductor, mst, f"master-{i}")
    resolver = LeaderResolver(url)
    first = wait_for(resolver.lookup, 15, what="a leader")
    assert isinstance(first, LeaderInfo)
    lead = next(i for i, p in enumerate(masters) if p.ready["address"] == first.address)
    a = node(url, "--segment-size", str(2 << 20))
    procs.append(a)
    ask(a, cmd="blocks", tokens=T, ns=NS, size=1024)
    held, none = m(96, 0, 96, 0, {"0": 96}), m(0, 0, 0, 0, {"0": 0})
    settles(lambda: query(conductor, T)["default"][f"master-{lead}"], held)
    assert query(conductor, T)["default"][f"master-{1 - lead}"] == none

    masters[lead].kill()
    settles(lambda: query(conductor, T)["default"][f"master-{1 - lead}"], held, timeout=30)
    assert conductor.indexer.store_depth(KEYS)["cpu"] == 6
    # its stream began again when it won the term (the start's `cleared`, then the term's)
    assert streams(conductor)[f"master-{1 - lead}|0"]["counts"]["cleared"] >= 2
