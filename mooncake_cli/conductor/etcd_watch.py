"""PrefixWatch: one etcd key prefix mirrored into a sink by a list and then a watch.

    watch = PrefixWatch(EtcdClients(endpoints, 5.0), "/mooncake/instances/default/", sink,
                        "registry").start()
    watch.ready.wait(10)   # the first list is applied and the watch runs from its revision
    watch.close()

The sink gets `reset(entries)` with every key under the prefix as of one revision (paged
reads at that revision), then `put(entry)` and `delete(key)` for each change after it, in
etcd's order, and `synced(revision)` after each batch of them, from one watch stream (etcd's
gRPC gateway, `POST /v3/watch`). When the stream breaks it is opened again from the next
revision on the next endpoint; when etcd has compacted past that revision, the prefix is
listed again and the sink reset. One thread per watch, blocked on its socket between events.
"""

from __future__ import annotations

import base64
import http.client
import json
import logging
import socket
import threading
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from mooncake_cli.etcd import EtcdClients

log = logging.getLogger(__name__)
PAGE = 500  # keys per range read
RETRY_S = 0.5  # pause before opening a broken watch again


@dataclass(frozen=True)
class Entry:
    """One key as etcd holds it: its value, the lease it is attached to (0: none) and the
    revision that last wrote it."""

    key: str
    value: bytes
    lease: int = 0
    revision: int = 0


class Sink(Protocol):
    def reset(self, entries: list[Entry]) -> None: ...
    def put(self, entry: Entry) -> None: ...
    def delete(self, key: str) -> None: ...
    def synced(self, revision: int) -> None:
        """Everything up to `revision` has been applied (after a reset or a watch message)."""


class Compacted(Exception):
    """etcd no longer has the revision the watch was to start from."""


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def prefix_end(prefix: str) -> str:
    """The range end covering every key that starts with `prefix` (etcd's rule)."""
    raw = bytearray(prefix.encode())
    while raw and raw[-1] == 0xFF:
        raw.pop()
    if not raw:
        return "\0"
    raw[-1] += 1
    return raw.decode("latin-1")


def entry(kv: dict[str, Any]) -> Entry:
    """An Entry from a gateway key-value (base64 key and value, int64s as strings)."""
    return Entry(base64.b64decode(kv["key"]).decode(), base64.b64decode(kv.get("value", "")),
                 int(kv.get("lease", 0) or 0), int(kv.get("mod_revision", 0) or 0))


def _range(body: dict[str, Any]) -> Callable[[Any], Any]:
    return lambda client: client.post(client.get_url("/kv/range"), json=body)


def list_prefix(clients: EtcdClients, prefix: str) -> tuple[list[Entry], int]:
    """Every key under `prefix` at one revision, read `PAGE` keys at a time: (entries,
    revision)."""
    end, key, revision = _b64(prefix_end(prefix)), _b64(prefix), 0
    out: list[Entry] = []
    while True:
        body: dict[str, Any] = {"key": key, "range_end": end, "limit": PAGE}
        if revision:
            body["revision"] = revision
        got = clients.each("range", _range(body))
        revision = revision or int(got["header"]["revision"])
        kvs = got.get("kvs", [])
        out.extend(entry(kv) for kv in kvs)
        if not got.get("more") or not kvs:
            return out, revision
        key = base64.b64encode(base64.b64decode(kvs[-1]["key"]) + b"\0").decode()


class PrefixWatch:
    """Mirrors `prefix` of the etcd at `clients` into `sink` from a thread named `name`.
    `ready` is set once the first list is applied and the watch is open; `synced_revision`
    is the latest revision the sink has seen."""

    def __init__(self, clients: EtcdClients, prefix: str, sink: Sink, name: str) -> None:
        self.clients, self.prefix, self.sink, self.name = clients, prefix, sink, name
        self.ready = threading.Event()
        self.synced_revision = 0
        self.resets = 0
        self._stop = threading.Event()
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True, name=name)

    def start(self) -> PrefixWatch:
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        self._shut()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _shut(self) -> None:
        with self._lock:
            sock, self._sock = self._sock, None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _run(self) -> None:
        failing, relist = False, True
        while not self._stop.is_set():
            try:
                if relist:
                    entries, revision = list_prefix(self.clients, self.prefix)
                    self.sink.reset(entries)
                    self.synced_revision, relist = revision, False
                    self.resets += 1
                    self.sink.synced(revision)
                self._follow()
                failing = False
            except Compacted:
                relist = True
                continue
            except Exception as e:  # etcd down or a broken stream: try again
                if not failing and not self._stop.is_set():
                    log.warning("etcd watch %s: %s (will keep trying)", self.name, e)
                failing = True
            self._stop.wait(RETRY_S)

    def _follow(self) -> None:
        """Watch from `synced_revision + 1` on the first endpoint that takes it, until the
        stream ends; OSError when none does."""
        errors = []
        for (host, port), client in zip(self.clients.endpoints, self.clients.clients,
                                        strict=True):
            try:
                path = urllib.parse.urlsplit(client.get_url("/watch")).path
                conn = http.client.HTTPConnection(host, port, timeout=client.timeout or 5.0)
                self._stream(conn, path)
                return
            except Compacted:
                raise
            except Exception as e:  # etcd3gw's, http.client's and socket errors alike
                errors.append(f"{host}:{port}: {type(e).__name__}: {e}")
        raise OSError("; ".join(errors))

    def _stream(self, conn: http.client.HTTPConnection, path: str) -> None:
        create = {"key": _b64(self.prefix), "range_end": _b64(prefix_end(self.prefix)),
                  "start_revision": self.synced_revision + 1}
        try:
            conn.request("POST", path, json.dumps({"create_request": create}),
                         {"Content-Type": "application/json"})
            resp = conn.getresponse()
            if resp.status != 200:
                raise OSError(f"watch answered HTTP {resp.status}")
            assert conn.sock is not None
            conn.sock.settimeout(None)  # events come when they come; close() shuts it
            with self._lock:
                self._sock = conn.sock
            if self._stop.is_set():
                return
            while not self._stop.is_set():
                line = resp.readline()
                if not line:
                    raise OSError("the watch stream ended")
                if line.strip():
                    self._message(json.loads(line))
        finally:
            self._shut()
            conn.close()

    def _message(self, msg: dict[str, Any]) -> None:
        if "error" in msg:
            raise OSError(f"watch error: {msg['error']}")
        result = msg.get("result", {})
        if int(result.get("compact_revision", 0) or 0):
            raise Compacted()
        if result.get("canceled"):
            raise OSError(f"watch canceled: {result.get('cancel_reason', '')}")
        if result.get("created"):
            self.ready.set()
        events = result.get("events", [])
        for ev in events:
            kv = ev["kv"]
            if ev.get("type") == "DELETE":
                self.sink.delete(base64.b64decode(kv["key"]).decode())
            else:
                self.sink.put(entry(kv))
        if events:  # a revision's events come in one message: resume after the last
            self.synced_revision = max(self.synced_revision,
                                       *(int(ev["kv"].get("mod_revision", 0)) for ev in events))
        elif not result.get("created"):  # progress: nothing was missed up to its revision
            revision = int(result.get("header", {}).get("revision", 0) or 0)
            self.synced_revision = max(self.synced_revision, revision)
        self.sink.synced(self.synced_revision)
