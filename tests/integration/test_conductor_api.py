"""The conductor's HTTP front on its own: OpenAI-style errors through the official `openai`
client, the instance registry, dead instances, metrics. (With live workers: test_conductor_e2e.)
"""

from __future__ import annotations

import concurrent.futures
import json
import urllib.request
from collections.abc import Iterator

import openai
import pytest

from mooncake_cli.conductor.service import ConductorService
from mooncake_cli.config.conductor import ConductorConfig
from mooncake_cli.http import jsonhttp
from mooncake_cli.interfaces import ConfigError
from tests.conftest import free_port, wait_for
from tests.helpers.prom import helps, value


@pytest.fixture
def conductor(tmp_path) -> Iterator[ConductorService]:
    cfg = ConductorConfig(port=0, model="demo", explain=str(tmp_path / "explain.jsonl"),
                          instance_ttl=30.0, retries=1)
    svc = ConductorService(cfg).start()
    yield svc
    svc.close()


def client(svc: ConductorService) -> openai.OpenAI:
    return openai.OpenAI(base_url=svc.url + "/v1", api_key="none", max_retries=0, timeout=10)


def test_models_and_openai_errors(conductor: ConductorService) -> None:
    c = client(conductor)
    assert [m.id for m in c.models.list().data] == ["demo"]
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        c.completions.create(model="nope", prompt="hi")
    with pytest.raises(openai.BadRequestError, match="max_tokens") as e:
        c.completions.create(model="demo", prompt="hi", max_tokens=-3)
    assert e.value.body["param"] == "max_tokens"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        c.completions.create(model="demo", prompt=[5] * 9000, max_tokens=4)
    with pytest.raises(openai.BadRequestError, match="messages"):
        c.chat.completions.create(model="demo", messages=[])
    with pytest.raises(openai.BadRequestError, match="temperature"):
        c.chat.completions.create(model="demo", messages=[{"role": "user", "content": "x"}],
                                  temperature=7)
    # no worker registered: a clear 503, not a crash
    with pytest.raises(openai.InternalServerError, match="no live prefill instance"):
        c.completions.create(model="demo", prompt="hi", max_tokens=2)


def test_malformed_bodies(conductor: ConductorService) -> None:
    for raw, status in ((b"{bad", 400), (b"[1, 2]", 400), (b'{"model": 5}', 400)):
        req = urllib.request.Request(conductor.url + "/v1/completions", data=raw,
                                     method="POST")
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=5)
        assert e.value.code == status
        assert json.loads(e.value.read())["error"]["type"] == "invalid_request_error"
    assert jsonhttp.call(conductor.url + "/v1/nothing").status == 404


def test_registry_and_dead_prefill_is_rerouted(conductor: ConductorService) -> None:
    url = conductor.url
    bad = jsonhttp.call(url + "/v1/instances/register", {"name": "p0", "role": "cook"})
    assert bad.status == 400
    dead = [f"http://127.0.0.1:{free_port()}" for _ in range(3)]  # nothing listens there
    for i, u in enumerate(dead[:2]):
        ok = jsonhttp.call(url + "/v1/instances/register",
                           {"name": f"p{i}", "role": "prefill", "url": u, "load": {}})
        assert ok.status == 200
    jsonhttp.call(url + "/v1/instances/register",
                  {"name": "d0", "role": "decode", "url": dead[2],
                   "load": {"running": 0, "waiting": 0, "free_blocks": 64,
                            "total_blocks": 64}})
    listed = jsonhttp.call(url + "/v1/instances").body["instances"]
    assert {i["name"]: i["alive"] for i in listed} == {"d0": True, "p0": True, "p1": True}
    answer = jsonhttp.call(url + "/v1/completions",
                           {"model": "demo", "prompt": "hello", "max_tokens": 2})
    # both prefill instances found dead (free re-places): none is left to schedule on
    assert answer.status == 503, answer.body
    assert answer.body["error"]["message"] == "no live prefill instance to schedule on"
    listed = jsonhttp.call(url + "/v1/instances").body["instances"]
    assert {i["name"]: i["alive"] for i in listed} == {"d0": True, "p0": False, "p1": False}
    metrics = jsonhttp.call(url + "/metrics").body["text"]
    assert value(metrics, "mooncake_conductor_rerouted_total") == 2
    assert value(metrics, "mooncake_conductor_instance_alive", name="p0", role="prefill") == 0
    assert jsonhttp.call(url + "/health").status == 503
    assert jsonhttp.call(url + "/v1/instances/deregister", {"name": "p0"}).body == \
        {"deregistered": True}
    explained = [json.loads(line) for line in
                 open(conductor.cfg.explain, encoding="utf-8").read().splitlines()]
    assert explained and explained[0]["policy"] == "kvcache-centric"
    assert {c["instance"] for c in explained[0]["candidates"]} == {"p0", "p1"}


