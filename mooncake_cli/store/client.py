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
from collections.abc import Sequence
from typing import Any

import zmq

from mooncake_cli.store import protocol as p
from mooncake_cli.store.errors import InvalidParams, StoreError
from mooncake_cli.store.holdings import Holdings
from mooncake_cli.store.records import ObjectMeta, Replica, ReplicateConfig, Segment, StoreStats
from mooncake_cli.store.replica_io import ReplicaIO, checksum, readable
from mooncake_cli.store.rpc import MasterConnection
from mooncake_cli.transfer.engine import TransferEngine
from mooncake_cli.transfer.segment import Region, host_view

log = logging.getLogger("mooncake.store")


class StoreClient:
    """A store client over `engine`, contributing `segment_size` bytes (0: contribute none)."""

    def __init__(self, master: str = "127.0.0.1:50051", engine: TransferEngine | None = None,
                 segment_size: int = 64 << 20, client_id: str | None = None,
                 secret: str | None = None, timeout: float = 5.0,
                 heartbeat: float = 1.0) -> None:
        if engine is None:
            raise InvalidParams("StoreClient needs a TransferEngine")
        if not isinstance(segment_size, int) or segment_size < 0:
            raise InvalidParams(f"segment_size must be an integer >= 0, got {segment_size!r}")
        self.engine = engine
        self.client_id = client_id or uuid.uuid4().hex
        self.timeout = timeout
        self._ctx: zmq.Context[Any] = zmq.Context()
        self._rpc = MasterConnection(self._ctx, master, secret, timeout)
        self._beat = MasterConnection(self._ctx, master, secret, timeout)
        self.host = engine.descriptor().host
        self.region: Region | None = None
        self.segment: Segment | None = None
        self.holdings = Holdings()
        self._stop = threading.Event()
        try:
            if segment_size > 0:
                self.region = engine.allocate(segment_size)
                self.segment = Segment(engine.name, self.client_id, self.host,
                                       self.region.base, segment_size)
                self._rpc.call(p.MountSegment(self.segment), bool)
            else:
                self._rpc.call(p.Heartbeat(self.client_id), bool)
        except BaseException:
            self._teardown()
            raise
        self.io = ReplicaIO(engine, self.region, self.host, timeout)
        self._thread = threading.Thread(target=self._heartbeat, args=(heartbeat,),
                                        name="mooncake-store-heartbeat", daemon=True)
        self._thread.start()

    # -- liveness --------------------------------------------------------------------------------
    def _heartbeat(self, interval: float) -> None:
        while not self._stop.wait(interval):
            try:
                if not self._beat.call(p.Heartbeat(self.client_id), bool):
                    self._remount()
            except StoreError as e:
                log.warning("store heartbeat: %s", e)

    def _remount(self) -> None:
        """The master forgot us (it restarted): mount again and re-announce what we hold."""
        if self.segment is None or self.region is None:
            return
        log.info("master does not know client %s: re-mounting", self.client_id)
        self._beat.call(p.MountSegment(self.segment), bool)
        for key, replica in self.holdings.verified(self.io.local_view):
            try:
                self._beat.call(p.RegisterExisting(key, [replica]))
            except StoreError as e:
                log.info("cannot re-register %r: %s", key, e)

    # -- API -------------------------------------------------------------------------------------
    def put(self, key: str, data: Any, config: ReplicateConfig | None = None) -> None:
        """Store `data` (bytes-like, numpy array, CPU tensor) under the new key `key`."""
        err = self.batch_put([key], [data], config)[0]
        if err is not None:
            raise err

    def batch_put(self, keys: Sequence[str], values: Sequence[Any],
                  config: ReplicateConfig | None = None) -> list[StoreError | None]:
        """Put each value; one entry per key: None when stored, or the error it met."""
        if len(keys) != len(values):
            raise InvalidParams(f"{len(keys)} keys but {len(values)} values")
        views = [readable(v) for v in values]
        starts = self._rpc.call(p.BatchPutStart(list(keys), [len(v) for v in views], config),
                                list[p.Reply])
        out: list[StoreError | None] = []
        done: list[tuple[int, str, str, Replica | None]] = []
        for i, (key, view, item) in enumerate(zip(keys, views, starts, strict=True)):
            try:
                self.io.write(view, replicas := p.result(item, list[Replica]))
            except StoreError as e:
                if item.ok:
                    self._try(p.PutRevoke(key))
                out.append(e)
                continue
            out.append(None)
            own = [r for r in replicas if r.segment == self.engine.name]
            done.append((i, key, checksum(view), own[0] if own else None))
        if done:
            ends = self._rpc.call(p.BatchPutEnd([d[1] for d in done], [d[2] for d in done]),
                                  list[p.Reply])
            for (i, key, csum, mine), item in zip(done, ends, strict=True):
                try:
                    p.result(item, None)
                except StoreError as e:
                    out[i] = e
                    continue
                if mine is not None:
                    self.holdings.add(key, mine, csum)
        return out

    def get(self, key: str) -> bytes:
        """The value of `key`; ObjectNotFound when there is none."""
        replicas = self._rpc.call(p.GetReplicaList(key), list[Replica])
        return self._get(key, replicas)

    def _get(self, key: str, replicas: Sequence[Replica]) -> bytes:
        buf = bytearray(replicas[0].size if replicas else 0)
        self.io.read(key, replicas, memoryview(buf), buf)
        return bytes(buf)

    def get_into(self, key: str, buffer: Any) -> int:
        """Read `key` into `buffer` (bytearray, numpy array, CPU tensor); the bytes read."""
        try:
            dest = host_view(buffer)[0]
        except ValueError as e:
            raise InvalidParams(f"cannot read into {type(buffer).__name__}: {e}") from None
        replicas = self._rpc.call(p.GetReplicaList(key), list[Replica])
        return self.io.read(key, replicas, dest, buffer)

    def batch_get(self, keys: Sequence[str]) -> list[bytes | StoreError]:
        """The value of each key, or the error it met."""
        items = self._rpc.call(p.BatchGetReplicaList(list(keys)), list[p.Reply])
        out: list[bytes | StoreError] = []
        for key, item in zip(keys, items, strict=True):
            try:
                out.append(self._get(key, p.result(item, list[Replica])))
            except StoreError as e:
                out.append(e)
        return out

    def exists(self, key: str) -> bool:
        return bool(self._rpc.call(p.Exists(key), bool))

    def batch_exists(self, keys: Sequence[str]) -> list[bool | StoreError]:
        items = self._rpc.call(p.BatchExists(list(keys)), list[p.Reply])
        return [self._value(item, bool) for item in items]

    def size(self, key: str) -> int:
        return self.describe(key).size

    def describe(self, key: str) -> ObjectMeta:
        """What the master knows of `key` (size, replicas); grants no lease, counts no access."""
        meta: ObjectMeta = self._rpc.call(p.Describe(key), ObjectMeta)
        return meta

    def remove(self, key: str, force: bool = False) -> None:
        self._rpc.call(p.Remove(key, force))
        self.holdings.discard(key)

    def remove_all(self, force: bool = False) -> int:
        return int(self._rpc.call(p.RemoveAll(force), int))

    def list(self, prefix: str = "") -> list[str]:
        return list(self._rpc.call(p.List(prefix), list[str]))

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
        self._rpc.close()
        self._beat.close()
        self._ctx.term()
        if self.region is not None:
            self.engine.unregister(self.region)
            self.region = None

    def close(self) -> None:
        """Unmount the segment (its replicas are dropped by the master) and release it."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join(timeout=self.timeout + 1)
        if self.segment is not None:
            self._try(p.UnmountSegment(self.segment.name, self.segment.base))
        self._teardown()

    def __enter__(self) -> StoreClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
