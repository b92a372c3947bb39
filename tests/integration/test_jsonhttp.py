"""`mooncake_cli.http.jsonhttp`'s sync calls, which run on the background loop's h1pool: from
many threads at once, an event stream left early, a call from the loop's own thread, a forked
child, and `fetch` with bytes and headers. Real loopback sockets against an edge app."""

from __future__ import annotations

import json
import multiprocessing
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from mooncake_cli.http import background, jsonhttp
from mooncake_cli.http.server import Server, body, edge_app, sse

pytestmark = pytest.mark.timeout(60)


async def who(request: Request) -> JSONResponse:
    assert request.client is not None  # the client's port names its connection
    return JSONResponse({"port": request.client.port, "got": json.loads(await body(request))})


async def raw(request: Request) -> Response:
    data = await body(request)
    return Response(request.method.encode() + b" " + request.headers.get("x-tag", "").encode()
                    + b" " + data, media_type="application/octet-stream")


async def stream(request: Request) -> Any:
    async def events() -> AsyncIterator[dict[str, Any] | str]:
        for i in range(3):
            yield {"i": i}
        yield "[DONE]"

    return sse(events())


@pytest.fixture(scope="module")
def edge() -> Iterator[Server]:
    server = Server(edge_app([Route("/who", who, methods=["POST"]),
                              Route("/raw", raw, methods=["PUT"]),
                              Route("/stream", stream, methods=["POST"])]),
                    "127.0.0.1", 0, "test-jsonhttp").start()
    yield server
    server.close()


def test_calls_from_many_threads_share_the_pool(edge: Server) -> None:
    url = f"http://127.0.0.1:{edge.port}/who"
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda i: jsonhttp.call(url, {"i": i}), range(200)))
    assert [a.body["got"] for a in answers] == [{"i": i} for i in range(200)]
    assert len({a.body["port"] for a in answers}) <= 8  # kept alive: one per caller at most


def test_an_event_stream_left_early_leaves_the_client_usable(edge: Server) -> None:
    base = f"http://127.0.0.1:{edge.port}"
    for event in jsonhttp.events(base + "/stream", {}):
        assert event == {"i": 0}
        break
    assert list(jsonhttp.events(base + "/stream", {})) == [{"i": 0}, {"i": 1}, {"i": 2}]
    assert jsonhttp.call(base + "/who", {"after": True}).body["got"] == {"after": True}


def test_a_sync_call_on_the_loops_own_thread_is_refused(edge: Server) -> None:
    url = f"http://127.0.0.1:{edge.port}/who"

    async def inside() -> jsonhttp.Answer:
        return jsonhttp.call(url, {})

    with pytest.raises(RuntimeError, match="wait on itself"):
        background.submit(inside)


def _child(url: str, out: Any) -> None:
    out.put(jsonhttp.call(url, {"child": True}).body["got"])


def test_a_forked_child_gets_a_loop_of_its_own(edge: Server) -> None:
    url = f"http://127.0.0.1:{edge.port}/who"
    assert jsonhttp.call(url, {"parent": True}).status == 200  # the parent's loop is running
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    child = ctx.Process(target=_child, args=(url, out))
    child.start()
    assert out.get(timeout=30) == {"child": True}
    child.join(30)
    assert child.exitcode == 0


def test_fetch_sends_bytes_and_headers_and_returns_bytes(edge: Server) -> None:
    reply = jsonhttp.fetch(f"http://127.0.0.1:{edge.port}/raw", "PUT", b"\x00\xffdata", 5.0,
                           {"X-Tag": "t1"})
    assert (reply.status, reply.data) == (200, b"PUT t1 \x00\xffdata")
    assert reply.headers["Content-Type"] == "application/octet-stream"


def test_a_url_that_is_not_http_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="not an http://HOST:PORT URL"):
        jsonhttp.call("https://127.0.0.1:1/x")
