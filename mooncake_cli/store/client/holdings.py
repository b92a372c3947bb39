"""What a client knows of the replicas in its own DRAM segment, whoever wrote them, to
re-register them with a master that forgot them (restarted, or a new leader).

It learns them from its own puts and from the master's reports (store/reports.py: what other
clients completed in its segment, what was removed or evicted), applied in order and
acknowledged by sequence number. Only replicas whose bytes still match their checksum are
offered again, so a stale entry (the key removed or evicted meanwhile, the space reused) can
never bring back wrong bytes.

A replica is kept as a tuple of plain values (its config as an index into the few distinct
configs seen), not as its Held record: CPython stops tracking such tuples, so a client holding
a million keys adds nothing to what each full garbage collection in its process walks (as
records, four tracked objects per key made those collections pause the caller for hundreds of
milliseconds).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import xxhash

from mooncake_cli.store.records import DEFAULT_CONFIG, Replica, ReplicaStatus, ReplicateConfig
from mooncake_cli.store.reports import Held, HoldingsReport
from mooncake_cli.store.wire.incoming import ReportIn
from mooncake_cli.store.wire.incoming import config as config_of

MAX_CONFIGS = 4096  # distinct configs kept by index; past them an entry holds its config
# (segment, offset, size, tier, host, checksum, the config or its index in Holdings._configs)
Entry = tuple[str, int, int, str, str, str | None, int | ReplicateConfig]


class Holdings:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[str, Entry] = {}
        self._configs: list[ReplicateConfig] = [DEFAULT_CONFIG]
        self._config_at: dict[ReplicateConfig, int] = {DEFAULT_CONFIG: 0}
        self.epoch = ""  # the master's journal these holdings follow, and the last change applied
        self.ack = 0
        self.ledger = 0  # the put-ledger records at or below this seq are in the holdings

    def add(self, key: str, replica: Replica, checksum: str | None,
            config: ReplicateConfig | None = None) -> None:
        with self._lock:
            self._held[key] = self._entry(replica, checksum, config)

    def add_all(self, items: Sequence[tuple[str, Replica, str | None]],
                config: ReplicateConfig | None = None) -> None:
        """`add` of each (key, replica, checksum), all put with `config`."""
        with self._lock:
            held, entry = self._held, self._entry
            for key, replica, checksum in items:
                held[key] = entry(replica, checksum, config)

    def _entry(self, r: Replica, checksum: str | None, config: ReplicateConfig | None) -> Entry:
        """The lock held."""
        if config is None or config is DEFAULT_CONFIG:
            return (r.segment, r.offset, r.size, r.tier, r.host, checksum, 0)
        at: int | ReplicateConfig | None = self._config_at.get(config)
        if at is None and len(self._configs) < MAX_CONFIGS:
            at = self._config_at[config] = len(self._configs)
            self._configs.append(config)
        return (r.segment, r.offset, r.size, r.tier, r.host, checksum,
                config if at is None else at)

    def _record(self, key: str, e: Entry) -> Held:
        r = Replica(e[0], e[1], e[2], e[3], e[4], e[5],  # type: ignore[arg-type]
                    ReplicaStatus.COMPLETE)
        at = e[6]
        return Held(key, r, self._configs[at] if isinstance(at, int) else at)

    def offsets(self) -> dict[str, int]:
        """Each held key and the offset of its replica, as they are now."""
        with self._lock:
            return {k: e[1] for k, e in self._held.items()}

    def discard_all(self, offsets: dict[str, int]) -> None:
        """`discard(key, offset)` of each; the lock taken once."""
        with self._lock:
            held = self._held
            for key, offset in offsets.items():
                e = held.get(key)
                if e is not None and e[1] == offset:
                    del held[key]

    def discard(self, key: str, offset: int | None = None) -> None:
        """Forget `key` (only its replica at `offset` when given)."""
        with self._lock:
            e = self._held.get(key)
            if e is not None and (offset is None or e[1] == offset):
                del self._held[key]

    def apply(self, report: HoldingsReport | ReportIn) -> None:
        """Take in a report of the master's (a reset replaces what was known), as records or
        as the checked Structs it was decoded into (the keeper's: no records made)."""
        with self._lock:
            if report.reset:
                self._held = {}
                self.ledger = report.ledger
            self.ledger = max(self.ledger, report.ledger)
            for g in report.removed:
                e = self._held.get(g.key)
                if e is not None and e[1] == g.offset:
                    del self._held[g.key]
            for h in report.added:
                cfg = h.config
                self._held[h.key] = self._entry(
                    h.replica, h.replica.checksum,
                    cfg if isinstance(cfg, ReplicateConfig) else config_of(cfg))
            self.epoch, self.ack = report.epoch, report.upto

    def verified(self, view: Callable[[Replica], memoryview | None]) -> list[Held]:
        """Every held replica whose bytes still match its checksum; the rest forgotten."""
        with self._lock:
            items = [self._record(k, e) for k, e in self._held.items()]
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
