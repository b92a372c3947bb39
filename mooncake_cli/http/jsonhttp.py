"""JSON over HTTP between the roles: pooled keep-alive clients, sync and async.

    answer = call("http://host:port/v1/load")                 # GET; POST when a body is given
    for ev in events(url, body): ...                          # a server-sent event stream
    peer = AsyncPeer(); await peer.call(url, body); peer.events(url, body)

The sync calls go through httpcore, httpx's connection layer: HTTP/1.1 connections kept open
per host (one pool per process) with separate connect, read, write and pool timeouts; httpx's
own client adds cookies, URL models and encoding detection that cost more CPU than a whole
request between two roles, so they use its pool directly, and `client()` is a full httpx
client for everything else. The async peer (the conductor's requests to the workers, its hot
path) is `h1pool`'s keep-alive pool per event loop, with the same timeouts. A peer that cannot be
reached or breaks off raises OSError; a non-2xx event stream raises `PeerError`.
"""

from __future__ import annotations

import functools
import json
import socket
import threading
import urllib.parse
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import httpcore
import httpx

from mooncake_cli.http import h1pool
from mooncake_cli.http.auth import Signer

CONNECT_TIMEOUT = 5.0
POOL_TIMEOUT = 30.0
KEEPALIVE_S = 4.0  # under the servers' idle timeout: the client closes first, no race
PER_HOST, MAX_CONNECTIONS = 1024, 4096  # the async client's keep-alive connections
# a request's body follows its headers at once (Nagle would hold it for the peer's ACK)
NODELAY = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]
FAILURES = (httpcore.NetworkError, httpcore.TimeoutException, httpcore.ProtocolError,
            httpcore.UnsupportedProtocol)
JSON_HEADERS = [(b"Content-Type", b"application/json")]
JSON_HEAD = b"Content-Type: application/json\r\n"


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


def _extensions(seconds: float) -> dict[str, Any]:
    return {"timeout": {"connect": min(CONNECT_TIMEOUT, seconds), "read": seconds,
                        "write": seconds, "pool": min(POOL_TIMEOUT, seconds)}}


Body = dict[str, Any] | bytes | None  # a JSON object, or one already encoded


def _verb_content(body: Body, method: str | None) -> tuple[str, bytes | None]:
    """A request's method (POST when it has a body) and its body bytes."""
    verb = method or ("POST" if body is not None else "GET")
    return verb, body if isinstance(body, bytes) or body is None else json.dumps(body).encode()


def _prepare(url: str, body: Body, method: str | None,
             auth: Signer | None) -> tuple[str, bytes | None, list[tuple[bytes, bytes]]]:
    """A request's method, body bytes and headers (signed with `auth` when given)."""
    split(url)
    verb, content = _verb_content(body, method)
    headers = JSON_HEADERS if body is not None else []
    if auth is not None:
        parts = urllib.parse.urlsplit(url)
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        headers = [*headers, auth.header(verb, path, content or b"")]
    return verb, content, headers


def _request(url: str, body: Body, method: str | None,
             seconds: float, auth: Signer | None = None) -> dict[str, Any]:
    """httpcore's arguments for the request."""
    verb, content, headers = _prepare(url, body, method, auth)
    return {"method": verb, "url": url, "content": content, "headers": headers,
            "extensions": _extensions(seconds)}


@functools.lru_cache(maxsize=256)
def _target(url: str) -> tuple[str, int, str]:
    """(host, port, path with its query) of an http:// URL (ValueError for anything else)."""
    host, port, _ = split(url)
    parts = urllib.parse.urlsplit(url if "://" in url else f"http://{url}")
    return host, port, (parts.path or "/") + (f"?{parts.query}" if parts.query else "")


def _answer(status: int, data: bytes, headers: Mapping[str, str] | httpx.Headers) -> Answer:
    try:
        parsed = json.loads(data) if data else {}
    except ValueError:
        parsed = {"text": data.decode(errors="replace")}
    if not isinstance(parsed, dict):  # callers read fields: keep them on a dict
        parsed = {"value": parsed}
    return Answer(status, parsed, headers)


def _peer_error(status: int, data: bytes) -> PeerError:
    message, code = data.decode(errors="replace"), None
    try:
        err = json.loads(data)["error"]
        message, code = str(err["message"]), err.get("code")
    except (ValueError, KeyError, TypeError):
        pass
    return PeerError(status, message, code if isinstance(code, str) else None)


class _Lines:
    """Server-sent `data:` events out of a byte stream, to [DONE]."""

    def __init__(self, url: str) -> None:
        self.url, self.buf, self.done = url, b"", False

    def feed(self, chunk: bytes) -> list[dict[str, Any]]:
        self.buf += chunk
        *lines, self.buf = self.buf.split(b"\n")
        out = []
        for raw in lines:
            line = raw.strip().decode(errors="replace")
            if self.done or not line.startswith("data:"):
                continue
            payload = line[5:].strip()
            if payload == "[DONE]":
                self.done = True
                continue
            try:
                event = json.loads(payload)
            except ValueError:
                raise OSError(f"{self.url} sent an event that is not JSON: "
                              f"{payload[:80]!r}") from None
            if not isinstance(event, dict):
                raise OSError(f"{self.url} sent an event that is not an object: "
                              f"{payload[:80]!r}")
            out.append(event)
        return out


