"""JSON over HTTP between the roles: pooled keep-alive httpx clients, sync and async.

    answer = call("http://host:port/v1/load")                 # GET; POST when a body is given
    for ev in events(url, body): ...                          # a server-sent event stream
    peer = AsyncPeer(); await peer.call(url, body); peer.events(url, body)

Every client keeps HTTP/1.1 connections open per host (one pool per process for the sync
calls, one per event loop for the async ones) with separate connect, read, write and pool
timeouts. A peer that cannot be reached or breaks off raises OSError; a non-2xx event stream
raises `PeerError` with the peer's status, message and code.
"""

from __future__ import annotations

import json
import threading
import urllib.parse
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

CONNECT_TIMEOUT = 5.0
POOL_TIMEOUT = 30.0
KEEPALIVE_S = 4.0  # under the servers' idle timeout: the client closes first, no race
LIMITS = httpx.Limits(max_connections=1024, max_keepalive_connections=256,
                      keepalive_expiry=KEEPALIVE_S)


@dataclass
class Answer:
    status: int
    body: dict[str, Any]
    headers: Mapping[str, str]  # case-insensitive


class PeerError(Exception):
    """A peer's non-2xx answer to an event-stream request."""

    def __init__(self, status: int, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.code = status, message, code


def split(url: str) -> tuple[str, int, str]:
    """(host, port, path) of an http:// URL; ValueError for anything else."""
    parts = urllib.parse.urlsplit(url if "://" in url else f"http://{url}")
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"not an http://HOST:PORT URL: {url!r}")
    return parts.hostname, parts.port or 80, parts.path or "/"


_split = split  # the name older callers use


def timeouts(seconds: float) -> httpx.Timeout:
    """`seconds` to read (and write), less to connect and to wait for a pooled connection."""
    return httpx.Timeout(seconds, connect=min(CONNECT_TIMEOUT, seconds),
                         pool=min(POOL_TIMEOUT, seconds))


def _answer(resp: httpx.Response) -> Answer:
    data = resp.content
    try:
        parsed = json.loads(data) if data else {}
    except ValueError:
        parsed = {"text": data.decode(errors="replace")}
    if not isinstance(parsed, dict):  # callers read fields: keep them on a dict
        parsed = {"value": parsed}
    return Answer(resp.status_code, parsed, resp.headers)


def _request(url: str, body: dict[str, Any] | None, method: str | None) -> dict[str, Any]:
    split(url)
    return {"method": method or ("POST" if body is not None else "GET"), "url": url,
            "content": None if body is None else json.dumps(body).encode(),
            "headers": {"Content-Type": "application/json"} if body is not None else {}}


def _peer_error(status: int, data: bytes) -> PeerError:
    message, code = data.decode(errors="replace"), None
    try:
        err = json.loads(data)["error"]
        message, code = str(err["message"]), err.get("code")
    except (ValueError, KeyError, TypeError):
        pass
    return PeerError(status, message, code if isinstance(code, str) else None)


def _event(url: str, line: str) -> dict[str, Any] | None:
    """The event of one `data:` line; None at [DONE]; OSError for one that is not JSON."""
    payload = line[5:].strip()
    if payload == "[DONE]":
        return None
    try:
        event = json.loads(payload)
    except ValueError:
        raise OSError(f"{url} sent an event that is not JSON: {payload[:80]!r}") from None
    if not isinstance(event, dict):
        raise OSError(f"{url} sent an event that is not an object: {payload[:80]!r}")
    return event


_sync_lock = threading.Lock()
_sync: httpx.Client | None = None


def client() -> httpx.Client:
    """This process's pooled sync client."""
    global _sync
    with _sync_lock:
        if _sync is None:
            _sync = httpx.Client(limits=LIMITS, timeout=timeouts(30.0), trust_env=False)
        return _sync


def call(url: str, body: dict[str, Any] | None = None, timeout: float = 30.0,
         method: str | None = None) -> Answer:
    """One JSON request (POST when `body` is given); connection errors raise OSError."""
    try:
        return _answer(client().request(**_request(url, body, method),
                                        timeout=timeouts(timeout)))
    except httpx.TransportError as e:
        raise OSError(f"{url}: {type(e).__name__}: {e}") from e


def events(url: str, body: dict[str, Any] | None = None,
           timeout: float = 60.0) -> Iterator[dict[str, Any]]:
    """POST (or GET) `url` and yield each `data:` event of its event stream as a dict.

    A non-2xx answer raises `PeerError`; the stream ends at `[DONE]`. A stream that breaks off
    before `[DONE]`, or carries an event that is not JSON, raises OSError.
    """
    req = _request(url, body, None)
    try:
        with client().stream(**req, timeout=timeouts(timeout)) as resp:
            if resp.status_code >= 300:
                raise _peer_error(resp.status_code, resp.read())
            for line in resp.iter_lines():
                if line.startswith("data:"):
                    event = _event(url, line)
                    if event is None:
                        return
                    yield event
    except httpx.TransportError as e:
        raise OSError(f"{url}: the event stream broke: {type(e).__name__}: {e}") from e
    raise OSError(f"{url}: the event stream ended before [DONE]")


class AsyncPeer:
    """A pooled async client for one event loop (create it inside the loop that uses it)."""

    def __init__(self) -> None:
        self._client = httpx.AsyncClient(limits=LIMITS, timeout=timeouts(30.0),
                                         trust_env=False)

    async def call(self, url: str, body: dict[str, Any] | None = None,
                   timeout_s: float = 30.0, method: str | None = None) -> Answer:
        try:
            resp = await self._client.request(**_request(url, body, method),
                                              timeout=timeouts(timeout_s))
        except httpx.TransportError as e:
            raise OSError(f"{url}: {type(e).__name__}: {e}") from e
        return _answer(resp)

    async def events(self, url: str, body: dict[str, Any] | None = None,
                     timeout_s: float = 60.0) -> AsyncIterator[dict[str, Any]]:
        """`events`, asynchronously."""
        req = _request(url, body, None)
        try:
            async with self._client.stream(**req, timeout=timeouts(timeout_s)) as resp:
                if resp.status_code >= 300:
                    raise _peer_error(resp.status_code, await resp.aread())
                async for line in resp.aiter_lines():
                    if line.startswith("data:"):
                        event = _event(url, line)
                        if event is None:
                            return
                        yield event
        except httpx.TransportError as e:
            raise OSError(f"{url}: the event stream broke: {type(e).__name__}: {e}") from e
        raise OSError(f"{url}: the event stream ended before [DONE]")

    async def close(self) -> None:
        await self._client.aclose()
