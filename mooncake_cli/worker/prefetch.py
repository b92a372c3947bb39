"""Prefetch: while a request waits for this prefill worker (in the conductor's queue, or in this
worker's own queue behind other requests), pull the stored leading blocks of its prompt that
this worker's own segment does not hold -- from other hosts' DRAM or SSD segments -- into its own
segment, as replicas. The prefill then reads them with a local copy instead of a transfer.

One thread pulls, a chunk of about `chunk_bytes` at a time (one store lookup, one batch of
reads, one replica add), one request after another in arrival order. A prefetch stops between
two chunks when it is cancelled (its request left the queue) or claimed (its prefill begins: the
blocks not pulled yet are read by the prefill itself, and the claim waits for the chunk in
flight so that no block is read twice). A prefetch nobody claimed is stopped and dropped when
the next one starts `ttl` seconds or more after it; at most `limit` wait at once (more are
refused, never queued unbounded). Blocks already held here, in either tier, are left where they
are. A prefill's own load of its prefix goes first: chunks wait while one runs (`loading`), so
that the link serves the request at the head, and the reads the prefill reports are its own.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from mooncake_cli.interfaces import MooncakeError
from mooncake_cli.store.errors import ObjectAlreadyExists, StoreError
from mooncake_cli.worker.metrics import WorkerMetrics
from mooncake_cli.worker.prefix import PrefixStore

log = logging.getLogger("mooncake.worker")


@dataclass
class Pull:
    """One request's prefetch and what it did."""

    request_id: str
    keys: list[str]
    reason: str  # "queue": the conductor asked while the request waits there; "busy": here
    arrived: float = field(default_factory=time.monotonic)
    held: int = 0  # leading blocks this segment held already
    pulled: int = 0  # blocks given a replica here by this prefetch
    bytes: int = 0
    seconds: float = 0.0
    state: str = "waiting"  # -> pulling -> done | stopped (claimed, cancelled) | failed
    stop: threading.Event = field(default_factory=threading.Event)
    finished: threading.Event = field(default_factory=threading.Event)

    def report(self) -> dict[str, object]:
        return {"request_id": self.request_id, "reason": self.reason, "state": self.state,
                "held": self.held, "pulled": self.pulled, "bytes": self.bytes,
                "seconds": round(self.seconds, 6)}


