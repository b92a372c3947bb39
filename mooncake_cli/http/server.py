"""The HTTP edge of every serving role: a Starlette app under uvicorn, with bounds.

    app = edge_app([Route("/v1/x", handler, methods=["POST"])])
    server = Server(app, "127.0.0.1", 0, "conductor").start()   # binds at construction
    server.port; server.close()

Handlers are `async def handler(request) -> dict | Response`; they read their body with
`await body(request)` and raise `ServingError` (mooncake_cli.api.errors): here, and only here,
it becomes a status code and an OpenAI-style error body. Bounds: bodies over `max_body` bytes
(413, chunked ones too) or slower than `body_timeout` (408), request headers not complete within
`header_timeout` and connections idle for `idle_timeout` (closed; beyond half of
`max_connections` waiting for headers at once, the longest waiting), headers over `max_header`
bytes (431), at most `max_connections` at once (503 beyond) and at most `body_budget` bytes
of bodies being read at once, over all connections (503 beyond). Malformed
JSON, deep nesting and lone surrogates are 400 (see `mooncake_cli.api.schema`); nothing a
client sends is a 500.

Authentication has one place to live: the `guard` of `edge_app` (`mooncake_cli.http.auth.Gate`),
awaited before every route, before any byte of the body is read. With an `audit` log, every
request to a path of `audited` (and every refused one) is one line of it; a route adds what
it knows with `note(request, field=value)`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

import uvicorn
from sse_starlette.sse import EventSourceResponse
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from mooncake_cli.api.errors import ErrorCode, ServingError
from mooncake_cli.http.audit import AuditLog
from mooncake_cli.http.bounds import bounded_protocol
from mooncake_cli.http.metrics import CONTENT_TYPE
from mooncake_cli.http.middleware import NOTES, Audited, Guard, Guarded, error_response

__all__ = ["Guard", "Limits", "Server", "body", "edge_app", "error_response", "note", "sse",
           "text_response"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Limits:
    """The bounds of one listener."""

    max_body: int = 8 << 20  # bytes of one request body
    body_timeout: float = 30.0  # seconds to receive a whole body
    header_timeout: float = 10.0  # seconds from connect (or the last answer) to full headers
    idle_timeout: float = 15.0  # seconds a keep-alive connection may sit idle
    max_header: int = 64 << 10  # bytes of one request's headers
    max_connections: int = 16384  # connections and requests at once
    body_budget: int = 64 << 20  # bytes of bodies being read at once, all connections


def text_response(text: str) -> Response:
    """A Prometheus scrape answer."""
    return Response(text, media_type=CONTENT_TYPE)


class BodyBudget:
    """Bytes of request bodies being read at once on one server (its event loop only)."""

    def __init__(self, total: int) -> None:
        self.total, self.used = total, 0

    def take(self, n: int) -> None:
        if self.used + n > self.total:
            raise ServingError(ErrorCode.UNAVAILABLE, f"busy: {self.used} bytes of request "
                               f"bodies are being read (at most {self.total})", retry_after=1)
        self.used += n

    def give(self, n: int) -> None:
        self.used -= n


_timeout = getattr(asyncio, "timeout", None)


async def body(request: Request) -> bytes:
    """The request body, within the app's `Limits` (413 when too large, 408 when too slow,
    503 when the server's body budget is spent), its declared length checked before reading.
    The budget is charged with what arrives (a declared length alone holds nothing)."""
    limits: Limits = request.app.state.limits
    budget: BodyBudget = request.app.state.body_budget
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limits.max_body:
        raise ServingError(ErrorCode.PAYLOAD_TOO_LARGE, f"request body of {declared} bytes is "
                           f"over {limits.max_body}")
    chunks: list[bytes] = []
    size = held = 0  # bytes read, and taken from the budget (what arrived, not what is declared)

    async def read() -> None:
        nonlocal size, held
        async for chunk in request.stream():
            size += len(chunk)
            if size > limits.max_body:
                raise ServingError(ErrorCode.PAYLOAD_TOO_LARGE,
                                   f"request body is over {limits.max_body} bytes")
            budget.take(len(chunk))
            held = size
            chunks.append(chunk)

    try:
        if _timeout is not None:  # 3.11+: a deadline on this task, no task of its own
            async with _timeout(limits.body_timeout):
                await read()
        else:
            await asyncio.wait_for(read(), limits.body_timeout)
    except asyncio.TimeoutError:
        raise ServingError(ErrorCode.REQUEST_TIMEOUT, f"the request body took longer than "
                           f"{limits.body_timeout:g} s") from None
    finally:
        budget.give(held)
    return b"".join(chunks)


def note(request: Request, **fields: Any) -> None:
    """Add `fields` to this request's audit line (nothing without an audit log)."""
    request.scope.setdefault(NOTES, {}).update(fields)


