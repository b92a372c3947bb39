"""The HTTP edge of the conductor and the workers: the official `openai` client (sync and async,
streaming and not) against a conductor with real in-process workers; hostile bodies (deep,
lone surrogates, oversized, chunked, slow) get 4xx and never 500, at every endpoint; idle and
silent connections are closed; SSE answers keep the connection."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from mooncake_cli.conductor.service import ConductorService
from mooncake_cli.config.conductor import ConductorConfig
from mooncake_cli.config.worker import WorkerConfig
from mooncake_cli.http.server import Limits, Server, body, edge_app
from mooncake_cli.worker.decode import DecodeWorker
from mooncake_cli.worker.prefill import PrefillWorker
from tests.conftest import wait_for
from tests.helpers.prom import helps, value

pytestmark = pytest.mark.timeout(180)
DEEP = b'{"model": "demo", "prompt": ' + b"[" * 10000 + b"]" * 10000 + b"}"
WORKER_POSTS = ("/v1/prefill", "/v1/kv/reserve", "/v1/generate", "/v1/kv/release")


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[ConductorService, PrefillWorker, DecodeWorker]]:
    prefill = PrefillWorker(WorkerConfig(role="prefill", name='p"0\n} x{', block_size=16))
    decode = DecodeWorker(WorkerConfig(role="decode", block_size=16, kv_blocks=64))
    with prefill, decode:
        svc = ConductorService(ConductorConfig(port=0, prefill=(prefill.url,),
                                               decode=(decode.url,))).start()
        try:
            yield svc, prefill, decode
        finally:
            svc.close()


def test_sync_openai_client_streaming_and_not(cluster) -> None:
    svc, _, _ = cluster
    client = openai.OpenAI(base_url=svc.url + "/v1", api_key="none", max_retries=0, timeout=60)
    done = client.completions.create(model="demo", prompt="hello", max_tokens=5, seed=3,
                                     extra_body={"ignore_eos": True})
    assert done.usage is not None and done.usage.completion_tokens == 5
    chunks = list(client.completions.create(model="demo", prompt="hello", max_tokens=5, seed=3,
                                            stream=True, extra_body={"ignore_eos": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == done.choices[0].text
    chat = client.chat.completions.create(model="demo", max_tokens=4, temperature=0,
                                          messages=[{"role": "user", "content": "hi"}],
                                          user="someone", presence_penalty=0, logit_bias={})
    assert chat.choices[0].message.role == "assistant"
    streamed = client.chat.completions.create(
        model="demo", max_tokens=4, temperature=0, stream=True,
        stream_options={"include_usage": True}, messages=[{"role": "user", "content": "hi"}])
    parts = list(streamed)
    assert "".join(p.choices[0].delta.content or "" for p in parts if p.choices) == \
        chat.choices[0].message.content
    assert parts[-1].usage is not None and parts[-1].usage.completion_tokens >= 1


def test_async_openai_client_in_memory(cluster) -> None:
    svc, _, _ = cluster

    async def run() -> tuple[str, str]:
        transport = httpx.ASGITransport(app=svc.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://edge") as http:
            client = openai.AsyncOpenAI(base_url="http://edge/v1", api_key="none",
                                        http_client=http, max_retries=0)
            done = await client.completions.create(model="demo", prompt="abc", max_tokens=4,
                                                   temperature=0,
                                                   extra_body={"ignore_eos": True})
            text = ""
            async for c in await client.completions.create(
                    model="demo", prompt="abc", max_tokens=4, temperature=0, stream=True,
                    extra_body={"ignore_eos": True}):
                text += c.choices[0].text if c.choices else ""
            await svc.conductor.close_peer()
            return done.choices[0].text, text

    whole, streamed = asyncio.run(run())
    assert whole == streamed and whole


@pytest.mark.parametrize("field,bad", [
    ("presence_penalty", "high"), ("frequency_penalty", 3), ("logit_bias", {"5": 500}),
    ("user", 5), ("presence_penalty", 0.5), ("logit_bias", {"5": 1}), ("bogus", 1)])
def test_penalties_bias_user_are_typed_and_unknown_fields_named(cluster, field: str,
                                                                bad: Any) -> None:
    svc, _, _ = cluster
    client = openai.OpenAI(base_url=svc.url + "/v1", api_key="none", max_retries=0, timeout=30)
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="demo", prompt="x", max_tokens=2,
                                  extra_body={field: bad})
    assert e.value.body["param"] == field  # type: ignore[index]


def _posts(cluster) -> list[tuple[str, Any]]:
    svc, prefill, decode = cluster
    return [(path, svc.app) for path in ("/v1/completions", "/v1/chat/completions",
                                         "/v1/instances/register")] + \
        [("/v1/prefill", prefill.app)] + [(p, decode.app) for p in WORKER_POSTS[1:]]


def test_hostile_bodies_are_4xx_everywhere(cluster) -> None:
    bodies = [DEEP, b'{"model": "demo", "prompt": "\\ud800", "request_id": "\\ud800"}',
              b'{"model": "demo", "messages": [{"role": "user", "content": "\\udfff"}]}',
              b"{bad", b"[1, 2]", b"\xff\xfe", b"", b"null", b'{"a": ' * 300 + b"1" + b"}" * 300]

    async def run() -> list[tuple[str, int, dict[str, Any]]]:
        got = []
        for path, app in _posts(cluster):
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                         base_url="http://edge") as http:
                for raw in bodies:
                    r = await http.post(path, content=raw)
                    got.append((path, r.status_code, r.json()))
                huge = await http.post(path, content=b" " * ((8 << 20) + 1))
                got.append((path, huge.status_code, huge.json()))
        return got

    for path, status, answer in asyncio.run(run()):
        assert 400 <= status < 500, (path, status, answer)
        assert answer["error"]["message"], (path, answer)


def test_worker_and_conductor_metrics_parse(cluster) -> None:
    svc, prefill, decode = cluster
    for url, prefix in ((svc.url, "mooncake_conductor_"), (prefill.url, "mooncake_worker_"),
                        (decode.url, "mooncake_worker_")):
        text = httpx.get(url + "/metrics").text
        families = helps(text)
        assert all(families.values()), "every metric has HELP text"
        essentials = ("prefix_hit_ratio", "cached_blocks", "evicted_blocks", "kv_bytes_moved") \
            if "conductor" in prefix else ("prefix_hit_ratio", "kv_used_bytes",
                                           "prefix_evictions", "kv_bytes_sent")
        for name in essentials:
            assert prefix + name in families, (url, name)
    text = httpx.get(svc.url + "/metrics").text
    assert value(text, "mooncake_conductor_instance_alive", name=prefill.name,
                 role="prefill") == 1


def _edge(limits: Limits) -> Server:
    async def echo(request: Request) -> JSONResponse:
        return JSONResponse({"bytes": len(await body(request))})

    return Server(edge_app([Route("/echo", echo, methods=["POST"])], limits), "127.0.0.1", 0,
                  "test-edge").start()


def _read_all(s: socket.socket) -> bytes:
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    return data


def test_slow_bodies_408_and_silent_connections_closed() -> None:
    server = _edge(Limits(body_timeout=0.5, header_timeout=0.5, idle_timeout=1.0,
                          max_body=1000))
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
            s.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n12")
            assert b" 408 " in _read_all(s).split(b"\r\n", 1)[0]
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
            start = time.monotonic()
            s.sendall(b"POST /echo HTTP/1.1\r\n")  # headers that never end
            assert _read_all(s) == b"" and time.monotonic() - start < 3
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
            start = time.monotonic()
            assert _read_all(s) == b"" and time.monotonic() - start < 3  # never said a word
        too_big = httpx.post(f"http://127.0.0.1:{server.port}/echo", content=iter([b"x" * 600,
                                                                                   b"y" * 600]))
        assert too_big.status_code == 413 and "over 1000" in too_big.json()["error"]["message"]
    finally:
        server.close()


def test_headers_over_the_limit_get_431_and_bodies_never_count_as_headers() -> None:
    server = _edge(Limits(max_header=16 << 10, max_body=1 << 20))
    try:
        url = f"http://127.0.0.1:{server.port}/echo"
        assert httpx.post(url, content=b"x", headers={"x-pad": "p" * (12 << 10)}).json() == \
            {"bytes": 1}
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
            s.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\n")
            for _ in range(40):  # a header trickled in pieces, past the limit
                try:
                    s.sendall(b"x-pad: " + b"p" * 1000 + b"\r\n")
                except OSError:  # refused and closed
                    break
            assert _read_all(s).startswith(b"HTTP/1.1 431 ")
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
            size = 600 << 10  # the first is answered (404) before its body is read
            s.sendall(b"POST /nowhere HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
                      b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n"
                      b"Connection: close\r\n\r\n%s" % (size, b"z" * size, size, b"z" * size))
            answers = _read_all(s)
        assert answers.startswith(b"HTTP/1.1 404 "), answers[:200]
        assert answers.count(b"HTTP/1.1 ") == 2 and b"HTTP/1.1 200 " in answers, answers
        assert answers.endswith(b'{"bytes":%d}' % size), answers[-200:]
    finally:
        server.close()


def test_keep_alive_holds_across_json_and_sse(cluster) -> None:
    svc, _, _ = cluster
    peers: set[Any] = set()
    with httpx.Client(base_url=svc.url, timeout=60) as http:
        for stream in (False, True, False, True):
            r = http.post("/v1/completions", json={"model": "demo", "prompt": "k",
                                                   "max_tokens": 2, "stream": stream,
                                                   "ignore_eos": True})  # sampled: EOS may come
            assert r.status_code == 200, r.text
            if stream:
                assert r.text.rstrip().endswith("data: [DONE]")
            else:
                assert json.loads(r.text)["usage"]["completion_tokens"] == 2
            peers.add(r.extensions["network_stream"].get_extra_info("client_addr"))
    assert len(peers) == 1, "one connection served every answer"


def test_background_tasks_run_on_the_server_loop_and_stop_with_it() -> None:
    """A Server's background tasks run on its event loop while it serves; closing it cancels
    them (the conductor's poller is one)."""
    seen: dict[str, Any] = {"ticks": 0, "cancelled": False}

    async def ticker() -> None:
        seen["loop"] = asyncio.get_running_loop()
        try:
            while True:
                seen["ticks"] += 1
                await asyncio.sleep(0.01)  # sleep: pace - the ticker's period
        except asyncio.CancelledError:
            seen["cancelled"] = True
            raise

    server = Server(edge_app([], Limits()), "127.0.0.1", 0, "test-background",
                    background=[ticker]).start()
    try:
        wait_for(lambda: seen["ticks"] >= 5, 10, what="five ticks of the background task")
        assert seen["loop"] is server.loop
        assert httpx.get(f"http://127.0.0.1:{server.port}/nowhere").status_code == 404
    finally:
        server.close()
    assert seen["cancelled"]
