"""HTTP metadata: upstream's `GET/PUT/DELETE ?key=K` contract, client and server.

The server also accepts `&ttl=SECONDS` on PUT: such a key expires unless PUT again in time,
which is how the descriptor of a dead engine disappears. Keys PUT without a TTL never expire,
as upstream's do.
"""

from __future__ import annotations

import threading
import time
import urllib.parse

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from mooncake_cli.api.errors import ErrorCode, ServingError
from mooncake_cli.http import jsonhttp
from mooncake_cli.http.server import Limits, Server, body, edge_app
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
        query = urllib.parse.urlencode({"key": key} | ({"ttl": f"{ttl:g}"} if ttl else {}))
        try:
            reply = jsonhttp.fetch(f"{self._url}?{query}", method, body, self._timeout)
        except OSError as e:
            raise MetadataError(f"metadata server {self._url} unreachable: {e}") from e
        if reply.status == 404:
            return None
        if reply.status >= 300:
            raise MetadataError(f"metadata server {self._url}: HTTP {reply.status} on "
                                f"{method}")
        return reply.data

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


def _routes(store: MetadataStore, path: str) -> list[Route]:
    def key_of(request: Request) -> str:
        key = request.query_params.get("key")
        if not key:
            raise ServingError(ErrorCode.INVALID_REQUEST, "missing ?key=", "key")
        return key

    async def get(request: Request) -> Response:
        value = store.get(key_of(request))
        return Response(value) if value is not None else \
            PlainTextResponse("metadata not found", 404)

    async def put(request: Request) -> Response:
        key, raw_ttl = key_of(request), request.query_params.get("ttl")
        try:
            ttl = float(raw_ttl) if raw_ttl else None
        except ValueError:
            ttl = -1.0
        if ttl is not None and not ttl > 0:
            raise ServingError(ErrorCode.INVALID_REQUEST, f"bad ttl {raw_ttl!r}", "ttl")
        store.put(key, await body(request), ttl)
        return PlainTextResponse("metadata updated")

    async def delete(request: Request) -> Response:
        if store.delete(key_of(request)):
            return PlainTextResponse("metadata deleted")
        return PlainTextResponse("metadata not found", 404)

    async def dispatch(request: Request) -> Response:
        verb = {"GET": get, "PUT": put, "DELETE": delete}[request.method]
        return await verb(request)

    return [Route(p, dispatch, methods=["GET", "PUT", "DELETE"]) for p in (path, path + "/")]


class MetadataServer:
    """`mooncake transfer metadata-server`: serves MetadataStore at http://HOST:PORT/metadata.
    Binds at construction (port 0 picks a free one); serves once `start`ed, until `close`."""

    def __init__(self, host: str = "127.0.0.1", port: int = 8080, path: str = "/metadata") -> None:
        self.store = MetadataStore()
        app = edge_app(_routes(self.store, "/" + path.strip("/")), Limits(max_body=MAX_VALUE))
        self._server = Server(app, host, port, "mooncake-metadata-http")
        self.host, self.port = self._server.host, self._server.port
        self.url = f"http://{self.host}:{self.port}{path}"

    def start(self) -> MetadataServer:
        self._server.start()
        return self

    def close(self) -> None:
        self._server.close()
