"""The store's client: puts and gets objects, over a node (`owner`, segment_owner.py) that
contributes a DRAM segment to the pool.

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
from collections.abc import Callable, Sequence
from typing import Any

import zmq

from mooncake_cli.store.client import batch_puts as puts
from mooncake_cli.store.client import batch_reads as reads
from mooncake_cli.store.client.replica_adds import add_replicas
from mooncake_cli.store.client.replica_io import ReplicaIO
from mooncake_cli.store.client.segment_owner import SegmentOwner, SegmentSpec
from mooncake_cli.store.errors import InvalidParams, ObjectAlreadyExists, StoreError
from mooncake_cli.store.ha.leader import LeaderInfo, is_ha
from mooncake_cli.store.records import ObjectMeta, Replica, ReplicateConfig, StoreStats
from mooncake_cli.store.wire import protocol as p
from mooncake_cli.store.wire.fastlane import LaneSlot
from mooncake_cli.store.wire.rpc import MasterConnection
from mooncake_cli.transfer.engine import TransferEngine
from mooncake_cli.transfer.segment import host_view

log = logging.getLogger("mooncake.store")


class StoreClient:
    """A store client over `engine` whose node contributes `segment_size` bytes (0: none):
    `owner` (segment_owner.py) mounts and keeps the segments, this puts and gets objects."""

    def __init__(self, master: str = "127.0.0.1:50051", engine: TransferEngine | None = None,
                 segment_size: int = 64 << 20, client_id: str | None = None,
                 secret: str | None = None, timeout: float = 5.0,
                 heartbeat: float = 1.0, *, ssd_dir: str | None = None, ssd_size: int = 0,
                 hugepages: bool = False, strict_hugepages: bool = False) -> None:
        """`ssd_dir`, `ssd_size`, `hugepages`: see SegmentSpec."""
        if engine is None:
            raise InvalidParams("StoreClient needs a TransferEngine")
        self.engine, self.timeout = engine, timeout
        self.ssd_reads = 0  # batch reads of objects held only on SSD (upstream's offload reads)
        self._ha = is_ha(master)  # HA: checksums go with put_start (the owners learn them)
        self._ctx: zmq.Context[Any] = zmq.Context()
        self._rpc = MasterConnection(self._ctx, master, secret, timeout,
                                     on_switch=self._new_leader)
        self._lanes = LaneSlot(self._rpc, timeout)  # the master's same-host lane, else zmq
        self._closed = False
        spec = SegmentSpec(segment_size, client_id or "", hugepages, strict_hugepages, ssd_dir,
                           ssd_size)
        try:
            self.owner = SegmentOwner(engine, self._rpc, self._ctx, spec, master, secret,
                                      timeout, self._ha)
        except BaseException:
            self._disconnect()
            raise
        self.io = ReplicaIO(engine, self.owner.region, self.owner.host, timeout)
        self.io.ledger = self.owner.ledger
        self.owner.start(self.io.local_view, heartbeat)

    def _new_leader(self, address: str) -> None:
        owner = self.__dict__.get("owner")  # None while mounting: that goes to the new leader
        if owner is not None:
            owner.on_new_leader(address)

    # -- API -------------------------------------------------------------------------------------
    def _call(self, request: Any, kind: Any = None, meanwhile: Any = None) -> Any:
        """A data-path request: by the master's same-host lane when it has one (fastlane.py),
        else by zmq; `meanwhile()` runs while the master works on it."""
        return self._lanes.call(request, kind, meanwhile)

    def put(self, key: str, data: Any, config: ReplicateConfig | None = None,
            upsert: bool = False) -> None:
        """Store `data` (bytes-like, numpy array, CPU tensor) under the new key `key` (with
        `upsert`, replacing the object of that key if there is one)."""
        puts.put(self._call, self._try, self.io, self.owner.holdings, self._ha, key, data, config,
                 upsert)

    def batch_put(self, keys: Sequence[str], values: Sequence[Any],
                  config: ReplicateConfig | None = None,
                  upsert: bool = False) -> list[StoreError | None]:
        """Put each value (`upsert`: as `put`); one entry per key: None when stored, or the
        error it met."""
        return puts.batch_put(self._call, self.io, self.owner.holdings, self._ha, keys, values,
                              config, upsert)

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
        own = self.owner.segment.name if self.owner.segment is not None else None
        return add_replicas(self._call, self.io, self.owner.holdings, own, keys, values, segment)

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
        items = self._call(p.BatchGetReplicaList(list(keys), runs=True), reads.FOUND)
        return reads.read_found(self.io, keys, items)

    def batch_get_into(self, keys: Sequence[str], buffers: Sequence[Any]) -> list[int | StoreError]:
        """Read each key into its buffer (as `get_into`: one master request for all, every
        remote read in one engine batch, see batch_reads.py); per key the bytes read or the
        error it met."""
        if len(keys) != len(buffers):
            raise InvalidParams(f"{len(keys)} keys but {len(buffers)} buffers")
        lists = p.each(self._call(p.BatchGetReplicaList(list(keys)), p.batch(list[Replica])))
        out, on_ssd = reads.read_into_buffers(self.io, keys, lists, buffers)
        self.ssd_reads += on_ssd
        return out

    def batch_get_buffers(self, keys: Sequence[str], alloc: Callable[[int], Any] = bytearray
                          ) -> list[Any]:
        """The bytes of each key in a new buffer of its size, `alloc(size)` (default a
        bytearray; `numpy.empty`'s skips the zero-fill), or the error it met (one master
        request, reads as `batch_get_into`)."""
        return reads.read_into_new(self.io, keys, self._replica_lists(keys), alloc)

    def batch_get_scattered(self, keys: Sequence[str], parts: Sequence[Sequence[memoryview]]
                            ) -> list[int | None]:
        """Per key its size once read straight into its `parts` (registered memory, in order),
        or None: read it another way (batch_reads.read_scattered)."""
        lists = p.each(self._call(p.BatchGetReplicaList(list(keys)), p.batch(list[Replica])))
        return reads.read_scattered(self.io, keys, [rs if isinstance(rs, list) else []
                                                    for rs in lists], parts)

    def _replica_lists(self, keys: Sequence[str]) -> list[list[Replica] | StoreError]:
        """Each key's replicas (one master request), counting the reads of objects only an SSD
        holds."""
        lists = p.each(self._call(p.BatchGetReplicaList(list(keys)), p.batch(list[Replica])))
        self.ssd_reads += reads.only_on_ssd(lists)
        return lists

    def batch_replica_clear(self, keys: Sequence[str], segment: str = "") -> list[str]:
        """Drop the replicas of the unleased `keys` (those on `segment` only, when given); the
        keys that lost one (an object left with none is gone)."""
        cleared = list(self._rpc.call(p.BatchReplicaClear(list(keys), segment), list[str]))
        own = self.owner.segment
        for key in cleared:
            if not segment or (own is not None and segment == own.name):
                self.owner.holdings.discard(key)
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
        return "" if self._ha or self.owner.region is None else self.engine.name

    def remove(self, key: str, force: bool = False) -> None:
        self._call(p.Remove(key, force, self._own()))
        self.owner.holdings.discard(key)

    def batch_remove(self, keys: Sequence[str], force: bool = False) -> list[StoreError | None]:
        """`remove` of each key in one request; per key None when removed, or the error."""
        items = self._rpc.call(p.BatchRemove(list(keys), force), list[p.Reply])
        out: list[StoreError | None] = [self._value(item, None) for item in items]
        for key, e in zip(keys, out, strict=True):
            if e is None:
                self.owner.holdings.discard(key)
        return out

    def remove_all(self, force: bool = False) -> int:
        own = self._own() if force else ""
        held = self.owner.holdings.offsets() if own else {}  # what the removal takes with it
        n = int(self._call(p.RemoveAll(force, own), int))
        self.owner.holdings.discard_all(held)
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
    def _disconnect(self) -> None:
        self._lanes.close()
        io = self.__dict__.get("io")  # absent when the constructor failed before making it
        if io is not None:
            io.close()
        self._rpc.close()
        self._ctx.term()

    def close(self) -> None:
        """Unmount the segments (their replicas are dropped by the master) and release them."""
        if self._closed:
            return
        self._closed = True
        self.owner.close()
        self._disconnect()

    def __enter__(self) -> StoreClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
