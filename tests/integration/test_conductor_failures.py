"""The conductor when its workers misbehave: a prefill that breaks off its answer, a decode
worker that fails mid-generation, an instance that leaves between scheduling and sending. The
misbehaving workers are thin HTTP stand-ins (a real worker cannot be made to fail on cue), named
as such; the conductor under test is the real one.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from mooncake_cli.conductor.service import ConductorService
from mooncake_cli.config.conductor import ConductorConfig
from mooncake_cli.http import jsonhttp
from mooncake_cli.http.server import Server, body, edge_app, sse
from tests.conftest import free_port
from tests.helpers.prom import value


def stand_in_worker(app: dict[str, Any]) -> Starlette:
    """A prefill+decode stand-in: prefill answers at once; generate sends `app["events"]` (a
    decode that fails mid-answer), streamed or (stream false) in one answer, as a decode
    worker does. It records the sampling the conductor sent."""

    async def prefill(request: Request) -> JSONResponse:
        got = json.loads(await body(request))
        app["sampling"] = got["sampling"]
        return JSONResponse({"request_id": got["request_id"], "first_token": 65,
                             "prompt_tokens": len(got["token_ids"]), "cached_tokens": 0,
                             "stored_keys": []})

    async def generate(request: Request) -> Response:
        async def events() -> AsyncIterator[dict[str, Any] | str]:
            for ev in list(app["events"]):
                yield ev

        got = json.loads(await body(request))
        app.setdefault("resumed", []).append((got.get("resume") or {}).get("sent_chars", 0))
        if not got.get("stream", True):
            return JSONResponse({"events": [e for e in app["events"] if isinstance(e, dict)]})
        return sse(events())

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"}, 200 if app.get("healthy", True) else 503)

    return edge_app([Route("/v1/prefill", prefill, methods=["POST"]),
                     Route("/v1/generate", generate, methods=["POST"]),
                     Route("/health", health)])


@pytest.fixture
def stand_in() -> Iterator[tuple[Server, dict[str, Any]]]:
    app: dict[str, Any] = {"events": []}
    server = Server(stand_in_worker(app), "127.0.0.1", 0, "stand-in").start()
    yield server, app
    server.close()


@pytest.fixture
def conductor() -> Iterator[ConductorService]:
    svc = ConductorService(ConductorConfig(port=0, instance_ttl=60.0, retries=1)).start()
    yield svc
    svc.close()


def register(svc: ConductorService, name: str, role: str, url: str, blocks: int = 64) -> None:
    load = {"running": 0, "waiting": 0, "free_blocks": blocks, "total_blocks": blocks}
    ok = jsonhttp.call(svc.url + "/v1/instances/register",
                       {"name": name, "role": role, "url": url, "load": load})
    assert ok.status == 200, ok.body


def alive(svc: ConductorService) -> dict[str, bool]:
    return {i["name"]: i["alive"] for i in
            jsonhttp.call(svc.url + "/v1/instances").body["instances"]}


def assert_nothing_booked(svc: ConductorService) -> None:
    assert all(not q for q in svc.conductor.bookings._queued.values())
    for inst in svc.conductor.scheduler.cluster.by_name.values():
        assert inst.queued == 0 and inst.booked_requests == 0 and inst.booked_tokens == 0, inst


def test_decode_failing_mid_answer_moves_then_is_503_not_a_finished_answer(
        conductor, stand_in) -> None:
    server, app = stand_in
    url = f"http://127.0.0.1:{server.port}"
    register(conductor, "p0", "prefill", url)
    register(conductor, "d0", "decode", url)
    body = {"model": "demo", "prompt": "hello", "max_tokens": 10}
    app["events"] = [{"token": 65, "text": "A"},
                     {"finish_reason": "error", "error": "engine step failed",
                      "completion_tokens": 1}, "[DONE]"]
    # the stand-in fails every answer but still answers /health: the answer moves (to the
    # only decode instance there is) until the limit, then 503 naming the last failure
    answer = jsonhttp.call(conductor.url + "/v1/completions", body)
    assert answer.status == 503, answer.body
    message = answer.body["error"]["message"]
    assert "engine step failed" in message and "moved 3 times" in message
    assert app["resumed"] == [0, 1, 2, 3]  # each move resumed after the tokens streamed
    streamed = list(jsonhttp.events(conductor.url + "/v1/completions", body | {"stream": True}))
    assert "engine step failed" in streamed[-1]["error"]["message"]
    assert all(c.get("choices", [{}])[0].get("finish_reason") != "error"
               for c in streamed if c.get("choices"))
    assert alive(conductor) == {"p0": True, "d0": True}  # it answered /health: not dead
    # the answer ends without its final event and the worker no longer answers /health: dead,
    # and with no other decode instance to move to, 503
    app["events"] = [{"token": 65, "text": "A"}]
    app["healthy"] = False
    broken = jsonhttp.call(conductor.url + "/v1/completions", body)
    assert broken.status == 503 and "no live decode instance" in broken.body["error"]["message"]
    assert alive(conductor) == {"p0": True, "d0": False}
    metrics = jsonhttp.call(conductor.url + "/metrics").body["text"]
    assert value(metrics, "mooncake_conductor_errors_total") == 2
    assert value(metrics, "mooncake_conductor_migrations_total") == 7
    assert_nothing_booked(conductor)


def test_chat_without_max_tokens_may_use_the_context(conductor, stand_in) -> None:
    server, app = stand_in
    url = f"http://127.0.0.1:{server.port}"
    register(conductor, "p0", "prefill", url)
    register(conductor, "d0", "decode", url, blocks=1024)  # 16384 tokens of KV
    app["events"] = [{"token": 65, "text": "A"}, {"finish_reason": "stop"}, "[DONE]"]
    chat = {"model": "demo", "messages": [{"role": "user", "content": "hi"}]}
    answer = jsonhttp.call(conductor.url + "/v1/chat/completions", chat)
    assert answer.status == 200, answer.body
    assert answer.body["choices"][0]["message"]["content"] == "A"
    prompt = answer.body["usage"]["prompt_tokens"]
    assert app["sampling"]["max_tokens"] == 8192 - prompt  # demo context 8192: what is left
    register(conductor, "d0", "decode", url, blocks=8)  # 128 tokens: what is left of them
    assert jsonhttp.call(conductor.url + "/v1/chat/completions", chat).status == 200
    assert app["sampling"]["max_tokens"] == 128 - prompt
    jsonhttp.call(conductor.url + "/v1/completions", {"model": "demo", "prompt": "hi"})
    assert app["sampling"]["max_tokens"] == 16  # completions keep OpenAI's default


def broken_prefill() -> tuple[str, threading.Thread, socket.socket]:
    """A prefill stand-in that promises 100 bytes of answer and sends one."""
    sock = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        try:
            conn, _ = sock.accept()
        except OSError:
            return
        with conn:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return f"http://127.0.0.1:{sock.getsockname()[1]}", thread, sock


def test_a_prefill_answer_cut_short_reroutes_and_leaks_no_booking(conductor) -> None:
    url, thread, sock = broken_prefill()
    try:
        register(conductor, "p0", "prefill", url)
        register(conductor, "d0", "decode", f"http://127.0.0.1:{free_port()}")
        answer = jsonhttp.call(conductor.url + "/v1/completions",
                               {"model": "demo", "prompt": "hello", "max_tokens": 2})
        assert answer.status == 503, answer.body  # not 500
        assert "no live prefill instance" in answer.body["error"]["message"]  # p0 was dropped
        assert alive(conductor) == {"p0": False, "d0": True}
        assert_nothing_booked(conductor)
    finally:
        sock.close()
        thread.join(timeout=5)


def test_a_decode_gone_from_the_registry_does_not_kill_the_prefill(conductor, stand_in) -> None:
    server, _ = stand_in
    register(conductor, "p0", "prefill", f"http://127.0.0.1:{server.port}")
    conductor.conductor.scheduler.cluster.add("ghost", "decode")  # scheduled, not registered
    answer = jsonhttp.call(conductor.url + "/v1/completions",
                           {"model": "demo", "prompt": "hello", "max_tokens": 2})
    assert answer.status == 503 and "tried ghost" in answer.body["error"]["message"]
    assert alive(conductor) == {"p0": True}
    assert_nothing_booked(conductor)
