"""HTTP metadata: upstream's `GET/PUT/DELETE ?key=K` contract, client and server.

The server also accepts `&ttl=SECONDS` on PUT: such a key expires unless PUT again in time,
which is how the descriptor of a dead engine disappears. Keys PUT without a TTL never expire,
as upstream's do.
"""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler

from mooncake_cli.httpserve import BackgroundHTTPServer
from mooncake_cli.interfaces import MetadataError, SegmentDescriptor
from mooncake_cli.transfer.metadata import KEY_PREFIX, Keeper

MAX_VALUE = 1 << 20


class HttpMetadata:
    kind = "http"

    def __init__(self, url: str, timeout: float, ttl: float) -> None:
        self._url = url.split("?")[0]
        self._timeout, self._ttl = timeout, ttl
        self._keepers: dict[str, Keeper] = {}

    def _call(self, method: str, key: str, body: bytes | None = None,
              ttl: float | None = None) -> bytes | None:
        q = {"key": key} | ({"ttl": f"{ttl:g}"} if ttl else {})
        req = urllib.request.Request(f"{self._url}?{urllib.parse.urlencode(q)}", data=body,
                                     method=method)
        try:
            with urllib.request.urlopen(req, timeout=self._timeout) as resp:
                return resp.read()
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return None
            raise MetadataError(f"metadata server {self._url}: HTTP {e.code} on {method}") from e
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise MetadataError(f"metadata server {self._url} unreachable: {reason}") from e

    def publish(self, desc: SegmentDescriptor) -> None:
        key, body = KEY_PREFIX + desc.name, desc.to_json()
        self._call("PUT", key, body, self._ttl)
        old = self._keepers.pop(desc.name, None)
        if old:
            old.stop()
        def refresh() -> None:
            self._call("PUT", key, body, self._ttl)

        self._keepers[desc.name] = Keeper(self._ttl / 3, refresh, f"mooncake-http-ttl-{desc.name}")

    def lookup(self, name: str) -> SegmentDescriptor:
        raw = self._call("GET", KEY_PREFIX + name)
        if raw is None:
            raise MetadataError(f"segment '{name}' not found at {self._url}")
        return SegmentDescriptor.from_json(raw)

    def withdraw(self, name: str) -> None:
        keeper = self._keepers.pop(name, None)
        if keeper:
            keeper.stop()
        self._call("DELETE", KEY_PREFIX + name)

    def close(self) -> None:
        for name in list(self._keepers):
            try:
                self.withdraw(name)
            except MetadataError:
                pass


class MetadataStore:
    """The key/value table behind the server: values with optional expiry."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._data: dict[str, tuple[bytes, float | None]] = {}

    def get(self, key: str) -> bytes | None:
        with self._lock:
            item = self._data.get(key)
            if item and item[1] is not None and item[1] < time.monotonic():
                del self._data[key]
                item = None
            return item[0] if item else None

    def put(self, key: str, value: bytes, ttl: float | None) -> None:
        with self._lock:
            self._data[key] = (value, time.monotonic() + ttl if ttl else None)

    def delete(self, key: str) -> bool:
        with self._lock:
            return self._data.pop(key, None) is not None


def _handler(store: MetadataStore, path: str) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            pass

        def _reply(self, code: int, body: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _key(self) -> tuple[str | None, dict[str, list[str]]]:
            url = urllib.parse.urlsplit(self.path)
            if url.path.rstrip("/") != path:
                self._reply(404, b"unknown path\n")
                return None, {}
            q = urllib.parse.parse_qs(url.query)
            if not q.get("key") or not q["key"][0]:
                self._reply(400, b"missing ?key=\n")
                return None, {}
            return q["key"][0], q

        def do_GET(self) -> None:  # noqa: N802
            key, _ = self._key()
            if key is not None:
                value = store.get(key)
                self._reply(200, value) if value is not None else self._reply(
                    404, b"metadata not found")

        def do_PUT(self) -> None:  # noqa: N802
            key, q = self._key()
            if key is None:
                return
            try:
                n = int(self.headers.get("Content-Length", "0"))
                ttl = float(q["ttl"][0]) if q.get("ttl") else None
            except ValueError:
                self._reply(400, b"bad Content-Length or ttl\n")
                return
            if not 0 <= n <= MAX_VALUE or (ttl is not None and ttl <= 0):
                self._reply(413 if n > MAX_VALUE else 400, b"value too large or bad ttl\n")
                self.close_connection = True
                return
            store.put(key, self.rfile.read(n), ttl)
            self._reply(200, b"metadata updated")

        def do_DELETE(self) -> None:  # noqa: N802
            key, _ = self._key()
            if key is not None:
                self._reply(200, b"metadata deleted") if store.delete(key) else self._reply(
                    404, b"metadata not found")

    return Handler


class MetadataServer(BackgroundHTTPServer):
    """`mooncake transfer metadata-server`: serves MetadataStore at http://HOST:PORT/metadata."""

    def __init__(self, host: str = "127.0.0.1", port: int = 8080, path: str = "/metadata") -> None:
        self.store = MetadataStore()
        super().__init__(host, port, _handler(self.store, path.rstrip("/")),
                         "mooncake-metadata-http")
        self.url = f"http://{self.host}:{self.port}{path}"