class Prefetcher:
    """The prefetches of one prefill worker (thread-safe)."""

    def __init__(self, prefix: PrefixStore, metrics: WorkerMetrics, chunk_bytes: int = 4 << 20,
                 limit: int = 256, ttl: float = 120.0) -> None:
        self.prefix = prefix
        self.metrics = metrics
        self.chunk = max(1, chunk_bytes // max(1, prefix.wire.object_bytes))
        self.limit, self.ttl = limit, ttl
        self._lock = threading.Lock()
        self._pulls: dict[str, Pull] = {}
        self._gate = threading.Lock()  # held by a chunk, or by a prefill's load
        self._todo: queue.Queue[Pull | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="mooncake-prefetch", daemon=True)
        self._thread.start()

    @property
    def own(self) -> str | None:
        """This worker's segment (None: it contributes none, so it cannot prefetch)."""
        store = self.prefix.store
        return store.engine.name if store.owner.segment is not None else None

    def start(self, request_id: str, keys: Sequence[str], reason: str) -> Pull | None:
        """Queue a prefetch of `keys` (the prompt's block keys) for `request_id`; the one under
        way when there is one; None when this worker cannot prefetch or `limit` are waiting."""
        if self.own is None or not keys:
            return None
        with self._lock:
            self._expire()
            if request_id in self._pulls:
                return self._pulls[request_id]
            if len(self._pulls) >= self.limit:
                return None
            pull = self._pulls[request_id] = Pull(request_id, list(keys), reason)
        self.metrics.add("prefetches")
        self._todo.put(pull)
        return pull

    def cancel(self, request_id: str) -> Pull | None:
        """Stop and forget the prefetch of `request_id` (what it pulled stays stored)."""
        with self._lock:
            pull = self._pulls.pop(request_id, None)
        if pull is not None and not pull.finished.is_set():
            pull.stop.set()
            self.metrics.add("prefetches_cancelled")
        return pull

    def claim(self, request_id: str, timeout: float = 30.0) -> Pull | None:
        """The prefill of `request_id` begins: its prefetch stops after the chunk in flight,
        which is waited for; what it did (None: there was none)."""
        with self._lock:
            pull = self._pulls.pop(request_id, None)
        if pull is None:
            return None
        pull.stop.set()
        if not pull.finished.wait(timeout):
            log.warning("prefetch of %s did not stop within %.0f s", request_id, timeout)
        return pull

    def pulls(self) -> list[Pull]:
        """The prefetches not yet claimed or cancelled, oldest first."""
        with self._lock:
            return list(self._pulls.values())

    @contextmanager
    def loading(self) -> Iterator[None]:
        """A prefill loads its prefix: no chunk runs meanwhile."""
        with self._gate:
            yield

    def get(self, request_id: str) -> Pull | None:
        """The prefetch of `request_id` not yet claimed or cancelled, if one."""
        with self._lock:
            return self._pulls.get(request_id)

    def close(self) -> None:
        with self._lock:
            pulls = list(self._pulls.values())
            self._pulls.clear()
        for pull in pulls:
            pull.stop.set()
        self._todo.put(None)
        self._thread.join(timeout=10)

    def _expire(self) -> None:  # lock held
        now = time.monotonic()
        for rid, pull in list(self._pulls.items()):
            if now - pull.arrived > self.ttl:
                del self._pulls[rid]
                pull.stop.set()

    # -- the pulling thread -------------------------------------------------------------------
    def _run(self) -> None:
        while (pull := self._todo.get()) is not None:
            pull.state = "pulling"
            try:
                pull.state = "done" if self._pull(pull) else "stopped"
            except (MooncakeError, OSError) as e:
                pull.state = "failed"
                log.info("prefetch of %s failed: %s", pull.request_id, e)
            except Exception:  # the thread must survive any one prefetch
                pull.state = "failed"
                log.exception("prefetch of %s failed", pull.request_id)
            finally:
                pull.finished.set()

    def _missing(self, pull: Pull) -> list[str]:
        """The leading stored blocks this segment lacks (the run ends at an unstored block)."""
        own, out = self.own, []
        try:
            metas = self.prefix.store.batch_describe(pull.keys)
        except StoreError as e:
            log.info("prefetch of %s: store lookup failed: %s", pull.request_id, e)
            return []
        for key, meta in zip(pull.keys, metas, strict=True):
            if isinstance(meta, StoreError):
                break
            if any(r.segment == own for r in meta.replicas):
                pull.held += 1
            else:
                out.append(key)
        return out

    def _pull(self, pull: Pull) -> bool:
        """Pull `pull`'s missing blocks; False when it was stopped before the end."""
        store, size = self.prefix.store, self.prefix.wire.object_bytes
        if pull.stop.is_set():
            return False
        missing = self._missing(pull)
        for at in range(0, len(missing), self.chunk):
            if pull.stop.is_set():
                return False
            keys = missing[at:at + self.chunk]
            bufs = [torch.empty(size, dtype=torch.uint8) for _ in keys]
            with self._gate:
                if pull.stop.is_set():  # claimed or cancelled while a prefill loaded
                    return False
                t = time.perf_counter()
                got = store.batch_get_into(keys, bufs)
                read = [(k, b) for k, b, n in zip(keys, bufs, got, strict=True) if n == size]
                errors = store.batch_add_replica([k for k, _ in read], [b for _, b in read]) \
                    if read else []
                pull.seconds += time.perf_counter() - t
            added = sum(1 for e in errors if e is None or isinstance(e, ObjectAlreadyExists))
            pull.pulled += added
            pull.bytes += added * size
            self.metrics.add("prefetched_blocks", added)
            if added < len(keys):  # gone, unreadable or no room here: the prefill reads it
                break
        return True
