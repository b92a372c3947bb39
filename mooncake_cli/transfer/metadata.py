"""Where segment descriptors live: `p2p` (ask the peer), `http://H:P/metadata`, `etcd://H:P,...`
(the clients: here, metadata_http.py, metadata_etcd.py; `metadata_open.open_metadata` picks one).

Every client publishes a descriptor under `mooncake/segments/<name>`, keeps it alive while its
engine lives (HTTP TTL refresh, etcd lease keep-alive) and withdraws it on close, so the
descriptor of a dead engine expires on its own.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Protocol

from mooncake_cli.interfaces import ConfigError, MetadataError, SegmentDescriptor, TransferError

KEY_PREFIX = "mooncake/segments/"


class MetadataClient(Protocol):
    kind: str

    def publish(self, desc: SegmentDescriptor) -> None: ...

    def lookup(self, name: str) -> SegmentDescriptor: ...

    def withdraw(self, name: str) -> None: ...

    def close(self) -> None: ...


def split_hostport(text: str, what: str) -> tuple[str, int]:
    host, sep, port = text.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"bad {what} '{text}': expected HOST:PORT")
    return host.strip("[]"), int(port)


class P2PMetadata:
    """No server: a segment's name is its listener's HOST:PORT and the peer describes itself."""

    kind = "p2p"

    def __init__(self, secret: str | None, timeout: float) -> None:
        self._secret, self._timeout = secret, timeout

    def publish(self, desc: SegmentDescriptor) -> None:
        pass

    def lookup(self, name: str) -> SegmentDescriptor:
        from mooncake_cli.transfer.client import TargetClient

        host, port = split_hostport(name, "p2p segment name")
        try:
            client = TargetClient(host, port, self._secret, self._timeout)
        except TransferError as e:
            raise MetadataError(f"segment '{name}': {e}") from e
        try:
            return SegmentDescriptor.from_json(client.describe())
        except TransferError as e:
            raise MetadataError(f"segment '{name}': {e}") from e
        finally:
            client.close()

    def withdraw(self, name: str) -> None:
        pass

    def close(self) -> None:
        pass


class Keeper:
    """Calls `refresh` every `interval` seconds on a daemon thread until stopped."""

    def __init__(self, interval: float, refresh: Callable[[], None], name: str) -> None:
        self._stop = threading.Event()
        self._interval, self._refresh = interval, refresh
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self._refresh()
            except Exception:  # the next round retries; expiry is the worst case
                pass

    def stop(self) -> None:
        self._stop.set()
