"""Bad input at the conductor's door: malformed HTTP framing, OpenAI parameters it cannot honour,
bad registrations, a policy the live workers cannot run. Each gets a clear 4xx (or ConfigError)
and leaves the conductor's state as it was."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import pytest

from mooncake_cli.conductor.bookings import Bookings
from mooncake_cli.conductor.service import ConductorService
from mooncake_cli.config.conductor import ConductorConfig
from mooncake_cli.http import jsonhttp
from mooncake_cli.interfaces import ConfigError
from mooncake_cli.scheduler.estimate import Candidate, Placement
from mooncake_cli.scheduler.scheduler import Decision
from mooncake_cli.scheduler.state import Request
from tests.conftest import free_port


@pytest.fixture(scope="module")
def conductor() -> Iterator[ConductorService]:
    svc = ConductorService(ConductorConfig(port=0, instance_ttl=60.0)).start()
    yield svc
    svc.close()


def raw_request(url: str, head: str, body: bytes = b"") -> tuple[int, str]:
    host, port, _ = jsonhttp.split(url)
    with socket.create_connection((host, port), timeout=5) as s:
        s.sendall(head.encode() + b"\r\n" + body)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    status = int(data.split(b" ", 2)[1])
    return status, data.decode(errors="replace")


@pytest.mark.parametrize("headers", ["Content-Length: abc\r\n", "Content-Length: -5\r\n"])
def test_bad_body_framing(conductor: ConductorService, headers: str) -> None:
    head = f"POST /v1/completions HTTP/1.1\r\nHost: x\r\n{headers}"
    got, text = raw_request(conductor.url, head, b"5\r\n{}\r\n0\r\n\r\n")
    assert got == 400, text
    assert "connection: close" in text.lower()  # the unread body is not taken for a request


def test_a_chunked_body_is_read(conductor: ConductorService) -> None:
    head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n" \
           "Connection: close\r\n"
    parts = (b'{"model', b'": "demo"}')
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"
    got, text = raw_request(conductor.url, head, chunked)
    assert got == 400, text  # the whole body arrived: only its missing prompt is refused
    assert json.loads(text.split("\r\n\r\n", 1)[1])["error"]["param"] == "prompt"


@pytest.mark.parametrize("extra,param", [
    ({"logprobs": 2}, "logprobs"), ({"top_logprobs": 3}, "top_logprobs"),
    ({"echo": True}, "echo"), ({"suffix": "x"}, "suffix"), ({"best_of": 3}, "best_of"),
    ({"n": 2}, "n"), ({"top_p": 0}, "top_p"), ({"ignore_eos": "yes"}, "ignore_eos"),
    ({"seed": 1 << 63}, "seed"), ({"seed": -(1 << 63) - 1}, "seed"),
    ({"prompt": [5, 5000]}, "prompt")])  # the demo's vocabulary has 320 ids
def test_completion_parameters(conductor: ConductorService, extra: dict, param: str) -> None:
    body = {"model": "demo", "prompt": "hi", "max_tokens": 2} | extra
    answer = jsonhttp.call(conductor.url + "/v1/completions", body)
    assert answer.status == 400, answer.body
    assert answer.body["error"]["param"] == param


@pytest.mark.parametrize("extra,param", [
    ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"logprobs": True}, "logprobs"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]},
     "messages[0].content")])
def test_chat_parameters(conductor: ConductorService, extra: dict, param: str) -> None:
    body = {"model": "demo", "messages": [{"role": "user", "content": "hi"}]} | extra
    answer = jsonhttp.call(conductor.url + "/v1/chat/completions", body)
    assert answer.status == 400, answer.body
    assert answer.body["error"]["param"] == param


def test_accepted_parameters_reach_scheduling(conductor: ConductorService) -> None:
    """Harmless values are not refused: the request gets as far as scheduling (no workers)."""
    body = {"model": "demo", "prompt": "hi", "max_tokens": 2, "logprobs": None, "echo": False,
            "best_of": 1, "seed": (1 << 63) - 1, "top_p": 0.5, "ignore_eos": True}
    answer = jsonhttp.call(conductor.url + "/v1/completions", body)
    assert answer.status == 503 and "no live prefill" in answer.body["error"]["message"]
    chat = {"model": "demo", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {}}]}],
        "response_format": {"type": "text"}, "tools": []}
    assert jsonhttp.call(conductor.url + "/v1/chat/completions", chat).status == 503


@pytest.mark.parametrize("url,load", [
    ("http://127.0.0.1", {}), ("http://127.0.0.1:x", {}), ("http://:80", {}),
    ("http://127.0.0.1:{port}", {"total_blocks": "many"}),
    ("http://127.0.0.1:{port}", {"free_blocks": -1}),
    ("http://127.0.0.1:{port}", {"total_blocks": 4, "free_blocks": 9}),
    ("http://127.0.0.1:{port}", {"recent_step_s": "slow"}),
    ("http://127.0.0.1:{port}", {"running": 1.5})])
def test_bad_registrations_change_nothing(conductor: ConductorService, url: str,
                                          load: dict) -> None:
    body = {"name": "d9", "role": "decode", "url": url.format(port=free_port()), "load": load}
    answer = jsonhttp.call(conductor.url + "/v1/instances/register", body)
    assert answer.status == 400, answer.body
    assert jsonhttp.call(conductor.url + "/v1/instances").body["instances"] == []
    assert "d9" not in conductor.conductor.scheduler.cluster.by_name


def test_pipeline_policy_options_are_checked() -> None:
    cfg = ConductorConfig(policy="kvcache-pipeline", max_stages=3, pipeline_chunk=512,
                          pipeline_min_gain=0.1)
    assert cfg.policy_options() == {"max_stages": 3, "chunk_tokens": 512, "min_gain": 0.1}
    assert ConductorConfig(max_stages=0).policy_options() == {}  # another policy: unused
    for bad in ({"max_stages": 0}, {"pipeline_chunk": 0}, {"pipeline_min_gain": 1.0},
                {"pipeline_min_gain": -0.1}):
        with pytest.raises(ConfigError, match="kvcache-pipeline needs"):
            ConductorConfig(policy="kvcache-pipeline", **bad)  # type: ignore[arg-type]
    for bad in ("http://host", "host:port", "http://:80"):
        with pytest.raises(ConfigError, match="HOST:PORT"):
            ConductorConfig(decode=bad)


def test_unbook_releases_pipeline_stages(conductor: ConductorService) -> None:
    """A booking with pipeline stages (kvcache-pipeline's) gives every stage back."""
    cluster = conductor.conductor.scheduler.cluster
    for name in ("s0", "s1", "s2"):
        cluster.add(name, "prefill")
    bookings: Bookings = conductor.conductor.bookings
    try:
        chosen = Candidate("s0", 0.0, 0, 0, None, 0.0, 2.0, 2.0, stages=("s1", "s2"))
        decision = Decision("r1", 0.0, Placement("kvcache-pipeline", chosen), None, None, True)
        sreq = Request("r1", 100, 4, ())
        conductor.conductor.scheduler.commit(decision, sreq, 0.0)
        assert [cluster.by_name[n].queued for n in ("s0", "s1", "s2")] == [1, 1, 1]
        bookings.unbook(decision, sreq)
        assert [cluster.by_name[n].queued for n in ("s0", "s1", "s2")] == [0, 0, 0]
    finally:
        for name in ("s0", "s1", "s2"):
            cluster.remove(name)


def test_etcd_value_that_is_not_an_object_is_skipped(etcd: str) -> None:
    import etcd3gw

    from mooncake_cli.api.registration import PREFIX, parse
    from mooncake_cli.conductor.registry_watch import RegistryWatch

    registry = etcd + "/inputs"
    svc = ConductorService(ConductorConfig(port=0, instance_ttl=60.0)).start()
    host, port = parse(etcd)[0][0]
    client = etcd3gw.client(host=host, port=port)
    try:
        client.put(PREFIX + "inputs/a", json.dumps([1, 2]))
        client.put(PREFIX + "inputs/b", "7")
        client.put(PREFIX + "inputs/c", json.dumps(
            {"name": "p1", "role": "prefill", "url": f"http://127.0.0.1:{free_port()}"}))
        watch = RegistryWatch(svc.conductor.instances, registry).start()
        try:  # the first list raised AttributeError before
            assert watch.ready
            names = [i["name"] for i in svc.conductor.instances.snapshot()]
            assert names == ["p1"]
        finally:
            watch.close()
    finally:
        client.delete_prefix(PREFIX + "inputs/")
        svc.close()
