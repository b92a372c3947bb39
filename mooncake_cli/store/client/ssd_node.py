"""A client's SSD tier: a data file mounted as a segment of tier "ssd", the moves the master
orders, and the rescan that re-registers what the directory holds after a restart.

    node = SsdNode(engine, "127.0.0.1:50051", None, 5.0, client_id, host, "/mnt/nvme/mc",
                   8 << 30, holdings, dram_region)
    node.rescan  # Rescan(registered=(...), skipped=("key: why", ...))

The data file (see mooncake_backends.ssd) is registered with the transfer engine like memory, so
any client reads an SSD replica as it reads a DRAM one. A thread polls the master for moves
(store/offload.py) and makes them with local copies: an offload is verified against the
object's checksum, forced to disk and recorded in the manifest before it is confirmed.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any

import zmq

from mooncake_cli.store.client.holdings import Holdings
from mooncake_cli.store.client.values import checksum
from mooncake_cli.store.errors import (
    InvalidParams,
    InvalidReplica,
    ObjectAlreadyExists,
    RpcFailed,
    StoreError,
)
from mooncake_cli.store.moves import Move, MoveOrders, MoveResult
from mooncake_cli.store.records import Mount, ObjectMeta, Replica, ReplicaStatus
from mooncake_cli.store.wire import protocol as p
from mooncake_cli.store.wire.rpc import MasterConnection
from mooncake_cli.transfer.engine import TransferEngine
from mooncake_cli.transfer.segment import Region

log = logging.getLogger("mooncake.store")


@dataclass(frozen=True)
class Rescan:
    """What mounting the SSD directory found: keys re-registered, and entries skipped (why)."""

    registered: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()


class SsdNode:
    """The SSD segment of one client. `dram` is the client's DRAM region (moves copy between
    the two); `poll` is the seconds between polls for moves while there are none."""

    def __init__(self, engine: TransferEngine, master: str, secret: str | None, timeout: float,
                 client_id: str, host: str, directory: str, size: int, holdings: Holdings,
                 dram: Region | None, poll: float = 0.05) -> None:
        self.engine = engine
        self.holdings = holdings
        self.dram = dram
        self.buf = engine.registry.get("mooncake.tiers", "ssd").open(directory, size)
        self._lock = threading.Lock()  # a mount and a round of moves never interleave
        self._ctx: zmq.Context[Any] = zmq.Context()
        self._conn = MasterConnection(self._ctx, master, secret, timeout)
        self.region: Region | None = None
        self._unsent: list[MoveResult] = []
        self._ack = 0  # MoveOrders.ack of the forgets dropped from the manifest
        try:
            self.region = engine.register(self.buf.view)
            self.segment = Mount(engine.name, client_id, host, self.region.base, self.buf.size,
                                   "ssd")
            self.rescan = self.mount()
        except BaseException:
            self._teardown()
            raise
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(poll,), daemon=True,
                                        name="mooncake-store-ssd")
        self._thread.start()

    # -- mounting and rescanning -------------------------------------------------------------------
    def mount(self) -> Rescan:
        """Mount the SSD segment and re-register every manifest entry whose bytes still match
        their checksum; the rest are dropped from the manifest and reported."""
        with self._lock:
            self._conn.call(p.MountSegment(self.segment), bool)
            self._unsent, self._ack = [], 0  # answers and acks for an earlier master: void
            man = self.buf.manifest
            skipped, man.problems = list(man.problems), []
            registered = []
            for e in man.entries():
                why = ""
                if e.offset + e.size > self.buf.size:
                    why = f"entry at {e.offset} ({e.size} bytes) overruns the data file"
                elif checksum(self.buf.view[e.offset:e.offset + e.size]) != e.checksum:
                    why = f"bytes at offset {e.offset} fail their checksum"
                else:
                    r = Replica(self.segment.name, self.segment.base + e.offset, e.size, "ssd",
                                self.segment.host, e.checksum, ReplicaStatus.COMPLETE)
                    try:
                        self._conn.call(p.RegisterExisting(e.key, [r]), ObjectMeta)
                        registered.append(e.key)
                        continue
                    except RpcFailed:
                        raise
                    except (InvalidReplica, ObjectAlreadyExists, InvalidParams) as err:
                        why = f"refused by the master: {err}"  # another object has the key
                    except StoreError as err:  # maybe passing (a put under way): keep it
                        skipped.append(f"{e.key}: not re-registered this time: {err}")
                        continue
                man.remove(e.offset)
                skipped.append(f"{e.key}: {why}")
            for line in skipped:
                log.warning("ssd rescan of %s: %s", self.buf.directory, line)
            return Rescan(tuple(registered), tuple(skipped))

    # -- moves ------------------------------------------------------------------------------------
    def _run(self, interval: float) -> None:
        busy = False
        while not self._stop.wait(0 if busy else interval):
            try:
                busy = self.step()
            except StoreError as e:
                log.warning("ssd moves: %s", e)
                busy = False
            except Exception:  # the thread must outlive any one bad round
                log.exception("ssd moves")
                busy = False

    def step(self) -> bool:
        """One poll: forget what the master freed, make the moves it orders; whether any. A
        master that does not know the client (restarted) gets the SSD segment mounted again
        here when the client has no DRAM segment (else its heartbeat re-mounts both)."""
        with self._lock:
            orders: MoveOrders = self._conn.call(
                p.PollMoves(self.segment.client_id, self._ack), MoveOrders)
            if orders.known:
                self._apply(orders)
                if not self._unsent:
                    return False
                self._conn.call(p.MovesDone(self.segment.client_id, self._unsent), int)
                self._unsent = []  # kept until the master has them: it holds blocks until then
                return bool(orders.moves)
        if self.dram is None:  # mount() takes the lock
            log.info("master does not know client %s: re-mounting its ssd segment",
                     self.segment.client_id)
            self.rescan = self.mount()
        return False

    def _apply(self, orders: MoveOrders) -> None:
        for offset in orders.forget:
            self.buf.manifest.remove(offset - self.segment.base)
        if orders.ack:
            self._ack = orders.ack
        for m in orders.moves:
            try:
                self._unsent.append(self._move(m))
            except Exception as e:  # one move's failure is its answer, not the round's
                log.exception("ssd move %d of %r", m.id, m.key)
                self._unsent.append(MoveResult(m.id, False, f"{type(e).__name__}: {e}"))

    def _local(self, r: Replica) -> memoryview | None:
        if r.segment != self.engine.name:
            return None
        for region in (self.dram, self.region):
            if region is not None and region.view is not None and \
                    region.base <= r.offset and r.offset + r.size <= region.base + region.length:
                return region.view[r.offset - region.base:r.offset - region.base + r.size]
        return None

    def _move(self, m: Move) -> MoveResult:
        src, dst = self._local(m.src), self._local(m.dst)
        if src is None or dst is None:
            return MoveResult(m.id, False, "the move's replicas are not on this client")
        dst[:] = src
        csum = checksum(dst)
        if m.checksum is not None and csum != m.checksum:
            return MoveResult(m.id, False, f"{m.key!r}: the source fails its checksum")
        if m.kind == "offload":
            offset = m.dst.offset - self.segment.base
            self.buf.flush(offset, m.dst.size)
            self.buf.record(m.key, offset, m.dst.size, csum)
            self.holdings.discard(m.key)
        else:
            self.holdings.add(m.key, m.dst, csum)
        return MoveResult(m.id, True)

    # -- shutdown ---------------------------------------------------------------------------------
    def _teardown(self) -> None:
        self._conn.close()
        self._ctx.term()
        if self.region is not None:
            self.engine.unregister(self.region)
            self.region = None
        self.buf.close()

    def close(self) -> None:
        """Stop making moves and unmount the SSD segment; the directory keeps its objects."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join(timeout=self._conn.timeout + 1)
        try:
            self._conn.call(p.UnmountSegment(self.segment.name, self.segment.base))
        except StoreError as e:
            log.debug("unmounting the ssd segment: %s", e)
        self._teardown()
