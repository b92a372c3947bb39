"""The transfer engine: register memory as a named segment, publish it, and move bytes to and
from peer segments in batches over the best transport that reaches each peer.

    engine = TransferEngine(TransferConfig(), Registry.from_env())
    region = engine.allocate(64 << 20)              # or engine.register(numpy_array)
    batch = engine.submit([TransferRequest(Op.READ, region, 0, "127.0.0.1:15000", 0, 4096)])
    statuses = batch.wait(timeout=5)
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from typing import Any

from mooncake_cli.config import TransferConfig
from mooncake_cli.interfaces import MooncakeError, SegmentDescriptor, TransferError
from mooncake_cli.registry import Registry
from mooncake_cli.transfer.batch import Batch, Op, State, Status, TransferRequest
from mooncake_cli.transfer.capability import Grants
from mooncake_cli.transfer.directory import PeerDirectory, pick_transports
from mooncake_cli.transfer.dispatch import MIN_SLICE, cut, post_all, run_slice
from mooncake_cli.transfer.endpoints import Endpoints
from mooncake_cli.transfer.engine_side import EngineServices
from mooncake_cli.transfer.hostinfo import boot_id, hostname
from mooncake_cli.transfer.linkstats import LinkStats
from mooncake_cli.transfer.listener import TargetServer
from mooncake_cli.transfer.metadata_open import open_metadata
from mooncake_cli.transfer.peers import Peer
from mooncake_cli.transfer.segment import Region, Segment
from mooncake_cli.transfer.spi import Slice

log = logging.getLogger("mooncake.transfer")

MAX_OFFSET = 1 << 64  # offsets travel as u64: a range past this is outside every segment
__all__ = ["MIN_SLICE", "TransferEngine", "cut"]


class TransferEngine:
    def __init__(self, config: TransferConfig, registry: Registry,
                 addressed: bool = False) -> None:
        """`addressed`: each region's offset is its virtual address in this process (upstream
        Mooncake's addressing, see Segment), not a compact offset."""
        self.config = config
        self.registry = registry
        transports = pick_transports(registry, config.transport)
        self._secret = config.secret or None
        # TLS reads one 16 KiB record per call, each releasing the GIL: threads streaming in
        # parallel then queue for it (one stream is ~2x faster here than four)
        self._connections = 1 if config.encrypt else config.connections
        self.segment = Segment("", addressed)
        self.grants = Grants()  # write capabilities for guarded regions (see `guard`)
        # the engine's own listener: secret proof, DESCRIBE, and READ/WRITE with bounds and
        # capability checks, whatever transports this process has
        self.listener = TargetServer(self.segment, self._describe_bytes, config.host,
                                     config.port, self._secret, grants=self.grants,
                                     encrypt=config.encrypt)
        try:
            self.endpoints = Endpoints(registry, EngineServices(
                self.segment, self.grants, self._describe_bytes, self._secret, config.timeout,
                config.encrypt))
        except BaseException:
            self.listener.close()
            raise
        self._port = self.listener.port
        advertise = config.advertise or (config.host if config.host not in ("0.0.0.0", "::", "")
                                         else hostname())
        self.address = f"{advertise}:{self._port}"
        p2p = config.metadata.strip().lower() in ("p2p", "p2phandshake", "")
        if p2p and config.name and config.name != self.address:
            log.warning("p2p metadata names a segment by its address: using %s, not %s",
                        self.address, config.name)
        self.name = self.segment.name = self.address if p2p or not config.name else config.name
        self._p2p = p2p  # the descriptor leaves only by DESCRIBE (else: by each publish)
        self._boot_id = boot_id()
        try:
            self.metadata = open_metadata(config.metadata, self._secret, config.timeout,
                                          config.metadata_ttl)
            self._publish()
        except BaseException:
            self.endpoints.close()
            self.listener.close()
            raise
        self._dir = PeerDirectory(transports, self.endpoints, self.metadata, self.name,
                                  self.segment, self.descriptor, self._secret, config.timeout,
                                  self._connections)
        self._buffers: dict[int, Any] = {}
        self.links = LinkStats()  # bytes and seconds per peer and direction (linkstats.py)
        self._queue: queue.SimpleQueue[tuple[Any, ...] | None] = queue.SimpleQueue()
        self._workers = [threading.Thread(target=self._work, name=f"mooncake-worker-{i}",
                                          daemon=True) for i in range(config.workers)]
        for w in self._workers:
            w.start()
        self._closed = False

    # -- memory -------------------------------------------------------------------------------
    def register(self, obj: Any, location: str | None = None, guarded: bool = False) -> Region:
        """Register a writable buffer (bytearray, numpy array, tensor, mmap) as a region; every
        transport registers it too (NIXL pins it, shm publishes its name). `guarded`: as
        `guard`, from the start (no transport ever offers it to unchecked writes)."""
        try:
            region = self.segment.register(obj, location)
        except ValueError as e:
            raise TransferError(f"cannot register memory: {e}") from e
        if guarded:
            self.grants.guard(region.base, region.length)
        self._attach(region)
        return region

    def allocate(self, size: int, tier: str = "dram", shared: bool = True) -> Region:
        """A fresh zeroed region from a tier plugin; shm-backed so same-host peers can map it."""
        buf = self.registry.get("mooncake.tiers", tier).allocate(size, shared=shared)
        region = self.segment.register(buf, shm=buf.shm, view=buf.view)
        self._buffers[region.base] = buf
        self._attach(region)
        return region

    def _attach(self, region: Region) -> None:
        try:
            self.endpoints.register(region)
        except Exception as e:
            self.segment.unregister(region)
            buf = self._buffers.pop(region.base, None)
            if buf is not None:
                buf.close()
            raise TransferError(f"cannot register memory with a transport: {e}") from e
        self._republish()

    def set_audit(self, audit: Any) -> None:
        """Record refused accesses and each served connection's transfers (peer, requests,
        bytes, duration, status) in `audit` (a mooncake_cli.http.audit.AuditLog, or None)."""
        self.listener.audit = audit
        for ep in self.endpoints.by_name.values():
            if hasattr(ep, "audit"):
                ep.audit = audit

    def guard(self, region: Region) -> None:
        """Peers' WRITEs into `region` need a capability from `grants.issue` (checked by the
        listener for every write; shm withdraws its cross-memory copies of it; one-sided
        transports such as nixl do not check it)."""
        self.grants.guard(region.base, region.length)
        self.endpoints.withdraw(region)
        self._republish()

    def unregister(self, region: Region) -> None:
        self.grants.unguard(region.base)
        self.segment.unregister(region)
        self.endpoints.unregister(region)
        buf = self._buffers.pop(region.base, None)
        self._republish()
        if buf is not None:
            buf.close()

    def _republish(self) -> None:
        if hasattr(self, "_dir"):
            self._publish()

    def _publish(self) -> None:
        self.metadata.publish(self.descriptor(public=True))
        if not self._p2p:
            self.endpoints.shown()

    def descriptor(self, public: bool = False) -> SegmentDescriptor:
        """This segment as peers see it; `public` (what metadata servers get) leaves out the
        fields a transport gives only to peers that proved the secret."""
        return SegmentDescriptor(self.name, self.address.rpartition(":")[0], self._port,
                                 self._boot_id, os.getpid(), self._secret is not None,
                                 tuple(r.info() for r in self.segment.regions),
                                 self.endpoints.fields(public and self._secret is not None))

    def _describe_bytes(self) -> bytes:  # DESCRIBE answers behind the secret handshake
        self.endpoints.shown()
        return self.descriptor().to_json()

    # -- peers --------------------------------------------------------------------------------
    def _peer(self, name: str) -> Peer:
        return self._dir.get(name)

    def transport_for(self, name: str) -> str:
        """The name of the transport used for segment `name` (resolving it if needed)."""
        return self._peer(name).name

    def transport_choices(self) -> dict[str, tuple[str, str]]:
        """Each peer resolved so far -> (transport, why it was chosen)."""
        return dict(self._dir.choices)

    # -- transfers ----------------------------------------------------------------------------
    def submit(self, requests: list[TransferRequest]) -> Batch:
        """Queue a batch and return at once (small batches complete before returning)."""
        if self._closed:
            raise TransferError("engine is closed")
        batch = Batch(list(requests), self.links.batch_done)
        work: list[tuple[Any, ...]] = []
        fresh: dict[str, SegmentDescriptor] = {}
        whole: dict[int, tuple[Peer, list[tuple[int, Slice]]]] = {}  # batched peers' share
        inline = 1 << 62  # the batch runs in this thread if it fits every peer's inline budget
        total = 0
        for i, r in enumerate(batch.requests):
            if not 0 <= r.local_offset <= r.local_offset + r.length <= r.local.length:
                batch.fail(i, f"local out of bounds: [{r.local_offset}, "
                              f"{r.local_offset + r.length}) of a {r.local.length}-byte region")
                continue
            if r.target_offset < 0 or r.target_offset + r.length > MAX_OFFSET:
                batch.fail(i, f"target out of bounds: [{r.target_offset}, "
                              f"{r.target_offset + r.length}) is outside any segment")
                continue
            try:
                peer = self._peer(r.target)
            except MooncakeError as e:
                batch.fail(i, str(e))
                continue
            if peer.desc.region_for(r.target_offset, r.length) is None:
                refused = self._dir.recheck(peer, r.target, r.target_offset, r.length, fresh)
                if refused:  # refuse it whole: no in-bounds slice of it may move
                    batch.fail(i, refused)
                    continue
            if peer.batched:
                batch.expect(i, 1)
                whole.setdefault(id(peer), (peer, []))[1].append(
                    (i, Slice(r.op.value, r.local, r.local_offset, r.length, r.target_offset)))
                continue
            if peer.inline_bytes < inline:
                inline = peer.inline_bytes
            total += r.length
            if r.length <= MIN_SLICE or peer.max_slices == 1:
                batch.expect(i, 1)
                work.append((batch, i, peer, r.op, r.local, r.local_offset, r.length,
                             r.target_offset, r.capability))
                continue
            parts = cut(r.length, min(self._connections, peer.max_slices),
                        self.config.slice_size)
            batch.expect(i, len(parts))
            for off, n in parts:
                work.append((batch, i, peer, r.op, r.local, r.local_offset + off, n,
                             r.target_offset + off, r.capability))
        for peer, slices in whole.values():
            post_all(batch, peer, slices, self.config.timeout)
        if len(work) <= 1 or total <= inline:
            for w in work:  # nothing to overlap: a hand-off would only add two wake-ups
                self._run(*w)
        else:  # workers take all but the last slice; this thread runs that one meanwhile
            for w in work[:-1]:
                self._queue.put((*w, False))  # workers must not busy-poll: they share the GIL
            self._run(*work[-1])
        return batch

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            self._run(*item)

    _run = staticmethod(run_slice)

    def mapped(self, target: str, offset: int, length: int) -> memoryview | None:
        """Segment `target`'s `length` bytes at `offset` as this process maps them, when its
        transport maps a same-host peer's memory (shm), so a caller can read them with its
        own loop (the store's copy that verifies as it goes); None otherwise, or on any
        failure (then use a transfer, which says why)."""
        try:
            peer = self._peer(target)
            ch = peer.acquire(block=False)
        except MooncakeError:
            return None
        if ch is None:
            return None
        try:
            view = getattr(ch, "view", None)
            return view(offset, length) if view is not None else None
        except MooncakeError:
            return None
        finally:
            peer.release(ch)

    def transfer(self, op: Op, region: Region, local_offset: int, target: str,
                 target_offset: int, length: int, timeout: float | None = None) -> Status:
        """One request, waited for; TransferError with the reason when it fails."""
        batch = self.submit([TransferRequest(op, region, local_offset, target, target_offset,
                                             length)])
        status = batch.wait(timeout if timeout is not None else self.config.timeout * 2)[0]
        if status.state is not State.COMPLETED:
            raise TransferError(status.reason or f"{op.value} timed out")
        return status

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for _ in self._workers:
            self._queue.put(None)
        try:
            self.metadata.withdraw(self.name)
        except MooncakeError:
            pass
        self.metadata.close()
        self._dir.close()
        self.endpoints.close()
        self.listener.close()
        for w in self._workers:
            w.join(timeout=2)
        for buf in self._buffers.values():
            buf.close()
        self._buffers.clear()

    def __enter__(self) -> TransferEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