def sse(events: AsyncIterator[dict[str, Any] | str]) -> EventSourceResponse:
    """A server-sent-event answer: each item is sent as `data: <json>` (a str as it is)."""

    async def frames() -> AsyncIterator[dict[str, str]]:
        async for ev in events:
            yield {"data": ev if isinstance(ev, str) else json.dumps(ev)}

    return EventSourceResponse(frames(), sep="\n", ping=15)


def edge_app(routes: Sequence[BaseRoute], limits: Limits | None = None,
             guard: Guard | None = None, state: Any = None, audit: AuditLog | None = None,
             audited: dict[str, str] | None = None) -> Starlette:
    """A Starlette app of `routes` whose errors all leave as OpenAI-style bodies. `guard`
    (the place for authentication) is awaited before every route and may raise
    ServingError; `state` is reachable as `request.app.state.role`. With `audit`, requests
    to the paths of `audited` (path -> event name) and refused ones (401, 403) are logged."""

    async def serving_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ServingError)
        return error_response(exc)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        code = {404: ErrorCode.NOT_FOUND, 405: ErrorCode.METHOD_NOT_ALLOWED}.get(
            exc.status_code, ErrorCode.INVALID_REQUEST)
        return error_response(ServingError(code, f"no route {request.method} "
                                                 f"{request.url.path}" if code.status != 400
                                           else str(exc.detail)))

    async def disconnect(request: Request, exc: Exception) -> Response:
        return Response(status_code=400)  # nobody reads it: the client left mid-body

    async def bug(request: Request, exc: Exception) -> Response:
        log.exception("%s %s failed", request.method, request.url.path, exc_info=exc)
        return error_response(ServingError(ErrorCode.INTERNAL, f"internal error: {exc}"))

    middleware = [Middleware(Audited, audit=audit, events=audited or {})] if audit else []
    if guard is not None:
        middleware.append(Middleware(Guarded, guard=guard))
    app = Starlette(routes=list(routes), middleware=middleware, exception_handlers={
        ServingError: serving_error, HTTPException: http_error,
        ClientDisconnect: disconnect, Exception: bug})
    app.state.limits = limits or Limits()
    app.state.body_budget = BodyBudget(app.state.limits.body_budget)
    app.state.role = state
    return app


def run_loop(main: Coroutine[Any, Any, Any]) -> Any:
    """`asyncio.run(main)`, on uvloop's loop where it is installed (its transports, timers
    and callbacks are C: less CPU for every request a role serves or makes)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


class Server:
    """`app` under uvicorn on a background thread. Binds at construction (port 0 picks a free
    one); serves once `start`ed, until `close`. Each of `background` is started as a task on
    the server's event loop before it serves (and cancelled when it stops)."""

    def __init__(self, app: Starlette, host: str, port: int, name: str,
                 background: Sequence[Callable[[], Coroutine[Any, Any, Any]]] = ()) -> None:
        limits: Limits = app.state.limits
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets that say they are TCP,
        # and without it a body written after its headers waits out a delayed ACK (40 ms)
        self._sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._sock.bind((host, port))
        except OSError:
            self._sock.close()
            raise
        self.host, self.port = str(host), int(self._sock.getsockname()[1])
        config = uvicorn.Config(
            app, lifespan="off", log_level="warning", access_log=False, proxy_headers=False,
            server_header=False,
            http=bounded_protocol(limits.header_timeout, max(1, limits.max_connections // 2),
                                  limits.max_header),
            loop="asyncio",
            timeout_keep_alive=int(max(1, limits.idle_timeout)),
            limit_concurrency=limits.max_connections, backlog=2048,
            timeout_graceful_shutdown=1)
        self._server = uvicorn.Server(config)
        self._background = tuple(background)
        self._thread = threading.Thread(target=self._run, daemon=True, name=name)
        self.loop: asyncio.AbstractEventLoop | None = None

    def _run(self) -> None:
        async def serve() -> None:
            self.loop = asyncio.get_running_loop()
            tasks = [asyncio.create_task(make()) for make in self._background]
            try:
                await self._server.serve(sockets=[self._sock])
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

        run_loop(serve())

    def start(self) -> Server:
        self._sock.listen(2048)
        self._thread.start()
        return self

    def run(self, coro: Coroutine[Any, Any, Any], timeout: float = 5.0) -> None:
        """Run `coro` on the server's event loop (e.g. to close its clients) and wait."""
        if self.loop is None or not self._thread.is_alive():
            coro.close()
            return
        try:
            asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)
        except Exception as e:  # closing must go on
            log.warning("on the server loop: %s", e)

    def close(self) -> None:
        if self._thread.is_alive():
            self._server.should_exit = True
            self._thread.join(timeout=5)
            if self._thread.is_alive():
                self._server.force_exit = True
                self._thread.join(timeout=5)
        self._sock.close()
