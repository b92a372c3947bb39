"""The conductor learns from a prefill answer which fetched blocks gained a replica on the
instance that fetched them: its cache index then lists that instance as a holder, and
/metrics counts the blocks replicated."""

from __future__ import annotations

import pytest

from mooncake_cli.api.errors import ServingError
from mooncake_cli.api.roles import PrefillAnswer
from mooncake_cli.api.schema import validate
from mooncake_cli.conductor.instances import Instances
from mooncake_cli.conductor.live import Conductor
from mooncake_cli.conductor.live_metrics import ConductorMetrics
from mooncake_cli.conductor.served import ServedModel
from mooncake_cli.kvkeys import KVNamespace
from mooncake_cli.scheduler.online_cost import OnlineCostModel
from mooncake_cli.scheduler.scheduler import Scheduler, make_policy
from mooncake_cli.scheduler.state import Cluster, Request
from tests.helpers.prom import value

BS = 16


def test_replicated_keys_make_the_fetching_instance_a_holder() -> None:
    ns = KVNamespace("tiny", "float32", BS, 2, 2, 8)
    cluster = Cluster(OnlineCostModel(block_tokens=BS, kv_bytes_per_token=ns.block_bytes // BS,
                                      bandwidth=1e9))
    cluster.add("p1", "prefill")
    cluster.add("p2", "prefill")
    cluster.add("d1", "decode")
    conductor = Conductor(ServedModel("tiny", None, ns, 4096),
                          Scheduler(cluster, make_policy("kvcache-centric")),
                          Instances(cluster, 30.0, BS), ConductorMetrics())
    keys = [f"k{i}" for i in range(4)]
    cluster.index.store("p1", keys)
    decision = conductor.scheduler.schedule(Request("r1", 4 * BS + 5, 2, keys), 0.0)
    answer = {"request_id": "r1", "first_token": 1, "prompt_tokens": 4 * BS + 5,
              "cached_tokens": 3 * BS, "stored_keys": [], "replicated_keys": keys[:3]}
    conductor.bookings.learn("p2", keys, validate(PrefillAnswer, answer), decision)
    assert cluster.index.holders("k0") == {"p1", "p2"}
    assert cluster.index.holders("k3") == {"p1"}
    assert cluster.index.prefix_len("p2", keys) == 3
    assert conductor.metrics.counters["blocks_replicated_total"] == 3
    text = conductor.metrics.render([])
    assert value(text, "mooncake_conductor_blocks_replicated_total") == 3
    with pytest.raises(ServingError, match="replicated_keys"):  # a malformed answer
        validate(PrefillAnswer, answer | {"replicated_keys": "k3"})
    assert cluster.index.holders("k3") == {"p1"}
    assert conductor.metrics.counters["blocks_replicated_total"] == 3
    conductor.close()
