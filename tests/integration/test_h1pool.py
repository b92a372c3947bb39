"""`mooncake_cli.http.h1pool` (and `jsonhttp.AsyncPeer` on it) over real loopback sockets: a uvicorn
edge app for well-behaved answers, raw `asyncio` servers writing hand-made bytes for peers that
misbehave. Keep-alive reuse and its limits (Connection: close, keepalive_s, idle connections the
server closed), the per-host bound and its pool timeout, the read timeout, connect failures,
answers that are not HTTP or are over the bounds, streamed chunked bodies, bodies cut short."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from typing import Any

import pytest
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from mooncake_cli.api.errors import ErrorCode, ServingError
from mooncake_cli.http import h1pool
from mooncake_cli.http.h1pool import PeerFailed, Pool
from mooncake_cli.http.jsonhttp import AsyncPeer, PeerError
from mooncake_cli.http.server import Server, body, edge_app, sse
from tests.conftest import async_wait_for

pytestmark = pytest.mark.timeout(60)
HOST = "127.0.0.1"
OK = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok"


def run(coro: Coroutine[Any, Any, Any], limit: float = 10.0) -> Any:
    """The coroutine on a fresh event loop, failing (not hanging) after `limit` seconds."""
    async def bounded() -> Any:
        return await asyncio.wait_for(coro, limit)
    return asyncio.run(bounded())


# ---------------------------------------------------------------- a real uvicorn edge app


async def who(request: Request) -> JSONResponse:
    assert request.client is not None  # the client's port names its connection
    return JSONResponse({"port": request.client.port})


async def close_after(request: Request) -> JSONResponse:
    assert request.client is not None
    return JSONResponse({"port": request.client.port}, headers={"Connection": "close"})


async def echo(request: Request) -> JSONResponse:
    data = json.loads(await body(request))
    return JSONResponse({"got": data}, headers={"X-Echo": "yes"})


async def stream(request: Request) -> Any:
    n = json.loads(await body(request))["n"]

    async def events() -> Any:
        for i in range(n):
            await asyncio.sleep(0.02)  # sleep: pace - events a while apart
            yield {"i": i}
        yield "[DONE]"
    return sse(events())


async def refuse(request: Request) -> JSONResponse:
    raise ServingError(ErrorCode.INVALID_REQUEST, "no such thing", param="what")


@pytest.fixture(scope="module")
def edge() -> Iterator[Server]:
    app = edge_app([Route("/who", who), Route("/close", close_after),
                    Route("/echo", echo, methods=["POST"]),
                    Route("/stream", stream, methods=["POST"]),
                    Route("/refuse", refuse, methods=["POST"])])
    server = Server(app, HOST, 0, "h1pool-test").start()
    deadline = time.monotonic() + 10
    while True:  # serving once a request gets an answer
        try:
            with socket.create_connection((HOST, server.port), timeout=1) as s:
                s.sendall(b"GET /who HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                if s.recv(64).startswith(b"HTTP/1.1 200"):
                    break
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError("the edge app did not start")
        time.sleep(0.05)  # sleep: poll
    try:
        yield server
    finally:
        server.close()


async def get(pool: Pool, port: int, target: str = "/", read_s: float = 2.0,
              pool_s: float = 2.0) -> tuple[int, bytes]:
    resp = await pool.send("GET", HOST, port, target, b"", None, connect_s=2, read_s=read_s,
                           pool_s=pool_s)
    try:
        return resp.status, await resp.read()
    finally:
        resp.release()


async def port_of(pool: Pool, port: int, target: str = "/who") -> int:
    status, data = await get(pool, port, target)
    assert status == 200
    return int(json.loads(data)["port"])


# ---------------------------------------------------------------- raw servers


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]


class Raw:
    """A raw TCP server on 127.0.0.1 running `handler(reader, writer, n)` for its n-th accepted
    connection (counted in `accepted`); the connection is closed when the handler returns."""

    def __init__(self, handler: Handler) -> None:
        self.handler, self.accepted, self.port = handler, 0, 0
        self.writers: list[asyncio.StreamWriter] = []
        self.tasks: list[asyncio.Task[Any]] = []
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> Raw:
        self.server = await asyncio.start_server(self._on, HOST, 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def _on(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        self.writers.append(writer)
        task = asyncio.current_task()
        assert task is not None
        self.tasks.append(task)
        try:
            await self.handler(reader, writer, self.accepted)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass  # a handler cancelled at the end returns quietly
        finally:
            writer.close()

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for w in self.writers:
            w.close()
        await asyncio.sleep(0)  # sleep: pace - the closes run; nothing is asserted after


async def request(reader: asyncio.StreamReader) -> bytes | None:
    """One request's head (and its body read past), or None at a clean end of the stream."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            await reader.readexactly(int(line.split(b":", 1)[1]))
    return head


