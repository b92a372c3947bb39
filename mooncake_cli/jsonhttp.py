"""JSON over HTTP for the serving roles: a routed request handler and a small client.

A service subclasses `JSONHandler`, sets `routes = {("POST", "/v1/x"): "method_name", ...}` and
reaches its own state through `self.server.app` (set by `serve`). A handler method returns
`(status, body)` where body is a dict (sent as JSON) or a `Stream` of server-sent events. Raising
`HTTPError` answers with its status and a JSON error body; bodies over `max_body` bytes, bodies
that are not a JSON object and unknown paths are refused before any handler runs.
"""

from __future__ import annotations

import http.client
import json
import logging
import urllib.parse
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

from mooncake_cli.httpserve import BackgroundHTTPServer

log = logging.getLogger(__name__)
MAX_BODY = 8 << 20


class HTTPError(Exception):
    """An error answer: `status`, a JSON `body` and extra `headers` (e.g. Retry-After)."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
        self.headers = headers or {}


@dataclass
class Stream:
    """A server-sent-event answer: each item of `events` is sent as `data: <json>`."""

    events: Iterable[dict[str, Any] | str]
    headers: dict[str, str] = field(default_factory=dict)


class JSONHandler(BaseHTTPRequestHandler):
    routes: dict[tuple[str, str], str] = {}
    max_body = MAX_BODY
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        log.debug("%s " + format, self.address_string(), *args)

    def do_GET(self) -> None:  # noqa: N802 - stdlib naming
        self._dispatch("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._dispatch("POST")

    def do_DELETE(self) -> None:  # noqa: N802
        self._dispatch("DELETE")

    @property
    def app(self) -> Any:
        return self.server.app  # type: ignore[attr-defined]

    def _dispatch(self, verb: str) -> None:
        url = urllib.parse.urlsplit(self.path)
        self.query = dict(urllib.parse.parse_qsl(url.query))
        name = self.routes.get((verb, url.path))
        if name is None and verb == "GET":
            name = next((n for (v, p), n in self.routes.items()
                         if v == "GET" and p.endswith("/*") and url.path.startswith(p[:-1])),
                        None)
        try:
            body = self._body() if verb == "POST" else {}
            if name is None:
                known = {p for _, p in self.routes}
                raise HTTPError(405 if url.path in known else 404,
                                f"no route {verb} {url.path}", kind="not_found")
            status, answer = getattr(self, name)(body, url.path)
        except HTTPError as e:
            self._send(e.status, e.body, e.headers)
            return
        except Exception as e:  # a handler bug must not kill the connection silently
            log.exception("%s %s failed", verb, url.path)
            self._send(500, HTTPError(500, f"internal error: {e}", kind="server_error").body)
            return
        if isinstance(answer, Stream):
            self._stream(status, answer)
        else:
            self._send(status, answer)

    def _body(self) -> dict[str, Any]:
        if self.headers.get("Transfer-Encoding"):
            self.close_connection = True  # the unread body would be taken for a request
            raise HTTPError(411, "send the body with a Content-Length, not Transfer-Encoding")
        length = (self.headers.get("Content-Length") or "0").strip()
        if not length.isdigit():  # also refuses a negative length: never read(-1)
            self.close_connection = True
            raise HTTPError(400, f"Content-Length must be a number of bytes >= 0, "
                                 f"not {length!r}")
        size = int(length)
        if size > self.max_body:
            self.close_connection = True
            raise HTTPError(413, f"request body of {size} bytes is over {self.max_body}")
        raw = self.rfile.read(size) if size else b"{}"
        try:
            data = json.loads(raw)
        except ValueError as e:
            raise HTTPError(400, f"body is not valid JSON: {e}") from None
        if not isinstance(data, dict):
            raise HTTPError(400, "body must be a JSON object")
        return data

    def _send(self, status: int, body: dict[str, Any] | str,
              headers: dict[str, str] | None = None) -> None:
        is_text = isinstance(body, str)
        raw = (body if isinstance(body, str) else json.dumps(body)).encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8" if is_text
                         else "application/json")
        self.send_header("Content-Length", str(len(raw)))
        if self.close_connection:  # e.g. a body left unread: say so
            self.send_header("Connection", "close")
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(raw)

    def _stream(self, status: int, stream: Stream) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        for k, v in stream.headers.items():
            self.send_header(k, v)
        self.end_headers()
        self.close_connection = True
        try:
            for event in stream.events:
                data = event if isinstance(event, str) else json.dumps(event)
                self.wfile.write(f"data: {data}\n\n".encode())
                self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            log.info("client left a stream on %s", self.path)
            close = getattr(stream.events, "close", None)
            if close is not None:
                close()


def serve(handler: type[JSONHandler], app: Any, host: str, port: int,
          name: str) -> BackgroundHTTPServer:
    """Bind `handler` with `app` reachable as `self.app`; call `.start()` to serve."""
    server = BackgroundHTTPServer(host, port, handler, name)
    server._httpd.app = app  # type: ignore[attr-defined]
    return server


def _split(url: str) -> tuple[str, int, str]:
    parts = urllib.parse.urlsplit(url if "://" in url else f"http://{url}")
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"not an http://HOST:PORT URL: {url!r}")
    return parts.hostname, parts.port or 80, parts.path or "/"


@dataclass
class Answer:
    status: int
    body: dict[str, Any]
    headers: dict[str, str]


def call(url: str, body: dict[str, Any] | None = None, timeout: float = 30.0,
         method: str | None = None) -> Answer:
    """One JSON request (POST when `body` is given); connection errors raise OSError."""
    host, port, path = _split(url)
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        raw = json.dumps(body).encode() if body is not None else None
        conn.request(method or ("POST" if raw is not None else "GET"), path, body=raw,
                     headers={"Content-Type": "application/json"} if raw else {})
        resp = conn.getresponse()
        data = resp.read()
        try:
            parsed = json.loads(data) if data else {}
        except ValueError:
            parsed = {"text": data.decode(errors="replace")}
        if not isinstance(parsed, dict):  # callers read fields: keep them on a dict
            parsed = {"value": parsed}
        return Answer(resp.status, parsed, dict(resp.getheaders()))
    finally:
        conn.close()


def events(url: str, body: dict[str, Any] | None = None,
           timeout: float = 60.0) -> Iterator[dict[str, Any]]:
    """POST (or GET) `url` and yield each `data:` event of its event stream as a dict.

    A non-2xx answer raises `HTTPError` with the peer's message (and code); the stream ends at
    `[DONE]`. A stream that breaks off before `[DONE]`, or carries an event that is not JSON,
    raises OSError: the peer failed mid-answer.
    """
    host, port, path = _split(url)
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        raw = json.dumps(body).encode() if body is not None else None
        conn.request("POST" if raw is not None else "GET", path, body=raw,
                     headers={"Content-Type": "application/json"} if raw else {})
        resp = conn.getresponse()
        if resp.status >= 300:
            data = resp.read()
            message, code = data.decode(errors="replace"), None
            try:
                err = json.loads(data)["error"]
                message, code = err["message"], err.get("code")
            except (ValueError, KeyError, TypeError, AttributeError):
                pass
            raise HTTPError(resp.status, message, kind="upstream_error", code=code)
        try:
            for line in resp:
                text = line.decode(errors="replace").strip()
                if not text.startswith("data:"):
                    continue
                payload = text[5:].strip()
                if payload == "[DONE]":
                    return
                try:
                    event = json.loads(payload)
                except ValueError:
                    raise OSError(f"{url} sent an event that is not JSON: "
                                  f"{payload[:80]!r}") from None
                if not isinstance(event, dict):
                    raise OSError(f"{url} sent an event that is not an object: {payload[:80]!r}")
                yield event
        except http.client.HTTPException as e:
            raise OSError(f"{url}: the event stream broke: {type(e).__name__}: {e}") from e
        raise OSError(f"{url}: the event stream ended before [DONE]")
    finally:
        conn.close()

