"""A pooled HTTP/1.1 client on asyncio protocols, with httptools' parser: the conductor's hot path.

    pool = Pool()                                   # inside the event loop that uses it
    resp = await pool.send("POST", "127.0.0.1", 8001, "/v1/prefill", head, body,
                           connect_s=5, read_s=30, pool_s=30)
    try:
        data = await resp.read()                    # or: async for chunk in resp.chunks()
    finally:
        resp.release()                              # back to the pool, or closed

Why not aiohttp: its ClientSession costs 145-195 us of CPU per call on the test VM against
40-55 us for this, same server, same loop (uvloop), and the conductor makes two calls per
request. Parsing is httptools (llhttp, uvicorn's own parser); what is written here is only the
request line, a keep-alive pool per host and the bounds. Bounds: `per_host` and `total` open
connections (beyond them a caller waits up to `pool_s`), `connect_s` to connect, `read_s`
between two reads, `max_header` bytes of response headers and `max_body` bytes of a body read
whole. Idle connections live `keepalive_s`, under the servers' idle timeout, so the client is
the side that closes. Failures are OSError: `PeerFailed`, or TimeoutError.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Iterator, Mapping

import httptools

HIGH_WATER = 1 << 20  # buffered body bytes beyond which reading pauses until they are taken


class PeerFailed(OSError):
    """The peer could not be reached, broke off, or answered what is not HTTP/1.1."""


class Headers(Mapping[str, str]):
    """Response headers, names lower-cased, any case looked up; decoded on first use."""

    __slots__ = ("_raw", "_map")

    def __init__(self, raw: list[tuple[bytes, bytes]]) -> None:
        self._raw = raw
        self._map: dict[str, str] | None = None

    def _decoded(self) -> dict[str, str]:
        if self._map is None:
            self._map = {n.decode("latin-1").lower(): v.decode("latin-1") for n, v in self._raw}
        return self._map

    def __getitem__(self, name: str) -> str:
        return self._decoded()[name.lower()]

    def __iter__(self) -> Iterator[str]:
        return iter(self._decoded())

    def __len__(self) -> int:
        return len(self._decoded())


class _Conn(asyncio.Protocol):
    def __init__(self, pool: Pool, key: tuple[str, int]) -> None:
        self.pool, self.key = pool, key
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.waiter: asyncio.Future[None] | None = None
        self.idle_since: float | None = None  # None while a request owns it
        self.closed = self.dropped = False
        self._reset()

    def _reset(self) -> None:
        self.status, self.header_bytes = 0, 0
        self.raw_headers: list[tuple[bytes, bytes]] = []
        self.got_headers = self.complete = self.paused = self.keep_alive = False
        self.chunks: deque[bytes] = deque()
        self.buffered = 0
        self.error: OSError | None = None
        self.refusal: PeerFailed | None = None  # why a parser callback stopped the parse

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.idle_since is not None:
            self.pool._forget(self)
        elif (exc is None and self.got_headers and not self.complete
              and not any(n.lower() in (b"content-length", b"transfer-encoding")
                          for n, _ in self.raw_headers)):  # a body that ends at the close
            self.complete = True
            self._wake()
        elif not self.complete:
            self._fail(PeerFailed(f"{self.where()}: the connection closed before the answer "
                                  f"ended" + (f" ({exc})" if exc else "")))

    def data_received(self, data: bytes) -> None:
        if self.idle_since is not None or self.complete:  # bytes nobody asked for
            self.close()
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as e:
            self._fail(self.refusal or PeerFailed(f"{self.where()}: not an HTTP/1.1 answer: {e}"))
            self.close()

    def on_header(self, name: bytes, value: bytes) -> None:
        self.header_bytes += len(name) + len(value)
        if self.header_bytes > self.pool.max_header:
            self.refusal = PeerFailed(f"{self.where()}: headers over {self.pool.max_header} "
                                      f"bytes")
            raise self.refusal
        self.raw_headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.status, self.got_headers = self.parser.get_status_code(), True
        self._wake()

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)
        self.buffered += len(body)
        if self.buffered > HIGH_WATER and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        self.complete, self.keep_alive = True, self.parser.should_keep_alive()
        self._wake()

    def where(self) -> str:
        return f"http://{self.key[0]}:{self.key[1]}"

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail(self, error: OSError) -> None:
        if self.error is None:
            self.error = error
        self._wake()

    async def wait(self, seconds: float) -> None:
        """Until the parser has more to give (or the answer failed); TimeoutError after
        `seconds` without a byte."""
        loop = asyncio.get_running_loop()
        waiter = self.waiter = loop.create_future()
        timer = loop.call_later(seconds, _expire, waiter, self.where(), seconds)
        try:
            await waiter
        finally:
            timer.cancel()
            self.waiter = None

    def take(self) -> bytes:
        data = b"".join(self.chunks)
        self.chunks.clear()
        self.buffered = 0
        if self.paused and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()
        return data

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


def _expire(waiter: asyncio.Future[None], where: str, seconds: float) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError(f"{where}: timed out: no answer within "
                                         f"{seconds:g} s"))


class Response:
    """One answer: `status` and `headers` are known; its body is `read` or iterated."""

    def __init__(self, conn: _Conn, read_s: float) -> None:
        self._conn, self._read_s = conn, read_s
        self.status, self.headers = conn.status, Headers(conn.raw_headers)
        self._released = False

    async def read(self) -> bytes:
        """The whole body; PeerFailed beyond the pool's `max_body`."""
        conn, parts, size = self._conn, [], 0
        while True:
            if conn.chunks:
                part = conn.take()
                size += len(part)
                if size > conn.pool.max_body:
                    raise PeerFailed(f"{conn.where()}: an answer over {conn.pool.max_body} bytes")
                parts.append(part)
            if conn.complete:
                return b"".join(parts)
            if conn.error is not None:
                raise conn.error
            await conn.wait(self._read_s)

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it comes."""
        conn = self._conn
        while True:
            if conn.chunks:
                yield conn.take()
                continue
            if conn.complete:
                return
            if conn.error is not None:
                raise conn.error
            await conn.wait(self._read_s)

    def release(self) -> None:
        """Back to the pool when the answer was read to its end and may be kept; else closed."""
        if not self._released:
            self._released = True
            self._conn.pool._release(self._conn)


class Pool:
    """Keep-alive HTTP/1.1 connections per (host, port), for one event loop."""

    def __init__(self, per_host: int = 1024, total: int = 4096, keepalive_s: float = 4.0,
                 max_header: int = 64 << 10, max_body: int = 256 << 20) -> None:
        self.per_host, self.total, self.keepalive_s = per_host, total, keepalive_s
        self.max_header, self.max_body = max_header, max_body
        self._idle: dict[tuple[str, int], list[_Conn]] = {}
        self._open: dict[tuple[str, int], int] = {}
        self._count = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._closed = False

    async def send(self, method: str, host: str, port: int, target: str,
                   head: bytes, body: bytes | None, connect_s: float, read_s: float,
                   pool_s: float) -> Response:
        """Send one request (`head`: its header lines, each ending in CRLF, without Host and
        Content-Length) and wait for the answer's status and headers."""
        conn = await self._acquire((host, port), connect_s, pool_s)
        content = body or b""
        name = f"[{host}]" if ":" in host else host  # an IPv6 address is bracketed
        request = (f"{method} {target} HTTP/1.1\r\nHost: {name}:{port}\r\nContent-Length: "
                   f"{len(content)}\r\n").encode("latin-1") + head + b"\r\n" + content
        try:
            assert conn.transport is not None
            try:
                conn.transport.write(request)
            except RuntimeError as e:  # uvloop: the transport closed under us (peer gone)
                raise PeerFailed(f"http://{host}:{port}: the connection closed: {e}") from e
            while not conn.got_headers:
                if conn.error is not None:
                    raise conn.error
                await conn.wait(read_s)
        except BaseException:
            conn.close()
            self._release(conn)
            raise
        return Response(conn, read_s)

    async def _acquire(self, key: tuple[str, int], connect_s: float, pool_s: float) -> _Conn:
        if self._closed:
            raise PeerFailed("the client is closed")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + pool_s
        while True:
            idle = self._idle.get(key)
            while idle:
                conn = idle.pop()
                if conn.closed or conn.transport is None or conn.transport.is_closing() or \
                        loop.time() - (conn.idle_since or 0.0) > self.keepalive_s:
                    conn.close()
                    self._drop(conn)
                    continue
                conn.idle_since = None
                conn._reset()
                return conn
            if self._open.get(key, 0) < self.per_host and self._count < self.total:
                break
            self._close_stale(loop.time())
            if self._open.get(key, 0) < self.per_host and self._count < self.total:
                break
            await self._wait_for_room(loop, deadline, key)
        self._open[key] = self._open.get(key, 0) + 1
        self._count += 1
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(lambda: _Conn(self, key), *key), connect_s)
        except (OSError, TimeoutError) as e:
            self._uncount(key)
            raise PeerFailed(f"http://{key[0]}:{key[1]}: cannot connect: "
                             f"{type(e).__name__}: {e}") from e
        except BaseException:
            self._uncount(key)
            raise
        return conn

    async def _wait_for_room(self, loop: asyncio.AbstractEventLoop, deadline: float,
                             key: tuple[str, int]) -> None:
        left = deadline - loop.time()
        if left <= 0:
            raise TimeoutError(f"http://{key[0]}:{key[1]}: no free connection in time "
                               f"({self.per_host} per host, {self.total} in all)")
        waiter = loop.create_future()
        self._waiters.append(waiter)
        try:  # an idle connection expiring meanwhile makes room too: look again by then
            await asyncio.wait_for(waiter, min(left, self.keepalive_s))
        except TimeoutError:
            if loop.time() >= deadline:
                raise TimeoutError(f"http://{key[0]}:{key[1]}: no free connection in time "
                                   f"({self.per_host} per host, {self.total} in all)") from None
        finally:
            if waiter in self._waiters:
                self._waiters.remove(waiter)

    def _close_stale(self, now: float) -> None:
        for conns in self._idle.values():
            for conn in [c for c in conns if now - (c.idle_since or 0.0) > self.keepalive_s]:
                conns.remove(conn)
                conn.close()
                self._drop(conn)

    def _release(self, conn: _Conn) -> None:
        if conn.idle_since is not None:
            return
        reusable = (conn.complete and not conn.closed and not self._closed
                    and conn.keep_alive)
        if not reusable:
            conn.close()
            self._drop(conn)
            return
        conn.idle_since = asyncio.get_running_loop().time()
        self._idle.setdefault(conn.key, []).append(conn)
        self._wake_one()

    def _forget(self, conn: _Conn) -> None:
        """An idle connection the peer closed."""
        conns = self._idle.get(conn.key, [])
        if conn in conns:
            conns.remove(conn)
            self._drop(conn)

    def _drop(self, conn: _Conn) -> None:
        if not conn.dropped:
            conn.dropped = True
            self._uncount(conn.key)

    def _uncount(self, key: tuple[str, int]) -> None:
        self._open[key] -= 1
        if not self._open[key]:
            del self._open[key]
        self._count -= 1
        self._wake_one()

    def _wake_one(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def close(self) -> None:
        """Close every idle connection; those in use close when they are released."""
        self._closed = True
        for conns in self._idle.values():
            for conn in conns:
                conn.close()
        await asyncio.sleep(0)