async def keep_answering(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                         n: int) -> None:
    while await request(reader) is not None:
        writer.write(OK)
        await writer.drain()


def free_port() -> int:
    """A port nothing listens on."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


# ---------------------------------------------------------------- 1-4: keep-alive


def test_sequential_calls_reuse_one_connection(edge: Server) -> None:
    async def main() -> set[int]:
        pool = Pool()
        ports = {await port_of(pool, edge.port) for _ in range(50)}
        assert pool._count == 1 and len(pool._idle[(HOST, edge.port)]) == 1
        await pool.close()
        return ports

    assert len(run(main())) == 1  # the server saw one client port: one connection


def test_concurrent_workers_use_at_most_one_connection_each(edge: Server) -> None:
    async def main() -> tuple[set[int], int]:
        pool = Pool()

        async def worker() -> list[int]:
            return [await port_of(pool, edge.port) for _ in range(20)]

        got = await asyncio.gather(*(worker() for _ in range(8)))
        count = pool._count
        await pool.close()
        assert all(len(ports) == 20 for ports in got)
        return {p for ports in got for p in ports}, count

    ports, count = run(main())
    assert 1 <= len(ports) <= 8 and count == len(ports)


def test_raw_server_counts_one_connection_for_many_calls() -> None:
    async def main() -> None:
        async with Raw(keep_answering) as srv:
            pool = Pool()
            for _ in range(50):
                assert await get(pool, srv.port) == (200, b"ok")
            assert srv.accepted == 1

            async def worker() -> None:
                for _ in range(20):
                    assert await get(pool, srv.port) == (200, b"ok")

            await asyncio.gather(*(worker() for _ in range(8)))
            assert srv.accepted <= 8
            await pool.close()

    run(main())


def test_connection_close_answer_is_not_reused(edge: Server) -> None:
    async def main() -> list[int]:
        pool = Pool()
        ports = [await port_of(pool, edge.port, "/close") for _ in range(5)]
        assert pool._count == 0 and not pool._idle.get((HOST, edge.port))
        await pool.close()
        return ports

    assert len(set(run(main()))) == 5  # five connections, each answered


def test_idle_connection_past_keepalive_is_not_reused(edge: Server) -> None:
    async def main() -> None:
        pool = Pool(keepalive_s=0.2)
        first = await port_of(pool, edge.port)
        assert await port_of(pool, edge.port) == first  # within keepalive_s: kept
        await asyncio.sleep(0.35)  # sleep: behaviour - keepalive_s (0.2 s) runs out
        later = await port_of(pool, edge.port)
        assert later != first
        assert pool._count == 1  # the stale one was closed, not kept open beside the new one
        await pool.close()

    run(main())


def test_idle_connection_closed_by_the_server_is_dropped() -> None:
    hang_up = asyncio.Event()

    async def answer_then_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                                n: int) -> None:
        await request(reader)
        writer.write(OK)  # keep-alive by HTTP/1.1's default, then closed while idle
        await writer.drain()
        if n == 1:
            await hang_up.wait()

    async def main() -> None:
        async with Raw(answer_then_close) as srv:
            pool = Pool(per_host=1)
            assert await get(pool, srv.port) == (200, b"ok")
            assert pool._count == 1 and len(pool._idle[(HOST, srv.port)]) == 1
            hang_up.set()  # the server closes it: forgotten, uncounted
            await async_wait_for(lambda: pool._count == 0, 10, what="the closed one dropped")
            assert not pool._idle[(HOST, srv.port)]
            assert pool._open == {}
            assert await get(pool, srv.port) == (200, b"ok")
            assert srv.accepted == 2
            await pool.close()

    run(main())


def test_idle_connection_whose_transport_closed_unnoticed_is_not_used() -> None:
    """uvloop closes a transport (the peer reset it) before the protocol hears of it: such an
    idle connection is dropped, not written to (uvloop raises RuntimeError for that, which
    broke a conductor's stream when a decode worker was killed)."""
    import uvloop

    async def main() -> None:
        async with Raw(keep_answering) as srv:
            pool = Pool()
            assert await get(pool, srv.port) == (200, b"ok")
            [idle] = pool._idle[(HOST, srv.port)]
            assert idle.transport is not None
            idle.transport.close()  # no await since: connection_lost has not run yet
            assert await get(pool, srv.port) == (200, b"ok")
            assert srv.accepted == 2
            await pool.close()

    loop = uvloop.new_event_loop()
    try:
        loop.run_until_complete(asyncio.wait_for(main(), 10))
    finally:
        loop.close()


# ---------------------------------------------------------------- 5: the per-host bound


def test_per_host_bound_waits_then_times_out_then_proceeds() -> None:
    go = [asyncio.Event(), asyncio.Event()]  # one per connection: let it answer

    async def held(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        while await request(reader) is not None:
            await go[n - 1].wait()
            writer.write(OK)
            await writer.drain()

    async def main() -> None:
        async with Raw(held) as srv:
            pool = Pool(per_host=2)
            a = asyncio.create_task(get(pool, srv.port, read_s=5))
            b = asyncio.create_task(get(pool, srv.port, read_s=5))
            await async_wait_for(lambda: srv.accepted == 2, 10, what="two connections")
            assert pool._count == 2
            t0 = time.monotonic()
            with pytest.raises(TimeoutError, match="no free connection"):
                await get(pool, srv.port, pool_s=0.3)
            assert 0.25 <= time.monotonic() - t0 < 1.5
            assert srv.accepted == 2  # it never connected

            c = asyncio.create_task(get(pool, srv.port, pool_s=3))
            await async_wait_for(lambda: len(pool._waiters) == 1, 10, what="c waiting for room")
            assert not c.done()
            go[0].set()  # one answer: its connection goes back, and c takes it
            assert await a == (200, b"ok")
            assert await asyncio.wait_for(c, 2) == (200, b"ok")
            assert srv.accepted == 2 and not b.done()
            go[1].set()
            assert await b == (200, b"ok")
            assert pool._count == 2
            await pool.close()

    run(main())


def test_total_bound_counts_failed_and_released_connections() -> None:
    async def main() -> None:
        async with Raw(keep_answering) as srv:
            pool = Pool(per_host=1)
            dead = free_port()
            for _ in range(3):  # failed connects give their place back
                with pytest.raises(PeerFailed):
                    await get(pool, dead, pool_s=0.2)
            assert pool._open == {} and pool._count == 0
            assert await get(pool, srv.port) == (200, b"ok")
            await pool.close()

    run(main())


# ---------------------------------------------------------------- 6-7: timeouts, connects


def test_read_timeout_waiting_for_headers() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await request(reader)
        await asyncio.sleep(10)  # sleep: behaviour - no answer: the read times out

    async def main() -> None:
        async with Raw(silent) as srv:
            pool = Pool(per_host=1)
            t0 = time.monotonic()
            with pytest.raises(TimeoutError, match=f"127.0.0.1:{srv.port}"):
                await get(pool, srv.port, read_s=0.3)
            spent = time.monotonic() - t0
            assert 0.25 <= spent < 2.3
            assert pool._count == 0 and pool._open == {}  # the connection was closed
            await pool.close()

    run(main())


def test_read_timeout_between_body_bytes() -> None:
    async def stalls(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
        await writer.drain()
        await asyncio.sleep(10)  # sleep: behaviour - the body stalls: the read times out

    async def main() -> None:
        async with Raw(stalls) as srv:
            pool = Pool()
            resp = await pool.send("GET", HOST, srv.port, "/", b"", None, 2, 0.3, 2)
            assert resp.status == 200
            t0 = time.monotonic()
            with pytest.raises(TimeoutError):
                await resp.read()
            assert 0.25 <= time.monotonic() - t0 < 2.3
            resp.release()
            assert pool._count == 0 and not pool._idle.get((HOST, srv.port))
            await pool.close()

    run(main())


def test_connect_failure_names_the_url() -> None:
    async def main() -> None:
        pool = Pool()
        port = free_port()
        with pytest.raises(PeerFailed) as e:
            await get(pool, port)
        assert isinstance(e.value, OSError)
        assert f"http://127.0.0.1:{port}" in str(e.value) and "cannot connect" in str(e.value)
        assert pool._count == 0 and pool._open == {}
        await pool.close()

    run(main())


# ---------------------------------------------------------------- 8: not HTTP, over bounds


def writes(data: bytes, then_wait: float = 1.0) -> Handler:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                      n: int) -> None:
        await request(reader)
        writer.write(data)
        await writer.drain()
        await asyncio.sleep(then_wait)  # sleep: behaviour - held open: no EOF to blame
    return handler


def test_garbage_is_peer_failed() -> None:
    async def main() -> None:
        async with Raw(writes(b"SSH-2.0-OpenSSH_9.6\r\nnot http at all\r\n\r\n")) as srv:
            pool = Pool()
            with pytest.raises(PeerFailed, match="not an HTTP/1.1 answer"):
                await get(pool, srv.port)
            assert pool._count == 0
            await pool.close()

    run(main())


def test_headers_over_max_header_are_peer_failed() -> None:
    big = b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * 3000 + b"\r\nContent-Length: 2\r\n\r\nok"
    small = b"HTTP/1.1 200 OK\r\nX-Small: " + b"a" * 500 + b"\r\nContent-Length: 2\r\n\r\nok"

    async def main() -> None:
        async with Raw(writes(big)) as srv, Raw(writes(small)) as fine:
            pool = Pool(max_header=1024)
            with pytest.raises(PeerFailed):
                await get(pool, srv.port)
            assert pool._count == 0
            assert await get(pool, fine.port) == (200, b"ok")  # under the bound: answered
            await pool.close()

    run(main())


def test_headers_over_max_header_say_so() -> None:
    """h1pool raises PeerFailed("... headers over N bytes") inside httptools' on_header
    callback, but httptools turns that into HttpParserCallbackError, which h1pool reports as
    "not an HTTP/1.1 answer: `on_header_field` callback error": the reason is lost."""
    big = b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * 3000 + b"\r\nContent-Length: 2\r\n\r\nok"

    async def main() -> None:
        async with Raw(writes(big)) as srv:
            pool = Pool(max_header=1024)
            with pytest.raises(PeerFailed, match="headers over 1024 bytes"):
                await get(pool, srv.port)
            await pool.close()

    run(main())


def test_body_over_max_body_is_peer_failed() -> None:
    async def main() -> None:
        answer = b"HTTP/1.1 200 OK\r\nContent-Length: 5000\r\n\r\n" + b"x" * 5000
        async with Raw(writes(answer)) as srv:
            pool = Pool(max_body=1000)
            resp = await pool.send("GET", HOST, srv.port, "/", b"", None, 2, 2, 2)
            with pytest.raises(PeerFailed, match="over 1000 bytes"):
                await resp.read()
            resp.release()  # closed, or kept when the whole answer was parsed: never leaked
            assert pool._count == len(pool._idle.get((HOST, srv.port), []))
        async with Raw(writes(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n" + b"x" * 1000)
                       ) as srv:
            assert await get(pool, srv.port) == (200, b"x" * 1000)  # at the bound: whole
            await pool.close()

    run(main())


def test_chunked_body_over_max_body_in_small_chunks() -> None:
    async def many(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for _ in range(30):
            writer.write(b"64\r\n" + b"y" * 100 + b"\r\n")
            await writer.drain()
            await asyncio.sleep(0.01)  # sleep: pace - small chunks a while apart
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(1)  # sleep: behaviour - held open: no EOF to blame

    async def main() -> None:
        async with Raw(many) as srv:
            pool = Pool(max_body=1000)
            with pytest.raises(PeerFailed, match="over 1000 bytes"):
                await get(pool, srv.port)
            assert pool._count == 0
            await pool.close()

    run(main())


# ---------------------------------------------------------------- 9-10: bodies in pieces


def test_chunked_answer_streams_in_order_and_the_connection_is_reused() -> None:
    pieces = [b"first,", b"second,", b"third,", b"fourth"]
    taken = asyncio.Event()  # the client got a piece: only then is the next one written

    async def chunked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                      n: int) -> None:
        await request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for piece in pieces:
            taken.clear()
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            await writer.drain()
            await taken.wait()  # a client that waited for the whole body would time out
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        await keep_answering(reader, writer, n)

    async def main() -> None:
        async with Raw(chunked) as srv:
            pool = Pool()
            resp = await pool.send("GET", HOST, srv.port, "/", b"", None, 2, 1.0, 2)
            assert resp.status == 200 and resp.headers["Transfer-Encoding"] == "chunked"
            got = []
            async for chunk in resp.chunks():
                got.append(chunk)
                taken.set()
            resp.release()
            assert got == pieces  # each piece on its own, in order
            assert len(pool._idle[(HOST, srv.port)]) == 1
            assert await get(pool, srv.port) == (200, b"ok")
            assert srv.accepted == 1  # the same connection answered again
            await pool.close()

    run(main())


def test_large_body_is_read_whole_past_the_high_water_mark() -> None:
    size = 3 * h1pool.HIGH_WATER + 12345

    async def main() -> None:
        answer = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size + bytes(range(256)) * (
            size // 256) + b"z" * (size % 256)
        async with Raw(writes(answer, then_wait=2)) as srv:
            pool = Pool()
            status, data = await get(pool, srv.port)
            assert status == 200 and len(data) == size and data == answer[-size:]
            await pool.close()

    run(main())


def cut_short(head: bytes, part: bytes) -> Handler:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                      n: int) -> None:
        if n > 1:  # later connections are answered properly
            await keep_answering(reader, writer, n)
            return
        await request(reader)
        writer.write(head + part)
        await writer.drain()
        await asyncio.sleep(0.05)  # sleep: pace - then closed mid-body (the part comes first)
    return handler


@pytest.mark.parametrize("head,part", [
    (b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n", b"0123456789"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", b"a\r\n0123456789\r\n")])
def test_server_closing_mid_body_is_peer_failed_and_frees_the_slot(head: bytes,
                                                                   part: bytes) -> None:
    async def main() -> None:
        async with Raw(cut_short(head, part)) as srv:
            pool = Pool(per_host=1)  # a leaked slot would make the next call time out
            with pytest.raises(PeerFailed, match="closed before the answer ended"):
                await get(pool, srv.port)
            assert pool._count == 0 and pool._open == {}
            assert await get(pool, srv.port, pool_s=0.5) == (200, b"ok")
            assert srv.accepted == 2
            await pool.close()

    run(main())


def test_server_closing_mid_stream_fails_chunks() -> None:
    async def main() -> None:
        head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        async with Raw(cut_short(head, b"5\r\nhello\r\n")) as srv:
            pool = Pool(per_host=1)
            resp = await pool.send("GET", HOST, srv.port, "/", b"", None, 2, 2, 2)
            got = []
            with pytest.raises(PeerFailed):
                async for chunk in resp.chunks():
                    got.append(chunk)
            resp.release()
            assert got == [b"hello"]
            assert pool._count == 0
            assert await get(pool, srv.port, pool_s=0.5) == (200, b"ok")
            await pool.close()

    run(main())


def test_close_delimited_body_is_read() -> None:
    """An answer with neither Content-Length nor chunked coding ends when the server closes
    the connection (RFC 9112, 6.3, rule 8); h1pool cannot tell httptools the stream ended
    (llhttp_finish is not exposed), so it reports PeerFailed("the connection closed before
    the answer ended") instead of the body."""
    async def main() -> None:
        answer = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\nhello"
        async with Raw(writes(answer, then_wait=0)) as srv:
            pool = Pool()
            assert await get(pool, srv.port) == (200, b"hello")
            await pool.close()

    run(main())


# ---------------------------------------------------------------- the pool's other bounds


def test_total_bound_reclaims_an_idle_connection_that_expires_while_waiting() -> None:
    """With total=1 and one idle connection to host A, a call to host B waits for room; the
    idle connection passes keepalive_s (0.2 s) during the wait, but nothing wakes the waiter
    to close it (`_close_stale` runs only before waiting), so B fails with TimeoutError after
    the whole pool_s instead of being answered once A's connection is stale."""
    async def main() -> None:
        async with Raw(keep_answering) as a, Raw(keep_answering) as b:
            pool = Pool(total=1, keepalive_s=0.2)
            assert await get(pool, a.port) == (200, b"ok")
            t0 = time.monotonic()
            assert await get(pool, b.port, pool_s=1.0) == (200, b"ok")
            assert time.monotonic() - t0 < 0.9
            await pool.close()

    run(main())


def test_total_bound_uses_a_stale_idle_connection_of_another_host() -> None:
    async def main() -> None:
        async with Raw(keep_answering) as a, Raw(keep_answering) as b:
            pool = Pool(total=1, keepalive_s=0.2)
            assert await get(pool, a.port) == (200, b"ok")
            # stale before the call: closed to make room
            await asyncio.sleep(0.3)  # sleep: behaviour - keepalive_s (0.2 s) runs out
            assert await get(pool, b.port, pool_s=1.0) == (200, b"ok")
            assert pool._count == 1 and pool._open == {(HOST, b.port): 1}
            await pool.close()

    run(main())


def test_closed_pool_refuses_and_closes_its_idle_connections() -> None:
    eof = asyncio.Event()

    async def watch(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await keep_answering(reader, writer, n)
        eof.set()  # the client closed it

    async def main() -> None:
        async with Raw(watch) as srv:
            pool = Pool()
            assert await get(pool, srv.port) == (200, b"ok")
            await pool.close()
            await asyncio.wait_for(eof.wait(), 1)
            with pytest.raises(PeerFailed, match="closed"):
                await get(pool, srv.port)

    run(main())


# ---------------------------------------------------------------- 11: jsonhttp.AsyncPeer


def test_async_peer_call_parses_json_and_headers(edge: Server) -> None:
    async def main() -> None:
        peer = AsyncPeer()
        url = f"http://{HOST}:{edge.port}"
        ans = await peer.call(url + "/echo", {"a": [1, 2], "b": "ü"})
        assert ans.status == 200 and ans.body == {"got": {"a": [1, 2], "b": "ü"}}
        assert ans.headers.get("Content-Type") == "application/json"
        assert ans.headers.get("content-type") == "application/json"
        assert ans.headers["X-ECHO"] == "yes"
        first = (await peer.call(url + "/who")).body["port"]
        assert (await peer.call(url + "/who")).body["port"] == first  # kept alive
        refused = await peer.call(url + "/refuse", {})
        assert refused.status == 400 and refused.body["error"]["message"] == "no such thing"
        port = free_port()
        with pytest.raises(OSError, match=f"http://127.0.0.1:{port}/x"):
            await peer.call(f"http://127.0.0.1:{port}/x", timeout_s=2)
        await peer.close()

    run(main())


def test_async_peer_events_to_done_and_peer_error(edge: Server) -> None:
    async def main() -> None:
        peer = AsyncPeer()
        url = f"http://{HOST}:{edge.port}"
        got = [ev async for ev in peer.events(url + "/stream", {"n": 4}, timeout_s=5)]
        assert got == [{"i": 0}, {"i": 1}, {"i": 2}, {"i": 3}]
        again = [ev async for ev in peer.events(url + "/stream", {"n": 1}, timeout_s=5)]
        assert again == [{"i": 0}]
        assert peer._pool is not None and peer._pool._count == 1  # one connection for both
        with pytest.raises(PeerError) as e:
            async for _ in peer.events(url + "/refuse", {}, timeout_s=5):
                pass
        assert e.value.status == 400 and e.value.message == "no such thing"
        assert e.value.code == "invalid_request"
        await peer.close()

    run(main())


def test_async_peer_events_from_a_peer_that_breaks_off() -> None:
    head = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n")
    event = b'data: {"i": 0}\n\n'
    frame = b"%x\r\n%s\r\n" % (len(event), event)

    async def main() -> None:
        peer = AsyncPeer()
        async with Raw(cut_short(head, frame)) as srv:
            got: list[dict[str, Any]] = []
            with pytest.raises(OSError, match="the event stream broke"):
                async for ev in peer.events(f"http://{HOST}:{srv.port}/s", {}, timeout_s=5):
                    got.append(ev)
            assert got == [{"i": 0}]
        async with Raw(writes(head + frame + b"0\r\n\r\n")) as srv:  # ends without [DONE]
            with pytest.raises(OSError, match="before \\[DONE\\]"):
                async for _ in peer.events(f"http://{HOST}:{srv.port}/s", {}, timeout_s=5):
                    pass
        await peer.close()

    run(main())
