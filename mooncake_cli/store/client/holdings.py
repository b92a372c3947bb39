"""What a client knows of the replicas in its own DRAM segment, whoever wrote them, to
re-register them with a master that forgot them (restarted, or a new leader).

It learns them from its own puts and from the master's reports (store/reports.py: what other
clients completed in its segment, what was removed or evicted), applied in order and
acknowledged by sequence number. Only replicas whose bytes still match their checksum are
offered again, so a stale entry (the key removed or evicted meanwhile, the space reused) can
never bring back wrong bytes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import xxhash

from mooncake_cli.store.records import Replica, ReplicaStatus, ReplicateConfig, evolve
from mooncake_cli.store.reports import Held, HoldingsReport

DEFAULT_CONFIG = ReplicateConfig()


class Holdings:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[str, Held] = {}
        self.epoch = ""  # the master's journal these holdings follow, and the last change applied
        self.ack = 0
        self.ledger = 0  # the put-ledger records at or below this seq are in the holdings

    def add(self, key: str, replica: Replica, checksum: str | None,
            config: ReplicateConfig | None = None) -> None:
        r = evolve(replica, checksum=checksum, status=ReplicaStatus.COMPLETE, note_at=0,
                   note_seq=0)
        held = Held(key, r, config or DEFAULT_CONFIG)
        with self._lock:
            self._held[key] = held

    def discard(self, key: str, offset: int | None = None) -> None:
        """Forget `key` (only its replica at `offset` when given)."""
        with self._lock:
            h = self._held.get(key)
            if h is not None and (offset is None or h.replica.offset == offset):
                del self._held[key]

    def apply(self, report: HoldingsReport) -> None:
        """Take in a report of the master's (a reset replaces what was known)."""
        with self._lock:
            if report.reset:
                self._held = {}
                self.ledger = report.ledger
            self.ledger = max(self.ledger, report.ledger)
            for g in report.removed:
                h = self._held.get(g.key)
                if h is not None and h.replica.offset == g.offset:
                    del self._held[g.key]
            for h in report.added:
                self._held[h.key] = h
            self.epoch, self.ack = report.epoch, report.upto

    def verified(self, view: Callable[[Replica], memoryview | None]) -> list[Held]:
        """Every held replica whose bytes still match its checksum; the rest forgotten."""
        with self._lock:
            items = list(self._held.values())
        good = []
        for h in items:
            v = view(h.replica)
            if v is not None and xxhash.xxh3_64_hexdigest(v) == h.replica.checksum:
                good.append(h)
            else:
                self.discard(h.key, h.replica.offset)
        return good

    def keys(self) -> list[str]:
        with self._lock:
            return sorted(self._held)

    def __len__(self) -> int:
        return len(self._held)
