"""The node side of a store client: the DRAM segment it contributes (mounted at the master), the
put ledger beside it (HA), the replicas it holds, its SSD segment, and the heartbeat that keeps
all of these known to the master (keeper.py, liveness.py).

    owner = SegmentOwner(engine, rpc, zmq_ctx, SegmentSpec(64 << 20), master, None, 5.0)
    owner.start(io.local_view, heartbeat=1.0)  # once the replicas can be read
    ...
    owner.close()  # the heartbeat stops, the segments are unmounted and released

A client with no DRAM segment (size 0) only says it is alive; an SSD segment mounts either way.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import zmq

from mooncake_cli.store import ledger
from mooncake_cli.store.client import liveness
from mooncake_cli.store.client.holdings import Holdings
from mooncake_cli.store.client.keeper import HoldingsKeeper
from mooncake_cli.store.client.memory import allocate_dram
from mooncake_cli.store.client.ssd_node import SsdNode
from mooncake_cli.store.errors import InvalidParams, StoreError
from mooncake_cli.store.records import Mount, Replica
from mooncake_cli.store.wire import protocol as p
from mooncake_cli.store.wire.fastlane import LaneSlot
from mooncake_cli.store.wire.rpc import MasterConnection
from mooncake_cli.transfer.engine import TransferEngine
from mooncake_cli.transfer.segment import Region

log = logging.getLogger("mooncake.store")


@dataclass(frozen=True)
class SegmentSpec:
    """What a client contributes: `size` bytes of DRAM (0: none; `hugepages`: on huge pages,
    see memory.py), and with `ssd_dir` an SSD segment, the data file there (`ssd_size` bytes;
    0: the size it has), whose objects are registered again."""

    size: int = 64 << 20
    client_id: str = ""  # "" for a fresh one
    hugepages: bool = False
    strict_hugepages: bool = False
    ssd_dir: str | None = None
    ssd_size: int = 0


class SegmentOwner:
    """Mounts `spec`'s segments at the master over `rpc` (a failure releases what was made and
    raises); `start` begins the heartbeat, `close` ends it and unmounts."""

    def __init__(self, engine: TransferEngine, rpc: MasterConnection, ctx: zmq.Context[Any],
                 spec: SegmentSpec, master: str, secret: str | None, timeout: float,
                 ha: bool = False) -> None:
        if not isinstance(spec.size, int) or spec.size < 0:
            raise InvalidParams(f"segment_size must be an integer >= 0, got {spec.size!r}")
        self.engine, self.timeout = engine, timeout
        self.client_id = spec.client_id or uuid.uuid4().hex
        self.host = engine.descriptor().host
        self.holdings = Holdings()
        self.region: Region | None = None
        self.ledger: Region | None = None  # where writers leave records of their puts (HA)
        self.hugepages = False  # whether the DRAM segment really sits on huge pages
        self.segment: Mount | None = None
        self.ssd: SsdNode | None = None
        self.keeper: HoldingsKeeper | None = None  # once started
        self._rpc = rpc
        self._beat = MasterConnection(ctx, master, secret, timeout)
        self._beat_lane = LaneSlot(self._beat, timeout)  # owners confirm changes by it (HA)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        try:
            self._mount(spec, ha)
            if spec.ssd_dir is not None:
                self.ssd = SsdNode(engine, master, secret, timeout, self.client_id, self.host,
                                   spec.ssd_dir, spec.ssd_size, self.holdings, self.region)
        except BaseException:
            self._unmount()
            self._release()
            raise

    def _mount(self, spec: SegmentSpec, ha: bool) -> None:
        if spec.size == 0:
            self._rpc.call(p.Heartbeat(self.client_id), bool)
            return
        self.region, self.hugepages = allocate_dram(self.engine, spec.size, spec.hugepages,
                                                    spec.strict_hugepages)
        if ha:
            self.ledger = self.engine.allocate(ledger.SLOT * ledger.SLOTS)
        segment = Mount(self.engine.name, self.client_id, self.host, self.region.base,
                          spec.size, ledger=self.ledger.base if self.ledger else 0,
                          ledger_slots=ledger.SLOTS if self.ledger else 0)
        self._rpc.call(p.MountSegment(segment), bool)
        self.segment = segment

    def start(self, view: Callable[[Replica], memoryview | None], heartbeat: float) -> None:
        """Beat every `heartbeat` s from now on; `view(replica)` is a held replica's bytes (None
        when not in the segment), to re-register them when the master has forgotten us."""
        self.keeper = HoldingsKeeper(self._beat_lane, self.client_id, self.segment,
                                     self.holdings, view,
                                     lambda: self.ssd and self.ssd.mount(),
                                     self.ledger.view if self.ledger else None)
        self._thread = threading.Thread(
            target=liveness.heartbeat, name="mooncake-store-heartbeat", daemon=True,
            args=(self._stop, self.keeper, self.segment is not None, heartbeat))
        self._thread.start()

    def on_new_leader(self, address: str) -> None:
        """An HA failover: make the new leader know us before a request is sent again (before
        `start`, the mount itself goes to the new leader)."""
        if self.keeper is None:
            return
        log.info("store leader is now %s", address)
        try:
            self.keeper.beat()  # re-mounts and re-registers what our segment holds
        except StoreError as e:
            log.warning("store heartbeat to the new leader: %s", e)

    def close(self) -> None:
        """Stop the heartbeat, unmount the segments (the master drops their replicas) and
        release them. Once."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout + 1)
        if self.ssd is not None:
            self.ssd.close()
        self._unmount()
        self._release()

    def _unmount(self) -> None:
        if self.segment is None:
            return
        try:
            self._rpc.call(p.UnmountSegment(self.segment.name, self.segment.base))
        except StoreError as e:
            log.debug("UnmountSegment: %s", e)

    def _release(self) -> None:
        self._beat_lane.close()
        self._beat.close()
        for region in (self.region, self.ledger):
            if region is not None:
                self.engine.unregister(region)
        self.region = self.ledger = None
