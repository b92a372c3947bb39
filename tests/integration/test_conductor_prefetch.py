"""Prefetch through the live conductor: a real store master publishing its events, a worker that
stored two prompts' blocks (not in the cluster), and a cluster of one prefill worker b, one
decode worker and a conductor with `--prefill-depth 1` following the store. While b is held by
a first request, two requests whose prefixes the store holds wait in the conductor's queue; the
conductor has b pull the first one's prefix at once (explain and metrics say so), and cancels
the second's when its client leaves. Then the first one runs on b and answers as the prompt
does computed from scratch."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from mooncake_cli.conductor.service import ConductorService
from mooncake_cli.config.conductor import ConductorConfig
from mooncake_cli.config.worker import WorkerConfig
from mooncake_cli.http import jsonhttp
from mooncake_cli.kvkeys import block_keys
from mooncake_cli.worker.decode import DecodeWorker
from mooncake_cli.worker.prefill import PrefillWorker
from tests.conftest import wait_for
from tests.helpers.indexer_calls import AUTH, SECRET
from tests.helpers.prom import value
from tests.helpers.store_procs import Proc, proc_list

pytestmark = pytest.mark.timeout(180)
BS = 16
CFG = WorkerConfig(segment_size=16 << 20, block_size=BS, chunk_size=64, kv_blocks=128)


def prompt(salt: int, n: int = 6 * BS + 3) -> list[int]:
    return [256, *((i * 7 + salt) % 256 for i in range(n - 1))]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[dict[str, Any]]:
    for procs in proc_list():
        master = Proc([sys.executable, "-m", "mooncake_cli", "--json", "store", "master",
                       "--port", "0", "--kv-events", "tcp://127.0.0.1:0"])
        procs.append(master)
        addr = master.ready["address"]
        with PrefillWorker(dataclasses.replace(CFG, role="prefill", store=addr, name="a")) as a, \
                PrefillWorker(dataclasses.replace(CFG, role="prefill", store=addr,
                                                  name="b")) as b, \
                DecodeWorker(dataclasses.replace(CFG, role="decode", name="d")) as d:
            cfg = ConductorConfig(port=0, model="demo", block_size=BS, instance_ttl=600,
                                  prefill_depth=1, explain=str(tmp_path / "explain.jsonl"),
                                  store_events=master.ready["kv_events"],
                                  store_events_replay=master.ready["kv_events_replay"])
            svc = ConductorService(cfg, secret=SECRET).start()
            try:
                for w in (b, d):
                    ans = jsonhttp.call(svc.url + "/v1/instances/register",
                                        {"name": w.name, "role": w.role, "url": w.url},
                                        auth=AUTH)
                    assert ans.status == 200, ans.body
                yield {"a": a, "b": b, "svc": svc}
            finally:
                svc.close()


def complete(url: str, ids: list[int], timeout: float = 120) -> httpx.Response:
    return httpx.post(url + "/v1/completions", timeout=timeout,
                      json={"model": "demo", "prompt": ids, "max_tokens": 3, "temperature": 0})


def records(svc: ConductorService) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(svc.cfg.explain).read_text().splitlines()]


def test_a_waiting_request_has_its_prefix_prefetched(cluster: dict[str, Any]) -> None:
    a, b, svc = cluster["a"], cluster["b"], cluster["svc"]
    first, second = prompt(3), prompt(5)
    for ids in (first, second):  # stored in a's segment; the store's events tell the conductor
        assert jsonhttp.call(a.url + "/v1/prefill", {
            "request_id": f"cold-{ids[1]}", "token_ids": ids, "reuse": "local",
            "sampling": {"max_tokens": 1}}).status == 200
    keys = [block_keys(ids, b.ns) for ids in (first, second)]
    wait_for(lambda: all(svc.indexer.store_depth(k)["longest"] == 6 for k in keys), 30, 0.05,
             "the store's events")
    answers: dict[str, Any] = {}

    def send(name: str, ids: list[int], timeout: float = 120) -> None:
        try:
            answers[name] = complete(svc.url, ids, timeout)
        except httpx.TimeoutException as e:
            answers[name] = e

    assert b.prefetch is not None
    with b.prefetch.loading():  # b's prefill of "hold" waits here: b is busy
        threads = [threading.Thread(target=send, args=("hold", prompt(9, 40)))]
        threads[0].start()
        wait_for(lambda: b.load()["running"] == 1, 30, 0.05, "b running the first request")
        threads.append(threading.Thread(target=send, args=("first", first)))
        threads[1].start()
        wait_for(lambda: len(b.prefetch.pulls()) == 1, 30, 0.05, "the prefetch order")
        assert b.prefetch.pulls()[0].reason == "queue"
        # its client gives up while it waits: the conductor cancels its prefetch on b
        threads.append(threading.Thread(target=send, args=("gone", second, 1.0)))
        threads[2].start()
        wait_for(lambda: b.metrics.get("prefetches") == 2, 30, 0.05, "the second order")
        threads[2].join(30)
        wait_for(lambda: b.metrics.get("prefetches_cancelled") == 1, 30, 0.05, "the cancel")
    for t in threads:
        t.join(120)
    assert isinstance(answers["gone"], httpx.TimeoutException)
    assert answers["hold"].status_code == 200 and answers["first"].status_code == 200
    placed = [r for r in records(svc) if "prefetch" in r]
    assert [r["prefetch"] for r in placed] == [{"instance": "b", "blocks": 6,
                                               "reason": "queue"}], placed
    assert placed[0]["prefill"]["fetch_blocks"] == 6
    metrics = httpx.get(svc.url + "/metrics").text
    assert value(metrics, "mooncake_conductor_prefetch_requests_total") == 2
    assert value(metrics, "mooncake_conductor_prefetch_cancelled_total") == 1
    assert value(metrics, "mooncake_conductor_prefetched_blocks_total") == \
        b.metrics.get("prefetched_blocks")
    again = complete(svc.url, first)  # b holds the prefix now: nothing to prefetch
    assert again.json()["choices"][0]["text"] == answers["first"].json()["choices"][0]["text"]


def test_an_instance_without_the_route_is_not_asked_again() -> None:
    """An engine without prefetch (a vLLM role answers 404) is asked once; a cancel goes only
    where an order went."""
    from starlette.requests import Request as HttpRequest
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from mooncake_cli.conductor.live_metrics import ConductorMetrics
    from mooncake_cli.conductor.prefetch import Prefetches
    from mooncake_cli.http.jsonhttp import AsyncPeer
    from mooncake_cli.http.server import Server, edge_app
    from mooncake_cli.scheduler.estimate import Candidate
    from mooncake_cli.scheduler.state import Request as Sched

    seen: list[str] = []

    async def missing(request: HttpRequest) -> JSONResponse:
        seen.append(request.url.path)
        return JSONResponse({"error": {"message": "not found"}}, 404)

    server = Server(edge_app([Route("/v1/prefetch", missing, methods=["POST"]),
                              Route("/v1/prefetch/cancel", missing, methods=["POST"])]),
                    "127.0.0.1", 0, "no-prefetch").start()
    chosen = Candidate("v", 0.0, 0, 4, "(store)", 0.1, 0.2, 0.3)

    async def run() -> None:
        peer = AsyncPeer()
        metrics = ConductorMetrics()
        orders = Prefetches(metrics, lambda name: f"http://127.0.0.1:{server.port}",
                            lambda url, body: peer.call(url, body))
        try:
            assert orders.waiting(chosen, Sched("r1", 80, 1, [], list(range(80)))) is not None
            await orders.settled()
            assert orders.waiting(chosen, Sched("r2", 80, 1, [], list(range(80)))) is None
            orders.left("r2")  # never ordered: nothing to cancel
            orders.left("r1")
            await orders.settled()
            assert metrics.counters["prefetch_requests_total"] == 1
            assert metrics.counters["prefetch_cancelled_total"] == 1
        finally:
            await orders.close()
            await peer.close()

    try:
        asyncio.run(run())
    finally:
        server.close()
    assert seen == ["/v1/prefetch", "/v1/prefetch/cancel"]