def test_config_errors() -> None:
    with pytest.raises(ConfigError, match="unknown policy"):
        ConductorConfig(policy="fastest")
    with pytest.raises(ConfigError, match="ttft_slo"):
        ConductorConfig(ttft_slo=-1)
    with pytest.raises(ConfigError, match="no such file or directory"):
        ConductorService(ConductorConfig(model="/nonexistent/model", port=0))
    assert ConductorConfig(prefill="a:1, http://b:2/").prefill == ("http://a:1", "http://b:2")


def test_slo_admission_answers_429_with_retry_after(tmp_path) -> None:
    cfg = ConductorConfig(port=0, model="demo", ttft_slo=0.001, instance_ttl=30.0)
    svc = ConductorService(cfg).start()
    try:
        for name, role in (("p0", "prefill"), ("d0", "decode")):
            jsonhttp.call(svc.url + "/v1/instances/register",
                          {"name": name, "role": role, "url": f"http://127.0.0.1:{free_port()}",
                           "load": {}})
        with pytest.raises(openai.RateLimitError, match="cannot meet the SLO") as e:
            client(svc).completions.create(model="demo", prompt="x" * 200, max_tokens=4)
        assert int(e.value.response.headers["Retry-After"]) >= 1
        assert "estimated TTFT" in e.value.message
        metrics = jsonhttp.call(svc.url + "/metrics").body["text"]
        assert value(metrics, "mooncake_conductor_rejected_total") == 1
        # the rejected request never reached the (unreachable) prefill instance
        assert value(metrics, "mooncake_conductor_rerouted_total") == 0
    finally:
        svc.close()


def test_chat_uses_the_models_template(tmp_path) -> None:
    from mooncake_cli.conductor.service import served_model
    from tests.helpers.tiny_models import write_model

    model = write_model(tmp_path / "tiny", "qwen2", seed=1)
    template = ("{% for m in messages %}<s>{{ m['role'] }}|{{ m['content'] }}</s>{% endfor %}"
                "{% if add_generation_prompt %}<s>assistant|{% endif %}")
    cfg_file = model / "tokenizer_config.json"
    doc = json.loads(cfg_file.read_text()) if cfg_file.exists() else {}
    cfg_file.write_text(json.dumps({**doc, "chat_template": template, "bos_token": "<s>"}))
    served = served_model(ConductorConfig(model=str(model)))
    assert served.chat.native
    messages = ({"role": "user", "content": "hi"},)
    text = served.chat.render(messages)
    assert text == "<s>user|hi</s><s>assistant|"
    ids = served.chat_tokens(messages)
    assert ids == served.tokenizer.encode(text, add_special_tokens=False)
    assert ids.count(0) == 2  # the template's two <s>, no extra BOS from the tokenizer
    # no template: the plain rendering, with the tokenizer's own special tokens
    cfg_file.write_text(json.dumps({k: v for k, v in doc.items() if k != "chat_template"}))
    plain = served_model(ConductorConfig(model=str(model)))
    assert not plain.chat.native and plain.chat.render(messages) == "user: hi\nassistant:"
    assert plain.chat_tokens(messages)[0] == 0  # BOS added by the tokenizer
    cfg_file.write_text(json.dumps({**doc, "chat_template": "{% for %}"}))
    with pytest.raises(ConfigError, match="chat template"):
        served_model(ConductorConfig(model=str(model)))


