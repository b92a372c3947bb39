"""The ASGI middleware of the HTTP edge (`mooncake_cli.http.server.edge_app`): the guard that
authenticates each request before its route, and the audit log's line per request."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from mooncake_cli.api.errors import ServingError
from mooncake_cli.http.audit import AuditLog

# awaited before each route; may return the `receive` the route reads its body through
Guard = Callable[[Request], Awaitable[Receive | None]]
NOTES = "mooncake.audit"  # the scope key of a request's audit fields


def error_response(e: ServingError) -> JSONResponse:
    return JSONResponse(e.body(), e.status, headers=e.headers())


class Guarded:
    """ASGI middleware awaiting `guard(request)` before the app; a ServingError it raises is
    the answer."""

    def __init__(self, app: ASGIApp, guard: Guard) -> None:
        self.app, self.guard = app, guard

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            try:
                receive = await self.guard(Request(scope, receive)) or receive
            except ServingError as e:
                scope.setdefault(NOTES, {})["refused"] = e.message
                await error_response(e)(scope, receive, send)
                return
        await self.app(scope, receive, send)


class Audited:
    """ASGI middleware writing one audit line per request to a path of `events` and per
    refused request: peer, status, duration (to the end of a streamed answer), bytes."""

    def __init__(self, app: ASGIApp, audit: AuditLog, events: dict[str, str]) -> None:
        self.app, self.audit, self.events = app, audit, events

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start, status, sizes = time.perf_counter(), 0, [0, 0]

        async def counted_receive() -> Any:
            message = await receive()
            sizes[0] += len(message.get("body", b""))
            return message

        async def counted_send(message: Any) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            elif message["type"] == "http.response.body":
                sizes[1] += len(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, counted_receive, counted_send)
        finally:
            path = scope.get("path", "")
            event = "refused" if status in (401, 403) else self.events.get(path)
            if event is not None and not (status < 400 and scope.get(NOTES, {}).get("heartbeat")):
                client = scope.get("client") or ("", 0)
                notes = scope.get(NOTES, {})
                if event == "refused":
                    notes.setdefault("attempted", self.events.get(path))
                self.audit.record(event, method=scope.get("method"), path=path,
                                  peer=f"{client[0]}:{client[1]}", status=status or None,
                                  duration_s=round(time.perf_counter() - start, 6),
                                  bytes_in=sizes[0], bytes_out=sizes[1],
                                  **notes)
