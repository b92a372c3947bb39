"""The conductor's wait queue: a burst of chats without max_tokens on a real local cluster is
answered in full (no 429 without an SLO), even when the decode cache is small enough to preempt;
a full queue answers 503 with Retry-After and loses no admitted request; a client that leaves
while queued gives its place up; with a TTFT SLO a request whose predicted wait breaks it gets
429 carrying that prediction."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import socket
from collections import Counter
from collections.abc import Iterator

import openai
import pytest

from mooncake_cli.conductor.local_cluster import LocalCluster
from mooncake_cli.conductor.service import ConductorService
from mooncake_cli.config.conductor import ConductorConfig
from mooncake_cli.config.worker import WorkerConfig
from mooncake_cli.http import jsonhttp
from tests.conftest import free_port, wait_for
from tests.helpers.prom import value

pytestmark = pytest.mark.timeout(300)


def chats(url: str, n: int, max_tokens: int | None = None) -> list[object]:
    """`n` concurrent chats through the official client: each one's answer or exception."""
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0,
                                timeout=240)

    async def one(i: int) -> object:
        extra = {} if max_tokens is None else {"max_tokens": max_tokens}
        try:
            return await client.chat.completions.create(
                model="demo", messages=[{"role": "user", "content": f"question {i}?"}], **extra)
        except openai.APIError as e:
            return e

    async def main() -> list[object]:
        try:
            return list(await asyncio.gather(*(one(i) for i in range(n))))
        finally:
            await client.close()

    return asyncio.run(main())


@pytest.fixture(scope="module")
def small_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """One prefill and one decode worker whose 48 KV blocks hold a few answers at a time."""
    explain = tmp_path_factory.mktemp("queue") / "explain.jsonl"
    cfg = ConductorConfig(port=0, model="demo", max_queue=40, explain=str(explain))
    cluster = LocalCluster(cfg, 1, 1, WorkerConfig(kv_blocks=48))
    try:
        yield cluster
    finally:
        cluster.close()


def test_a_burst_without_max_tokens_is_answered_in_full(small_cluster: LocalCluster) -> None:
    got = chats(small_cluster.url, 30)
    errors = [g for g in got if isinstance(g, Exception)]
    assert errors == [], errors[:3]
    assert all(g.choices[0].finish_reason in ("stop", "length") for g in got)  # type: ignore
    [decode] = [w for w in small_cluster.workers if w.role == "decode"]
    assert decode.load()["preemptions"] >= 1, "48 blocks should not hold 30 answers at once"
    wait_for(lambda: decode.load()["free_blocks"] == 48, 10, what="every block to be freed")
    snap = jsonhttp.call(small_cluster.url + "/v1/instances").body
    assert snap["queue"]["length"] == 0 and snap["queue"]["limit"] == 40
    conductor = small_cluster.conductor
    assert conductor is not None
    metrics = jsonhttp.call(small_cluster.url + "/metrics").body["text"]
    queued = value(metrics, "mooncake_conductor_queued_total")
    assert queued >= 1 and value(metrics, "mooncake_conductor_queue_wait_seconds_count") == queued
    assert value(metrics, "mooncake_conductor_queue_length") == 0
    assert value(metrics, "mooncake_conductor_rejected_total") == 0
    worker = jsonhttp.call(decode.url + "/metrics").body["text"]
    assert value(worker, "mooncake_worker_preemptions_total", role="decode") == \
        decode.load()["preemptions"]
    records = [json.loads(line) for line in
               open(conductor.cfg.explain, encoding="utf-8").read().splitlines()]
    assert len({r["request"] for r in records}) == 30 and all("queue" in r for r in records)
    assert any(r["queue"]["waited_s"] > 0 for r in records)


def test_a_full_queue_is_503_and_loses_no_admitted_request(
        small_cluster: LocalCluster) -> None:
    got = chats(small_cluster.url, 90, max_tokens=24)
    outcomes = Counter(type(g).__name__ for g in got)
    full = [g for g in got if isinstance(g, openai.APIStatusError)]
    assert full, "90 requests at once should overflow a 40-request queue"
    assert all(e.status_code == 503 and e.code == "queue_full" for e in full), outcomes
    assert all(int(e.response.headers["Retry-After"]) >= 1 for e in full)
    answered = [g for g in got if not isinstance(g, Exception)]
    assert len(answered) + len(full) == 90, outcomes
    assert all(a.usage.completion_tokens >= 1 for a in answered)  # type: ignore[attr-defined]


