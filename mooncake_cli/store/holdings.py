"""What a client remembers of the replicas on its own segment, to re-register them with a
master that forgot them (restarted, or a new leader). Only replicas whose bytes still match
their checksum are offered again, so a stale entry (the key removed or evicted meanwhile, the
space reused) can never bring back wrong bytes."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace

import xxhash

from mooncake_cli.store.records import Replica, ReplicaStatus


class Holdings:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[str, Replica] = {}

    def add(self, key: str, replica: Replica, checksum: str) -> None:
        with self._lock:
            self._held[key] = replace(replica, checksum=checksum,
                                      status=ReplicaStatus.COMPLETE)

    def discard(self, key: str) -> None:
        with self._lock:
            self._held.pop(key, None)

    def verified(self, view: Callable[[Replica], memoryview | None]) -> list[tuple[str, Replica]]:
        """(key, replica) of every held replica whose bytes still match; the rest forgotten."""
        with self._lock:
            items = list(self._held.items())
        good = []
        for key, r in items:
            v = view(r)
            if v is not None and xxhash.xxh3_64_hexdigest(v) == r.checksum:
                good.append((key, r))
            else:
                self.discard(key)
        return good

    def __len__(self) -> int:
        return len(self._held)