_sync_lock = threading.Lock()
_sync: httpx.Client | None = None
_sync_pool: httpcore.ConnectionPool | None = None


def client() -> httpx.Client:
    """This process's pooled httpx client (for requests off the hot path)."""
    global _sync
    with _sync_lock:
        if _sync is None:
            _sync = httpx.Client(transport=httpx.HTTPTransport(socket_options=NODELAY),
                                 timeout=timeouts(30.0), trust_env=False)
        return _sync


def _pool() -> httpcore.ConnectionPool:
    global _sync_pool
    with _sync_lock:
        if _sync_pool is None:
            _sync_pool = httpcore.ConnectionPool(max_connections=1024,
                                                 max_keepalive_connections=256,
                                                 keepalive_expiry=KEEPALIVE_S,
                                                 socket_options=NODELAY)
        return _sync_pool


def call(url: str, body: dict[str, Any] | None = None, timeout: float = 30.0,
         method: str | None = None, auth: Signer | None = None) -> Answer:
    """One JSON request (POST when `body` is given; signed with `auth`, the cluster secret's
    signer, when given); connection errors raise OSError."""
    try:
        resp = _pool().request(**_request(url, body, method, timeout, auth))
    except FAILURES as e:
        raise OSError(f"{url}: {type(e).__name__}: {e}") from e
    return _answer(resp.status, resp.content, httpx.Headers(resp.headers))


def events(url: str, body: dict[str, Any] | None = None,
           timeout: float = 60.0, auth: Signer | None = None) -> Iterator[dict[str, Any]]:
    """POST (or GET) `url` and yield each `data:` event of its event stream as a dict.

    A non-2xx answer raises `PeerError`; the stream ends at `[DONE]`. A stream that breaks off
    before `[DONE]`, or carries an event that is not JSON, raises OSError.
    """
    lines = _Lines(url)
    try:
        with _pool().stream(**_request(url, body, None, timeout, auth)) as resp:
            if resp.status >= 300:
                raise _peer_error(resp.status, resp.read())
            for chunk in resp.iter_stream():  # read to the end: the connection stays pooled
                yield from lines.feed(chunk)
    except FAILURES as e:
        raise OSError(f"{url}: the event stream broke: {type(e).__name__}: {e}") from e
    if not lines.done:
        raise OSError(f"{url}: the event stream ended before [DONE]")


class AsyncPeer:
    """A pooled async client for one event loop (create it inside the loop that uses it).

    `h1pool.Pool` keeps up to PER_HOST keep-alive connections per peer (MAX_CONNECTIONS in
    all), with the timeouts of `call`; it costs a third of aiohttp's CPU per request, which
    was most of what the conductor spent on one. Requests are signed with `auth` (the cluster
    secret's signer) when given."""

    def __init__(self, auth: Signer | None = None) -> None:
        self.auth = auth
        self._pool: h1pool.Pool | None = None

    async def _send(self, url: str, body: Body, method: str | None,
                    seconds: float) -> h1pool.Response:
        host, port, target = _target(url)
        verb, content = _verb_content(body, method)
        head = JSON_HEAD if body is not None else b""
        if self.auth is not None:
            name, value = self.auth.header(verb, target, content or b"")
            head += b"%s: %s\r\n" % (name, value)
        if self._pool is None:
            self._pool = h1pool.Pool(PER_HOST, MAX_CONNECTIONS, KEEPALIVE_S)
        return await self._pool.send(verb, host, port, target, head, content,
                                     connect_s=min(CONNECT_TIMEOUT, seconds), read_s=seconds,
                                     pool_s=min(POOL_TIMEOUT, seconds))

    async def call(self, url: str, body: Body = None, timeout_s: float = 30.0,
                   method: str | None = None) -> Answer:
        try:
            resp = await self._send(url, body, method, timeout_s)
            try:
                data = await resp.read()
            finally:
                resp.release()
        except OSError as e:
            raise OSError(f"{url}: {type(e).__name__}: {e}") from e
        return _answer(resp.status, data, resp.headers)

    async def events(self, url: str, body: Body = None,
                     timeout_s: float = 60.0) -> AsyncIterator[dict[str, Any]]:
        """`events`, asynchronously."""
        lines = _Lines(url)
        try:
            resp = await self._send(url, body, None, timeout_s)
            try:
                if resp.status >= 300:
                    raise _peer_error(resp.status, await resp.read())
                async for chunk in resp.chunks():  # to the end: the connection goes back
                    for event in lines.feed(chunk):  # to the pool
                        yield event
            finally:
                resp.release()
        except OSError as e:
            raise OSError(f"{url}: the event stream broke: {type(e).__name__}: {e}") from e
        if not lines.done:
            raise OSError(f"{url}: the event stream ended before [DONE]")

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()
            self._pool = None