@pytest.fixture()
def full_decode() -> Iterator[tuple[ConductorService, dict[str, int]]]:
    """A conductor whose only decode instance reports a full cache (nothing listens behind the
    instances: a queued request never reaches them)."""
    svc = ConductorService(ConductorConfig(port=0, instance_ttl=60.0, ttft_slo=0.0)).start()
    try:
        yield svc, register_full(svc)
    finally:
        svc.close()


def register_full(svc: ConductorService) -> dict[str, int]:
    for name, role in (("p0", "prefill"), ("d0", "decode")):
        load = {"running": 1, "waiting": 0, "free_blocks": 0, "total_blocks": 64}
        assert jsonhttp.call(svc.url + "/v1/instances/register",
                             {"name": name, "role": role, "load": load,
                              "url": f"http://127.0.0.1:{free_port()}"}).status == 200
    return {"total_blocks": 64}


def queue_length(svc: ConductorService) -> int:
    return int(jsonhttp.call(svc.url + "/v1/instances").body["queue"]["length"])


def head_waited(svc: ConductorService, seconds: float) -> bool:
    """Whether the one request in the queue has been there over `seconds` by the conductor's
    clock (its head retries every POLL_S meanwhile); the test fails if it left the queue."""
    queue = jsonhttp.call(svc.url + "/v1/instances").body["queue"]
    assert queue["length"] == 1, queue
    return float(queue["oldest_wait_s"]) > seconds


def test_a_client_that_leaves_the_queue_frees_its_place(
        full_decode: tuple[ConductorService, dict[str, int]]) -> None:
    svc, _ = full_decode
    body = b'{"model": "demo", "prompt": "hi", "max_tokens": 4}'
    socks = []
    for _ in range(3):
        s = socket.create_connection(("127.0.0.1", int(svc.url.rsplit(":", 1)[1])))
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                  b"application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        socks.append(s)
    wait_for(lambda: queue_length(svc) == 3, 10, what="three requests in the queue")
    socks[1].close()
    wait_for(lambda: queue_length(svc) == 2, 10, what="the one that left to leave the queue")
    for s in (socks[0], socks[2]):
        s.close()
    wait_for(lambda: queue_length(svc) == 0, 10, what="the queue to empty")
    assert svc.conductor.scheduler.cluster.by_name["p0"].queued == 0  # nothing was booked


def test_slo_rejections_carry_the_predicted_wait() -> None:
    svc = ConductorService(ConductorConfig(port=0, instance_ttl=60.0, ttft_slo=0.5)).start()
    try:
        register_full(svc)
        client = openai.OpenAI(base_url=svc.url + "/v1", api_key="none", max_retries=0,
                               timeout=10)
        with pytest.raises(openai.RateLimitError) as e:
            client.completions.create(model="demo", prompt="hi", max_tokens=4)
        message = e.value.message
        assert "predicted TTFT" in message and "wait" in message and "SLO 0.5 s" in message
        wait = svc.conductor.queue.predicted_wait(0)
        assert int(e.value.response.headers["Retry-After"]) == max(1, -(-wait // 1))
        assert queue_length(svc) == 0
    finally:
        svc.close()


def test_a_queued_request_is_served_once_room_appears(
        full_decode: tuple[ConductorService, dict[str, int]]) -> None:
    """Queued behind a full decode instance, the head is placed as soon as the instance
    reports room (here its prefill instance does not listen: it is marked dead and, with no
    other, the answer is 503 no_instance — not a hang)."""
    svc, _ = full_decode
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        fut = pool.submit(jsonhttp.call, svc.url + "/v1/completions",
                          {"model": "demo", "prompt": "hi", "max_tokens": 4}, timeout=60)
        wait_for(lambda: queue_length(svc) == 1, 10, what="the request to queue")
        wait_for(lambda: head_waited(svc, 0.3), 10, what="the head to wait 0.3 s (6 polls)")
        assert not fut.done()
        load = {"running": 0, "waiting": 0, "free_blocks": 64, "total_blocks": 64}
        jsonhttp.call(svc.url + "/v1/instances/register",
                      {"name": "d0", "role": "decode", "load": load,
                       "url": f"http://127.0.0.1:{free_port()}"})
        answer = fut.result(60)
    assert answer.status == 503 and answer.body["error"]["code"] == "no_instance"
    alive = {i["name"]: i["alive"] for i in
             jsonhttp.call(svc.url + "/v1/instances").body["instances"]}
    assert alive == {"p0": False, "d0": True}  # placed on p0 once d0 had room