def test_decode_side_failures_reroute_400_or_wait() -> None:
    """A dead decode worker is marked and the request placed on another; a request that can
    never fit the decode worker's cache (the conductor's view of it being wrong) is 400
    context_length_exceeded; one that fits but finds the cache held by others waits for it."""
    from mooncake_cli.config.worker import WorkerConfig
    from mooncake_cli.worker.decode import DecodeWorker
    from mooncake_cli.worker.prefill import PrefillWorker

    svc = ConductorService(ConductorConfig(port=0, instance_ttl=60.0, retries=2)).start()
    p = PrefillWorker(WorkerConfig(role="prefill", kv_blocks=64)).start()
    small = DecodeWorker(WorkerConfig(role="decode", kv_blocks=4)).start()
    try:
        def register(name: str, role: str, url: str, free: int = 4096) -> None:
            room = {"running": 0, "waiting": 0, "free_blocks": free, "total_blocks": 4096}
            assert jsonhttp.call(svc.url + "/v1/instances/register",
                                 {"name": name, "role": role, "url": url,
                                  "load": room}).status == 200

        register("p0", "prefill", p.url)
        register("d0", "decode", f"http://127.0.0.1:{free_port()}")  # nothing listens
        register("d1", "decode", small.url)  # claims room it does not have
        body = {"model": "demo", "prompt": "y" * 200, "max_tokens": 8}
        answer = jsonhttp.call(svc.url + "/v1/completions", body, timeout=60)
        assert answer.status == 400, answer.body
        assert answer.body["error"]["code"] == "context_length_exceeded"
        assert answer.body["error"]["param"] == "prompt"
        alive = {i["name"]: i["alive"] for i in
                 jsonhttp.call(svc.url + "/v1/instances").body["instances"]}
        assert alive == {"p0": True, "d0": False, "d1": True}  # d0 was tried first, then d1
        # d1 reports its cache full: a small request waits until it reports room again
        register("d1", "decode", small.url, free=0)
        small_req = {"model": "demo", "prompt": "y", "max_tokens": 4}
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(jsonhttp.call, svc.url + "/v1/completions", small_req,
                                  timeout=60)

            def waited() -> bool:  # by the conductor's clock, in the queue all along
                assert not waiting.done(), waiting.result().body
                queue = jsonhttp.call(svc.url + "/v1/instances").body["queue"]
                return queue["length"] == 1 and float(queue["oldest_wait_s"]) > 1.0
            wait_for(waited, 30, what="the request to wait 1 s in the queue")
            assert not waiting.done(), waiting.result().body
            assert jsonhttp.call(svc.url + "/v1/instances").body["queue"]["length"] == 1
            register("d1", "decode", small.url)
            full = waiting.result(60)
        assert full.status == 200, full.body
        assert float(full.headers["X-Mooncake-Queue-Wait"]) >= 1.0
        fits = jsonhttp.call(svc.url + "/v1/completions", small_req, timeout=60)
        assert fits.status == 200 and fits.body["usage"]["completion_tokens"] >= 1
        state = svc.conductor.scheduler.cluster.by_name
        assert state["d1"].booked_requests == 0 and state["d1"].booked_tokens == 0 and \
            state["p0"].queued == 0  # nothing left booked
    finally:
        small.close()
        p.close()
        svc.close()


def test_never_fits_is_400_and_full_now_waits() -> None:
    """The scheduler's own view: a request over every decode instance's whole KV capacity is
    400 (it would wait forever); one that only finds them full now waits in the queue."""
    svc = ConductorService(ConductorConfig(port=0, instance_ttl=60.0)).start()
    try:
        def register(name: str, role: str, free: int) -> None:
            load = {"running": 1, "waiting": 0, "free_blocks": free, "total_blocks": 4}
            assert jsonhttp.call(svc.url + "/v1/instances/register",
                                 {"name": name, "role": role, "load": load,
                                  "url": f"http://127.0.0.1:{free_port()}"}).status == 200

        register("p0", "prefill", 0)
        register("d0", "decode", 4)  # 4 blocks of 16 tokens, all free
        chat = {"model": "demo", "messages": [{"role": "user", "content": "z" * 100}],
                "max_tokens": 8}
        never = jsonhttp.call(svc.url + "/v1/chat/completions", chat)
        assert never.status == 400, never.body
        assert never.body["error"]["code"] == "context_length_exceeded"
        assert never.body["error"]["param"] == "messages"
        assert "largest decode instance holds 64" in never.body["error"]["message"]
        register("d0", "decode", 0)  # now full: a request waits (no SLO), until its client goes
        with pytest.raises(OSError, match="timed out"):
            jsonhttp.call(svc.url + "/v1/completions",
                          {"model": "demo", "prompt": "z", "max_tokens": 4}, timeout=1.5)
        wait_for(lambda: len(svc.conductor.queue) == 0, 10, what="the queue to empty")
        assert svc.conductor.bookings._queued.get("p0", {}) == {}
    finally:
        svc.close()


def test_metrics_parse_with_a_hostile_instance_name(conductor: ConductorService) -> None:
    hostile = 'p"0\\n} evil{x="1"} 9\n# TYPE'
    ok = jsonhttp.call(conductor.url + "/v1/instances/register",
                       {"name": hostile, "role": "prefill",
                        "url": f"http://127.0.0.1:{free_port()}", "load": {"running": 3}})
    assert ok.status == 200
    text = jsonhttp.call(conductor.url + "/metrics").body["text"]
    assert value(text, "mooncake_conductor_instance_running", name=hostile, role="prefill") == 3
    assert value(text, "mooncake_conductor_instance_alive", name=hostile, role="prefill") == 1
    assert value(text, "mooncake_conductor_cached_blocks", name=hostile, role="prefill") == 0
    for essential in ("prefix_hit_ratio", "cached_blocks", "evicted_blocks",
                      "kv_bytes_moved"):
        assert helps(text)[f"mooncake_conductor_{essential}"], essential
    assert all(helps(text).values()), "every metric has HELP text"
