"""JSON over HTTP between the roles, and the CLI's requests: one pooled keep-alive client.

    answer = call("http://host:port/v1/load")                 # GET; POST when a body is given
    for ev in events(url, body): ...                          # a server-sent event stream
    reply = fetch(url, "PUT", b"raw bytes", 5.0)              # bytes in, bytes out
    peer = AsyncPeer(); await peer.call(url, body); peer.events(url, body)

Every request goes through `h1pool`: HTTP/1.1 keep-alive connections per host with separate
connect, read and pool timeouts and bounds on what an answer may hold. The async peer is a pool
of the event loop that creates it (the conductor's requests to the workers, its hot path); the
sync calls share one pool on a loop of their own thread (`background`), whichever thread calls.
A peer that cannot be reached or breaks off raises OSError; a non-2xx event stream raises
`PeerError`; a URL that is not http://HOST:PORT raises ValueError.
"""

from __future__ import annotations

import functools
import json
import threading
import urllib.parse
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from mooncake_cli.http import background, h1pool
from mooncake_cli.http.auth import Signer

CONNECT_TIMEOUT = 5.0
POOL_TIMEOUT = 30.0
KEEPALIVE_S = 4.0  # under the servers' idle timeout: the client closes first, no race
PER_HOST, MAX_CONNECTIONS = 1024, 4096  # keep-alive connections of one pool
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


Body = dict[str, Any] | bytes | None  # a JSON object, or one already encoded


def _verb_content(body: Body, method: str | None) -> tuple[str, bytes | None]:
    """A request's method (POST when it has a body) and its body bytes."""
    verb = method or ("POST" if body is not None else "GET")
    return verb, body if isinstance(body, bytes) or body is None else json.dumps(body).encode()


@functools.lru_cache(maxsize=256)
def _target(url: str) -> tuple[str, int, str]:
    """(host, port, path with its query) of an http:// URL (ValueError for anything else)."""
    host, port, _ = split(url)
    parts = urllib.parse.urlsplit(url if "://" in url else f"http://{url}")
    return host, port, (parts.path or "/") + (f"?{parts.query}" if parts.query else "")


def _answer(status: int, data: bytes, headers: Mapping[str, str]) -> Answer:
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


@dataclass
class Reply:
    """An answer's bytes, for callers that are not JSON (`fetch`)."""

    status: int
    data: bytes
    headers: Mapping[str, str]  # case-insensitive


class AsyncPeer:
    """A pooled async client for one event loop (create it inside the loop that uses it).

    `h1pool.Pool` keeps up to PER_HOST keep-alive connections per peer (MAX_CONNECTIONS in
    all); it costs a third of aiohttp's CPU per request, which was most of what the conductor
    spent on one. Requests are signed with `auth` (the cluster secret's signer) when given."""

    def __init__(self, auth: Signer | None = None) -> None:
        self.auth = auth
        self._pool: h1pool.Pool | None = None

    async def _send(self, url: str, body: Body, method: str | None, seconds: float,
                    auth: Signer | None, head: bytes = b"") -> h1pool.Response:
        host, port, target = _target(url)
        verb, content = _verb_content(body, method)
        if auth is not None:
            name, value = auth.header(verb, target, content or b"")
            head += b"%s: %s\r\n" % (name, value)
        if self._pool is None:
            self._pool = h1pool.Pool(PER_HOST, MAX_CONNECTIONS, KEEPALIVE_S)
        return await self._pool.send(verb, host, port, target, head, content,
                                     connect_s=min(CONNECT_TIMEOUT, seconds), read_s=seconds,
                                     pool_s=min(POOL_TIMEOUT, seconds))

    async def fetch(self, url: str, method: str | None = None, content: bytes | None = None,
                    timeout_s: float = 30.0, headers: Mapping[str, str] | None = None,
                    auth: Signer | None = None) -> Reply:
        """One request with a body of bytes (or none) and extra `headers`; the answer whole."""
        head = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items()).encode("latin-1")
        return await self._whole(url, content, method, timeout_s, auth, head)

    async def call(self, url: str, body: Body = None, timeout_s: float = 30.0,
                   method: str | None = None, auth: Signer | None = None) -> Answer:
        head = JSON_HEAD if body is not None else b""
        reply = await self._whole(url, body, method, timeout_s, auth, head)
        return _answer(reply.status, reply.data, reply.headers)

    async def _whole(self, url: str, body: Body, method: str | None, timeout_s: float,
                     auth: Signer | None, head: bytes) -> Reply:
        """One request, its answer read whole; a failure names the URL."""
        try:
            resp = await self._send(url, body, method, timeout_s, auth or self.auth, head)
            try:
                data = await resp.read()
            finally:
                resp.release()
        except OSError as e:
            raise OSError(f"{url}: {type(e).__name__}: {e}") from e
        return Reply(resp.status, data, resp.headers)

    async def events(self, url: str, body: Body = None, timeout_s: float = 60.0,
                     auth: Signer | None = None) -> AsyncIterator[dict[str, Any]]:
        """`events`, asynchronously."""
        lines = _Lines(url)
        try:
            resp = await self._send(url, body, None, timeout_s, auth or self.auth,
                                    JSON_HEAD if body is not None else b"")
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


_shared: dict[int, AsyncPeer] = {}  # the sync calls' peer, by the id of its loop
_shared_lock = threading.Lock()


def _peer() -> AsyncPeer:
    """The sync calls' peer, whose pool lives on the background loop."""
    key = id(background.loop())
    with _shared_lock:
        peer = _shared.get(key)
        if peer is None:
            _shared.clear()  # a loop of a parent process (after fork) is gone
            peer = _shared[key] = AsyncPeer()
        return peer


def call(url: str, body: dict[str, Any] | None = None, timeout: float = 30.0,
         method: str | None = None, auth: Signer | None = None) -> Answer:
    """One JSON request (POST when `body` is given; signed with `auth`, the cluster secret's
    signer, when given); connection errors raise OSError."""
    _target(url)  # ValueError here, in the caller's thread
    return background.submit(lambda: _peer().call(url, body, timeout, method, auth))


def fetch(url: str, method: str | None = None, content: bytes | None = None,
          timeout: float = 30.0, headers: Mapping[str, str] | None = None,
          auth: Signer | None = None) -> Reply:
    """`AsyncPeer.fetch`, from any thread."""
    _target(url)
    return background.submit(lambda: _peer().fetch(url, method, content, timeout, headers,
                                                   auth))


def events(url: str, body: dict[str, Any] | None = None,
           timeout: float = 60.0, auth: Signer | None = None) -> Iterator[dict[str, Any]]:
    """POST (or GET) `url` and yield each `data:` event of its event stream as a dict.

    A non-2xx answer raises `PeerError`; the stream ends at `[DONE]`. A stream that breaks off
    before `[DONE]`, or carries an event that is not JSON, raises OSError.
    """
    _target(url)
    return background.iterate(lambda: _peer().events(url, body, timeout, auth))
