"""The store's client: contributes a DRAM segment to the pool and puts/gets objects.

    engine = TransferEngine(TransferConfig(), Registry())
    with StoreClient("127.0.0.1:50051", engine, 64 << 20) as store:
        store.put("k", b"value", ReplicateConfig(replica_num=2))
        assert store.get("k") == b"value"

Put: put_start allocates replicas -> the client writes each one with the transfer engine (a
replica on its own segment with a plain memcpy) -> put_end records the xxh3_64 checksum. Get:
get_replica_list -> read the replica nearest (own segment, then same host) -> verify the
checksum -> on a mismatch or a failed transfer try the next one; wrong bytes are never returned.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import zmq

from mooncake_cli.interfaces import MooncakeError
from mooncake_cli.store import ledger
from mooncake_cli.store.client import liveness
from mooncake_cli.store.client.batch_puts import batch_put
from mooncake_cli.store.client.batch_reads import read_into, read_scattered
from mooncake_cli.store.client.holdings import Holdings
from mooncake_cli.store.client.keeper import HoldingsKeeper
from mooncake_cli.store.client.memory import allocate_dram
from mooncake_cli.store.client.replica_adds import add_replicas
from mooncake_cli.store.client.replica_io import ReplicaIO
from mooncake_cli.store.client.ssd_node import SsdNode
from mooncake_cli.store.client.values import checksum, readable
from mooncake_cli.store.errors import (
    InvalidParams,
    ObjectAlreadyExists,
    RpcFailed,
    StoreError,
    TransferFailed,
)
from mooncake_cli.store.ha.leader import LeaderInfo, is_ha
from mooncake_cli.store.records import Mount, ObjectMeta, Replica, ReplicateConfig, StoreStats
from mooncake_cli.store.wire import protocol as p
from mooncake_cli.store.wire.fastlane import LaneSlot
from mooncake_cli.store.wire.rpc import MasterConnection
from mooncake_cli.transfer.engine import TransferEngine
from mooncake_cli.transfer.segment import Region, host_view

log = logging.getLogger("mooncake.store")


FOUND = p.Found | p.batch(list[Replica])  # a batch get's answer: short or per key


class StoreClient:
    """A store client over `engine`, contributing `segment_size` bytes (0: contribute none)."""

    def __init__(self, master: str = "127.0.0.1:50051", engine: TransferEngine | None = None,
                 segment_size: int = 64 << 20, client_id: str | None = None,
                 secret: str | None = None, timeout: float = 5.0,
                 heartbeat: float = 1.0, *, ssd_dir: str | None = None, ssd_size: int = 0,
                 hugepages: bool = False, strict_hugepages: bool = False) -> None:
        """`ssd_dir`: also contribute an SSD segment, the data file there (`ssd_size` bytes; 0:
        the size it has), and re-register the objects it holds. `hugepages`: the DRAM segment
        on huge pages (see mooncake_cli.store.client.memory)."""
        if engine is None:
            raise InvalidParams("StoreClient needs a TransferEngine")
        if not isinstance(segment_size, int) or segment_size < 0:
            raise InvalidParams(f"segment_size must be an integer >= 0, got {segment_size!r}")
        self.engine = engine
        self.client_id = client_id or uuid.uuid4().hex
        self.timeout = timeout
        # HA: checksums go with put_start, so the leader tells the owners while we write
        self._ha = is_ha(master)
        self._ctx: zmq.Context[Any] = zmq.Context()
        self._rpc = MasterConnection(self._ctx, master, secret, timeout,
                                     on_switch=self._new_leader)
        self._beat = MasterConnection(self._ctx, master, secret, timeout)
        self._lanes = LaneSlot(self._rpc, timeout)  # the master's same-host lane, else zmq
        self.host = engine.descriptor().host
        self.region: Region | None = None
        self.ledger: Region | None = None
        self.hugepages = False  # whether the DRAM segment really sits on huge pages
        self.segment: Mount | None = None
        self.holdings = Holdings()
        self.ssd_reads = 0  # batch reads of objects held only on SSD (upstream's offload reads)
        self._stop = threading.Event()
        try:
            if segment_size > 0:
                self.region, self.hugepages = allocate_dram(engine, segment_size, hugepages,
                                                            strict_hugepages)
                if self._ha:  # where writers leave records of their puts (store/ledger.py)
                    self.ledger = engine.allocate(ledger.SLOT * ledger.SLOTS)
                self.segment = Mount(engine.name, self.client_id, self.host,
                                     self.region.base, segment_size,
                                     ledger=self.ledger.base if self.ledger else 0,
                                     ledger_slots=ledger.SLOTS if self.ledger else 0)
                self._rpc.call(p.MountSegment(self.segment), bool)
            else:
                self._rpc.call(p.Heartbeat(self.client_id), bool)
        except BaseException:
            self._teardown()
            raise
        self.io = ReplicaIO(engine, self.region, self.host, timeout)
        self.io.ledger = self.ledger
        self.ssd: SsdNode | None = None
        if ssd_dir is not None:
            try:
                self.ssd = SsdNode(engine, master, secret, timeout, self.client_id, self.host,
                                   ssd_dir, ssd_size, self.holdings, self.region)
            except BaseException:
                if self.segment is not None:
                    self._try(p.UnmountSegment(self.segment.name, self.segment.base))
                self._teardown()
                raise
        self._beat_lane = LaneSlot(self._beat, timeout)  # owners confirm changes by it (HA)
        self.keeper = HoldingsKeeper(self._beat_lane, self.client_id, self.segment,
                                     self.holdings, self.io.local_view,
                                     lambda: self.ssd and self.ssd.mount(),
                                     self.ledger.view if self.ledger else None)
        self._thread = threading.Thread(
            target=liveness.heartbeat, name="mooncake-store-heartbeat", daemon=True,
            args=(self._stop, self.keeper, self.segment is not None, heartbeat))
        self._thread.start()

    # -- liveness --------------------------------------------------------------------------------
    def _new_leader(self, address: str) -> None:
        """An HA failover: make the new leader know us before our request is sent again."""
        if not hasattr(self, "_thread"):  # still mounting: the mount goes to the new leader
            return
        log.info("store leader is now %s", address)
        try:
            self.keeper.beat()  # re-mounts and re-registers what our segment holds
        except StoreError as e:
            log.warning("store heartbeat to the new leader: %s", e)

    # -- API -------------------------------------------------------------------------------------
    def _call(self, request: Any, kind: Any = None, meanwhile: Any = None) -> Any:
        """A data-path request: by the master's same-host lane when it has one (fastlane.py),
        else by zmq; `meanwhile()` runs while the master works on it."""
        return self._lanes.call(request, kind, meanwhile)

    def put(self, key: str, data: Any, config: ReplicateConfig | None = None,
            upsert: bool = False) -> None:
        """Store `data` (bytes-like, numpy array, CPU tensor) under the new key `key` (with
        `upsert`, replacing the object of that key if there is one)."""
        view = readable(data)
        sums: list[str] = [checksum(view)] if self._ha else []  # else while the master works
        fused = self.io.fusing([view], self._ha)[0]  # or as it is copied into our segment
        replicas = self._call(p.PutStart(key, len(view), config, upsert=upsert,
                                         checksum=sums[0] if sums else None, notes=self._ha),
                              list[Replica],
                              None if sums or fused else lambda: sums.append(checksum(view)))
        try:
            rest = replicas
            if fused:
                csum, rest = self.io.write_hashed(view, replicas)
                sums.append(csum)
            csum = sums[0]
            self.io.write(view, rest, ledger.notes(key, replicas, csum, config))
        except MooncakeError as e:  # a StoreError, or the transfer engine's own
            self._try(p.PutRevoke(key))
            if isinstance(e, StoreError):
                raise
            raise TransferFailed(f"writing {key!r}: {e}") from e
        self._call(p.PutEnd(key, csum))
        own = [r for r in replicas if r.segment == self.engine.name]
        if own:
            self.holdings.add(key, own[0], csum, config)

    def batch_put(self, keys: Sequence[str], values: Sequence[Any],
                  config: ReplicateConfig | None = None,
                  upsert: bool = False) -> list[StoreError | None]:
        """Put each value (`upsert`: as `put`); one entry per key: None when stored, or the
        error it met."""
        return batch_put(self._call, self.io, self.holdings, self._ha, keys, values, config,
                         upsert)

    def add_replica(self, key: str, data: Any, segment: str | None = None) -> bool:
        """Give the complete object `key` one more replica, holding `data` (its bytes), on
        transfer segment `segment` (default: this client's own); False when it has a replica
        there already. InvalidReplica when `data` are not the object's bytes (nothing kept)."""
        err = self.batch_add_replica([key], [data], segment)[0]
        if isinstance(err, ObjectAlreadyExists):
            return False
        if err is not None:
            raise err
        return True

    def batch_add_replica(self, keys: Sequence[str], values: Sequence[Any],
                          segment: str | None = None) -> list[StoreError | None]:
        """`add_replica` for each key (see store/replica_adds.py); per key None when added,
        else the error it met."""
        own = self.segment.name if self.segment is not None else None
        return add_replicas(self._call, self.io, self.holdings, own, keys, values, segment)

    def get(self, key: str) -> bytes:
        """The value of `key`; ObjectNotFound when there is none."""
        replicas = self._call(p.GetReplicaList(key), list[Replica])
        return self._get(key, replicas)

    def _get(self, key: str, replicas: Sequence[Replica]) -> bytes:
        return self.io.read_bytes(key, replicas)

    def get_into(self, key: str, buffer: Any) -> int:
        """Read `key` into `buffer` (bytearray, numpy array, CPU tensor); the bytes read.
        Straight into it when it lies in memory registered with the engine (`engine.register`,
        `engine.allocate`); otherwise staged and copied (io.read)."""
        try:
            dest = host_view(buffer)[0]
        except ValueError as e:
            raise InvalidParams(f"cannot read into {type(buffer).__name__}: {e}") from None
        replicas = self._call(p.GetReplicaList(key), list[Replica])
        return self.io.read(key, replicas, dest, buffer)

    def batch_get(self, keys: Sequence[str]) -> list[bytes | StoreError]:
        """The value of each key, or the error it met."""
        items = self._call(p.BatchGetReplicaList(list(keys), runs=True), FOUND)
        if type(items) is p.Found:  # every key found, one replica each on one segment
            lists = items.replicas()
            if len(lists) != len(keys):
                raise RpcFailed(f"the master found {len(lists)} of {len(keys)} keys")
            return self.io.read_batch(keys, lists)
        found: list[tuple[int, list[Replica]]] = []
        out: list[bytes | StoreError] = []
        for i, item in enumerate(p.each(items)):
            if isinstance(item, StoreError):
                out.append(item)
            else:
                found.append((i, item))
                out.append(b"")
        got = self.io.read_batch([keys[i] for i, _ in found], [rs for _, rs in found])
        for (i, _), value in zip(found, got, strict=True):
            out[i] = value
        return out

    def batch_get_into(self, keys: Sequence[str], buffers: Sequence[Any]) -> list[int | StoreError]:
        """Read each key into its buffer (as `get_into`: one master request for all, every
        remote read in one engine batch, see batch_reads.py); per key the bytes read or the
        error it met."""
        if len(keys) != len(buffers):
            raise InvalidParams(f"{len(keys)} keys but {len(buffers)} buffers")
        items = self._call(p.BatchGetReplicaList(list(keys)), p.batch(list[Replica]))
        out: list[int | StoreError | None] = [None] * len(keys)
        todo: list[tuple[int, list[Replica], memoryview]] = []
        for i, (buf, item) in enumerate(zip(buffers, p.each(items), strict=True)):
            if isinstance(item, StoreError):
                out[i] = item
                continue
            try:
                todo.append((i, item, host_view(buf)[0]))
            except ValueError as e:
                out[i] = InvalidParams(f"cannot read into {type(buf).__name__}: {e}")
        self._count_ssd([rs for _, rs, _ in todo])
        got = read_into(self.io, [keys[i] for i, _, _ in todo], [rs for _, rs, _ in todo],
                        [d for _, _, d in todo], [buffers[i] for i, _, _ in todo])
        for (i, _, _), value in zip(todo, got, strict=True):
            out[i] = value
        return out  # type: ignore[return-value]

    def batch_get_buffers(self, keys: Sequence[str], alloc: Callable[[int], Any] = bytearray
                          ) -> list[Any]:
        """The bytes of each key in a new buffer of its size, `alloc(size)` (default a
        bytearray; `numpy.empty`'s skips the zero-fill), or the error it met (one master
        request, reads as `batch_get_into`)."""
        lists = p.each(self._call(p.BatchGetReplicaList(list(keys)), p.batch(list[Replica])))
        self._count_ssd(lists)
        out: list[Any] = []
        found: list[tuple[int, list[Replica], Any]] = []
        for i, rs in enumerate(lists):
            if isinstance(rs, StoreError):
                out.append(rs)
                continue
            out.append(alloc(rs[0].size if rs else 0))
            found.append((i, rs, out[-1]))
        got = read_into(self.io, [keys[i] for i, _, _ in found], [rs for _, rs, _ in found],
                        [memoryview(b) for _, _, b in found], [b for _, _, b in found])
        for (i, _, _), value in zip(found, got, strict=True):
            if isinstance(value, StoreError):
                out[i] = value
        return out

    def batch_get_scattered(self, keys: Sequence[str], parts: Sequence[Sequence[memoryview]]
                            ) -> list[int | None]:
        """Per key its size once read straight into its `parts` (registered memory, in order),
        or None: read it another way (batch_reads.read_scattered)."""
        lists = p.each(self._call(p.BatchGetReplicaList(list(keys)), p.batch(list[Replica])))
        return read_scattered(self.io, keys, [rs if isinstance(rs, list) else [] for rs in lists],
                              parts)

    def _count_ssd(self, lists: Sequence[Any]) -> None:
        self.ssd_reads += sum(1 for rs in lists if isinstance(rs, list) and rs
                              and all(r.tier == "ssd" for r in rs))

    def batch_replica_clear(self, keys: Sequence[str], segment: str = "") -> list[str]:
        """Drop the replicas of the unleased `keys` (those on `segment` only, when given); the
        keys that lost one (an object left with none is gone)."""
        cleared = list(self._rpc.call(p.BatchReplicaClear(list(keys), segment), list[str]))
        for key in cleared:
            if not segment or (self.segment is not None and segment == self.segment.name):
                self.holdings.discard(key)
        return cleared

    def exists(self, key: str) -> bool:
        return bool(self._call(p.Exists(key), bool))

    def batch_exists(self, keys: Sequence[str]) -> list[bool | StoreError]:
        return p.each(self._call(p.BatchExists(list(keys)), p.batch(bool)))

    def batch_describe(self, keys: Sequence[str]) -> list[ObjectMeta | StoreError]:
        """`describe` of each key in one request: its metadata, or the error it met."""
        items = self._call(p.BatchDescribe(list(keys)), list[p.Reply])
        return [self._value(item, ObjectMeta) for item in items]

    def size(self, key: str) -> int:
        return self.describe(key).size

    def describe(self, key: str) -> ObjectMeta:
        """What the master knows of `key` (size, replicas); grants no lease, counts no access."""
        meta: ObjectMeta = self._call(p.Describe(key), ObjectMeta)
        return meta

    def _own(self) -> str:
        """Our segment, named in removals so that the master does not report back what we
        forget ourselves ("": HA, where owners confirm each change, or no DRAM segment)."""
        return "" if self._ha or self.region is None else self.engine.name

    def remove(self, key: str, force: bool = False) -> None:
        self._call(p.Remove(key, force, self._own()))
        self.holdings.discard(key)

    def batch_remove(self, keys: Sequence[str], force: bool = False) -> list[StoreError | None]:
        """`remove` of each key in one request; per key None when removed, or the error."""
        items = self._rpc.call(p.BatchRemove(list(keys), force), list[p.Reply])
        out: list[StoreError | None] = [self._value(item, None) for item in items]
        for key, e in zip(keys, out, strict=True):
            if e is None:
                self.holdings.discard(key)
        return out

    def remove_all(self, force: bool = False) -> int:
        own = self._own() if force else ""
        held = self.holdings.offsets() if own else {}  # what the removal takes with it
        n = int(self._call(p.RemoveAll(force, own), int))
        self.holdings.discard_all(held)
        return n

    def list(self, prefix: str = "") -> list[str]:
        return list(self._rpc.call(p.List(prefix), list[str]))

    def root_fs_dir(self) -> str:
        """The directory the master tells clients to persist objects to ("" for none, or a
        master that does not know the request)."""
        try:
            return str(self._rpc.call(p.GetFsdir(), str))
        except StoreError as e:
            log.debug("the master names no root_fs_dir: %s", e)
            return ""

    def leader(self) -> LeaderInfo:
        """The leading master (its address; its term and id in an HA store)."""
        info: LeaderInfo = self._rpc.call(p.WhoLeads(), LeaderInfo)
        return info

    def stats(self) -> StoreStats:
        stats: StoreStats = self._rpc.call(p.Stats(), StoreStats)
        return stats

    @staticmethod
    def _value(item: p.Reply, kind: Any) -> Any:
        try:
            return p.result(item, kind)
        except StoreError as e:
            return e

    def _try(self, request: Any) -> None:
        try:
            self._rpc.call(request)
        except StoreError as e:
            log.debug("%s: %s", type(request).__name__, e)

    # -- shutdown --------------------------------------------------------------------------------
    def _teardown(self) -> None:
        self._lanes.close()
        lane = self.__dict__.get("_beat_lane")
        if lane is not None:
            lane.close()
        io = self.__dict__.get("io")  # absent when the constructor failed before making it
        if io is not None:
            io.close()
        self._rpc.close()
        self._beat.close()
        self._ctx.term()
        for region in (self.region, self.ledger):
            if region is not None:
                self.engine.unregister(region)
        self.region = self.ledger = None

    def close(self) -> None:
        """Unmount the segment (its replicas are dropped by the master) and release it."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join(timeout=self.timeout + 1)
        if self.ssd is not None:
            self.ssd.close()
        if self.segment is not None:
            self._try(p.UnmountSegment(self.segment.name, self.segment.base))
        self._teardown()

    def __enter__(self) -> StoreClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
