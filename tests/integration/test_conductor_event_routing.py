"""The conductor routes on the KV events of the workers that publish them (a vLLM prefill
worker names its event sockets in its registration, `kv_events`): real publisher processes
(tests/helpers/kv_publisher.py, vLLM's own batch structs) stand in for two prefill workers'
engines, registered with a running conductor over HTTP. Each decision is the conductor's own
(`Bookings.decide`, as a request's placement calls it); what its events say a worker holds is
what the decision counts, stored or removed, and nothing else: a prefill answer's stored keys
are not taken on faith for such a worker. (The same with real vLLM engines:
plugins/mooncake-vllm/tests/test_event_routing.py.)"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from mooncake_cli.api.roles import PrefillAnswer
from mooncake_cli.conductor.service import ConductorService
from mooncake_cli.config.conductor import ConductorConfig
from mooncake_cli.http import jsonhttp
from mooncake_cli.kvkeys import block_keys
from mooncake_cli.scheduler.scheduler import Decision
from mooncake_cli.scheduler.state import Request
from tests.helpers.indexer_calls import AUTH, SECRET, publisher_factory, settles, streams, vh
from tests.helpers.kv_publisher import Publisher, removed, stored
from tests.helpers.prom import value

BS = 16
T = list(range(1000, 1072))  # 4 whole blocks and a part


@pytest.fixture
def conductor(tmp_path: Path) -> Iterator[ConductorService]:
    cfg = ConductorConfig(port=0, model="demo", block_size=BS, instance_ttl=600,
                          explain=str(tmp_path / "explain.jsonl"))
    svc = ConductorService(cfg, secret=SECRET).start()
    yield svc
    svc.close()


@pytest.fixture
def publishers() -> Iterator[Callable[..., Publisher]]:
    yield from publisher_factory()


def join(svc: ConductorService, name: str, role: str = "prefill",
         events: dict[str, Any] | None = None) -> jsonhttp.Answer:
    body: dict[str, Any] = {"name": name, "role": role, "url": "http://127.0.0.1:9"}
    if events is not None:
        body["kv_events"] = events
    return jsonhttp.call(svc.url + "/v1/instances/register", body, auth=AUTH)


def follow(svc: ConductorService, name: str, pub: Publisher) -> None:
    ans = join(svc, name, events={"endpoint": pub.pub, "replay_endpoint": pub.replay,
                                  "block_size": BS})
    assert ans.status == 200, ans.body
    pub.wait_subscribers(1)


def held(svc: ConductorService) -> dict[str, int]:
    ans = jsonhttp.call(svc.url + "/query", {"model": svc.conductor.model.name,
                                             "block_size": BS, "token_ids": T})
    assert ans.status == 200, ans.body
    return {n: v["longest_matched"] for n, v in ans.body["default"].items()}


def decide(svc: ConductorService) -> tuple[Decision, dict[str, Any]]:
    """One placement decision for T, booked and released; with its explain record."""
    keys = block_keys(T, svc.conductor.model.ns)
    sreq = Request("r", len(T), 4, keys, T)
    decision = svc.conductor.bookings.decide(sreq)
    svc.conductor.bookings.unbook(decision, sreq)
    lines = Path(svc.cfg.explain).read_text().splitlines()
    return decision, json.loads(lines[-1])


def test_decisions_count_what_the_events_say(conductor, publishers) -> None:
    svc = conductor
    pa, pb = publishers(), publishers()
    follow(svc, "a", pa)
    follow(svc, "b", pb)
    assert join(svc, "d", "decode").status == 200
    assert sorted(streams(svc)) == ["a|0", "b|0"]

    hb = [vh("b", i) for i in range(4)]
    pb.publish([stored(hb, T[:64], BS)])
    settles(lambda: held(svc), {"a": 0, "b": 64})
    decision, record = decide(svc)
    assert (decision.prefill, decision.placement.chosen.local_blocks) == ("b", 4)
    assert record["kv_events"] == {"a": 0, "b": 4}

    pb.publish([removed(hb[2:])])  # b's engine evicted its last two blocks
    ha = [vh("a", i) for i in range(3)]
    pa.publish([stored(ha, T[:48], BS)])  # and a computed three
    settles(lambda: held(svc), {"a": 48, "b": 32})
    decision, record = decide(svc)
    assert (decision.prefill, decision.placement.chosen.local_blocks) == ("a", 3)
    assert record["kv_events"] == {"a": 3, "b": 2}
    keys = block_keys(T, svc.conductor.model.ns)
    index = svc.conductor.scheduler.cluster.index
    assert (index.prefix_len("a", keys), index.prefix_len("b", keys)) == (3, 2)

    # an answer saying b stored every block changes nothing: b's events say what it holds
    answer = PrefillAnswer(request_id="r", first_token=1, prompt_tokens=len(T),
                           cached_tokens=0, stored_keys=list(keys))
    svc.conductor.bookings.learn("b", list(keys), answer, decision)
    decision, record = decide(svc)
    assert decision.prefill == "a" and record["kv_events"] == {"a": 3, "b": 2}

    # /metrics: each stream's events (b: one stored, one removed; a: one stored) and blocks
    text = httpx.get(svc.url + "/metrics", timeout=10).text
    assert [value(text, "mooncake_conductor_kv_events_total", kind="events", stream=st)
            for st in ("a|default|0", "b|default|0")] == [1, 2]
    assert value(text, "mooncake_conductor_kv_events_total", kind="removed",
                 stream="b|default|0") == 2
    assert value(text, "mooncake_conductor_kv_event_blocks", stream="b|default|0",
                 medium="gpu") == 2


def test_leaving_worker_is_unfollowed_and_bad_sources_refused(conductor, publishers) -> None:
    svc = conductor
    pa = publishers()
    follow(svc, "a", pa)
    assert sorted(streams(svc)) == ["a|0"]
    ans = jsonhttp.call(svc.url + "/v1/instances/deregister", {"name": "a"}, auth=AUTH)
    assert (ans.status, ans.body) == (200, {"deregistered": True})
    assert streams(svc) == {}

    bad = join(svc, "c", events={"endpoint": "tcp://*:5557", "block_size": BS})
    assert bad.status == 400 and bad.body["error"]["param"] == "kv_events.endpoint"
    bad = join(svc, "c", events={"endpoint": "tcp://127.0.0.1:5557", "block_size": 0})
    assert bad.status == 400 and "kv_events" in json.dumps(bad.body)
    assert "c" not in {i["name"] for i in svc.conductor.instances.snapshot()}
    assert streams(svc) == {}

    # a decode worker's events are not followed (its blocks do not place prefills)
    assert join(svc, "d", "decode", {"endpoint": pa.pub, "block_size": BS}).status == 200
    assert svc.conductor.instances.get("d") is not None and streams(svc) == {}
