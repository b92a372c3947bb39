"""A client's heartbeat: keeps it alive at the master, keeps its holdings in step with the
master's reports, and when the master has forgotten it (restarted, or a new HA leader) mounts
its segment again and re-registers every replica the segment still holds (checksums verified),
whoever put them, so the master's index is rebuilt from the data in the cluster.

The poll is a long poll (`beat(wait)`): the master holds it until there is news for this
client, so an HA master learns within one round trip that the owner has taken in a put or a
remove, and only then acknowledges it to the writer (store/ha/acks.py). A replica evicted just
before the master dies may still be registered again (evictions are not waited for): its bytes
are intact and verified, so a reader gets the old value, never wrong bytes.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from mooncake_cli.store import ledger
from mooncake_cli.store.client.holdings import Holdings
from mooncake_cli.store.errors import StoreError
from mooncake_cli.store.records import Mount, Replica
from mooncake_cli.store.wire import protocol as p
from mooncake_cli.store.wire.fastlane import LaneSlot
from mooncake_cli.store.wire.incoming import ReportIn

log = logging.getLogger("mooncake.store")
REGISTER_CHUNK = 1024  # replicas re-registered per request


class HoldingsKeeper:
    """The heartbeat of client `client_id` over `conn` (the master's same-host lane when it
    has one, else zmq). `view(replica)` is the bytes of a
    replica in the client's segment (None if not there); `after_mount()` runs after each
    re-mount (the SSD segment mounts and rescans there)."""

    def __init__(self, conn: LaneSlot, client_id: str, segment: Mount | None,
                 holdings: Holdings, view: Callable[[Replica], memoryview | None],
                 after_mount: Callable[[], object], ledger: memoryview | None = None) -> None:
        self.conn = conn
        self.client_id = client_id
        self.segment = segment
        self.holdings = holdings
        self.ledger = ledger  # the bytes of the segment's put ledger (HA), see store/ledger.py
        self._view = view
        self._after_mount = after_mount
        self._lock = threading.Lock()  # the heartbeat thread and a leader switch never overlap

    def beat(self, wait: float = 0.0) -> bool:
        """One heartbeat, held by the master up to `wait` s until news comes; a re-mount when
        the master does not know the client. Whether anything was learnt or re-mounted."""
        with self._lock:
            if self.segment is None:  # no DRAM segment; an SSD one mounts again if forgotten
                if not self.conn.call(p.Heartbeat(self.client_id), bool):
                    # the master knows only clients that mount something: one with nothing
                    # to mount stays unknown, and that is no news (else it beats in a loop)
                    return bool(self._after_mount())
                return False
            h = self.holdings
            report: ReportIn = self.conn.call(
                p.PollHoldings(self.client_id, h.epoch, h.ack, wait), ReportIn)
            if report.known:
                h.apply(report)
                return bool(report.reset or report.added or report.removed)
            self._remount(self.segment)
            return True

    def _remount(self, segment: Mount) -> None:
        log.info("master does not know client %s: re-mounting", self.client_id)
        hold = self.holdings
        ledger_next = 1
        if self.ledger is not None:  # puts acknowledged before we were told of them
            records = ledger.scan(self.ledger)
            for rec in records:
                if rec.seq > hold.ledger:
                    hold.add(rec.key, rec.replica(segment.name, segment.host), rec.checksum,
                             rec.config)
            # past every seq an earlier leader may have handed out, records in flight included
            ledger_next = max([hold.ledger, *(r.seq for r in records)]) + 1 + ledger.SLOTS
        held = hold.verified(self._view)
        refused = 0
        # the mount goes with the first p.MAX_BATCH: no put is placed over them in between
        starts = [0, *range(p.MAX_BATCH, len(held), REGISTER_CHUNK)]
        for i in starts:
            chunk = held[i:i + (REGISTER_CHUNK if i else p.MAX_BATCH)]
            ask = p.RegisterHeld(chunk) if i else p.Remount(segment, chunk, ledger_next)
            for h, item in zip(chunk, self.conn.call(ask, list[p.Reply]), strict=True):
                try:
                    p.result(item, None)
                except StoreError as e:
                    refused += 1
                    log.info("cannot re-register %r: %s", h.key, e)
                    self.holdings.discard(h.key, h.replica.offset)
            if not i:
                self.holdings.ledger = max(self.holdings.ledger, ledger_next - 1)
        log.info("client %s re-registered %d replica(s), %d refused", self.client_id,
                 len(held) - refused, refused)
        self._after_mount()
