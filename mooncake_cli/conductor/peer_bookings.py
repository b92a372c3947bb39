"""PeerBookings: the decode bookings of the other conductors, as this one sees them in etcd.

Each booking record names a decode instance and the KV tokens booked there. Their sums per
decode instance go into that instance's `peer_tokens` and `peer_requests` in this conductor's
Cluster: apart from its own bookings (`booked_tokens`) and from the instance's load reports
(`context_tokens`), so that a booking that ends, or a conductor whose lease expires, takes its
share away and nothing else. The scheduler counts them when it checks a decode instance for
room. Every change holds `lock` (the instance registry's), as decisions do.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

from mooncake_cli.scheduler.state import Cluster


def booking(record: dict[str, Any]) -> tuple[str, int]:
    """(decode instance, KV tokens) of a booking record; ValueError for a malformed one."""
    name, tokens = record.get("decode"), record.get("tokens")
    if not isinstance(name, str) or not name or type(tokens) is not int or tokens < 0:
        raise ValueError(f"a booking names a decode instance and tokens >= 0, not "
                         f"{name!r:.40} and {tokens!r:.20}")
    return name, tokens


class PeerBookings:
    def __init__(self, cluster: Cluster, lock: threading.RLock) -> None:
        self.cluster = cluster
        self.lock = lock
        self._by_key: dict[str, tuple[str, int, int]] = {}  # key -> (decode, tokens, revision)
        self._tokens: Counter[str] = Counter()
        self._requests: Counter[str] = Counter()

    def reset(self, records: dict[str, tuple[dict[str, Any], int]]) -> None:
        """Everything peers have booked, as of one revision: key -> (record, the revision that
        wrote it). Replaces what was known; a malformed record counts for nothing."""
        parsed = {}
        for key, (record, revision) in records.items():
            try:
                parsed[key] = (*booking(record), revision)
            except ValueError:
                continue
        with self.lock:
            names = set(self._tokens)
            self._by_key.clear()
            self._tokens.clear()
            self._requests.clear()
            for key, (name, tokens, revision) in parsed.items():
                self._add(key, name, tokens, revision)
            for name in names | set(self._tokens):
                self.sync(name)

    def put(self, key: str, record: dict[str, Any], revision: int) -> None:
        """A booking made (or rewritten) at `revision`; ValueError for a malformed one, which
        is not kept."""
        try:
            name, tokens = booking(record)
        except ValueError:
            self.delete(key)
            raise
        with self.lock:
            old = self._remove(key)
            self._add(key, name, tokens, revision)
            self.sync(name)
            if old is not None and old != name:
                self.sync(old)

    def delete(self, key: str) -> None:
        with self.lock:
            name = self._remove(key)
            if name is not None:
                self.sync(name)

    def sync(self, name: str) -> None:
        """Write the sums for decode instance `name` into its state (when it is registered
        here: one that registers later gets them when it does)."""
        with self.lock:
            state = self.cluster.by_name.get(name)
            if state is not None:
                state.peer_tokens = self._tokens.get(name, 0)
                state.peer_requests = self._requests.get(name, 0)

    def totals(self) -> dict[str, dict[str, int]]:
        """Per decode instance: the tokens and requests peers have booked there."""
        with self.lock:
            return {name: {"tokens": self._tokens[name], "requests": self._requests[name]}
                    for name in sorted(self._tokens) if self._requests[name]}

    def before(self, name: str, revision: int) -> int:
        """KV tokens peers booked on `name` at revisions before `revision` and still hold:
        the bookings etcd's order puts ahead of one written at `revision`."""
        with self.lock:
            return sum(t for n, t, r in self._by_key.values() if n == name and r < revision)

    def _add(self, key: str, name: str, tokens: int, revision: int) -> None:
        self._by_key[key] = (name, tokens, revision)
        self._tokens[name] += tokens
        self._requests[name] += 1

    def _remove(self, key: str) -> str | None:
        old = self._by_key.pop(key, None)
        if old is None:
            return None
        name, tokens, _ = old
        self._tokens[name] -= tokens
        self._requests[name] -= 1
        if not self._requests[name]:
            del self._tokens[name], self._requests[name]
        return name
