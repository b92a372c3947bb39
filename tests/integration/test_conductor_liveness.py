"""A busy worker is not a dead one: a decode worker generating one answer for longer than the
conductor's request timeout stays in the cluster, and the requests behind it are served (the
conductor reads every answer as a stream, and its timeout is between two tokens)."""

from __future__ import annotations

import concurrent.futures
import time

import pytest

from mooncake_cli.conductor.local_cluster import LocalCluster
from mooncake_cli.config.conductor import ConductorConfig
from mooncake_cli.config.worker import WorkerConfig
from mooncake_cli.http import jsonhttp
from tests.conftest import wait_for
from tests.helpers.prom import value

pytestmark = pytest.mark.timeout(300)
TIMEOUT = 2.0


def test_a_long_answer_outlasting_the_timeout_keeps_its_worker() -> None:
    cfg = ConductorConfig(port=0, model="demo", request_timeout=TIMEOUT)
    cluster = LocalCluster(cfg, 1, 1, WorkerConfig(kv_blocks=1024))
    try:
        [decode] = [w for w in cluster.workers if w.role == "decode"]
        long = {"model": "demo", "prompt": "a long answer", "max_tokens": 1500,
                "ignore_eos": True, "temperature": 0}
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            start = time.monotonic()
            pending = pool.submit(jsonhttp.call, cluster.url + "/v1/completions", long,
                                  timeout=280)
            wait_for(lambda: decode.load()["running"] == 1, 60, what="the long answer to run")
            short = {"model": "demo", "prompt": "next", "max_tokens": 8, "ignore_eos": True}
            behind = [jsonhttp.call(cluster.url + "/v1/completions", short, timeout=60)
                      for _ in range(4)]
            assert not pending.done(), "the long answer must still run behind the others"
            answer = pending.result()
            took = time.monotonic() - start
        assert [b.status for b in behind] == [200] * 4, [b.body for b in behind]
        assert answer.status == 200, answer.body
        assert answer.body["usage"]["completion_tokens"] == 1500
        assert took > TIMEOUT, "the answer must outlast the timeout for this test to mean it"
        snap = jsonhttp.call(cluster.url + "/v1/instances").body["instances"]
        assert all(i["alive"] for i in snap), snap
        metrics = jsonhttp.call(cluster.url + "/metrics").body["text"]
        assert value(metrics, "mooncake_conductor_errors_total") == 0
        assert value(metrics, "mooncake_conductor_migrations_total") == 0
    finally:
        cluster.close()
