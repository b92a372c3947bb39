"""The store master's object events, published over ZMQ as the shared KV events contract has
them (docs/indexer.md#store-streams): one `stored` per object and medium when a put ends (or a
replica lands on another tier), one `removed` when that medium's last complete replica goes
(removed, evicted, offloaded away, expired, its node gone), `cleared` when the master's state
starts over (a new master, an HA term won or lost) and before a resync.

Wire: vLLM's batches and replay (event_wire.py), each event a map in the standard envelope
with `object_key` ({"event_type", "event_id", "timestamp", "object_key", "medium" ("cpu":
DRAM, "disk": SSD), "backend_id"}).

The master's request path only appends to a deque under the lock it already holds
(`changed`) and wakes this thread through a pipe; nothing there blocks. Past `queue_size`
waiting events the queue stops taking them (counted `dropped`) and the thread resyncs:
under the master's lock it empties the queue and copies the object table, then publishes
`cleared` and one `stored` per held object and medium. A replay asked from before the oldest
buffered batch (a subscriber too far behind) gets what is buffered and the same resync (at
most one a second; an overflowed queue takes no events until then).
A new subscriber (the XPUB hears it) gets an empty batch, so it learns the next number and
asks the replay endpoint for what came before.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import Counter, deque
from typing import TYPE_CHECKING

import msgspec
import zmq

from mooncake_cli.api.kv_events import replay_of
from mooncake_cli.store.master.event_wire import EventWire
from mooncake_cli.store.records import ObjectMeta, ReplicaStatus

if TYPE_CHECKING:
    from mooncake_cli.store.master.facade import StoreMaster

log = logging.getLogger("mooncake.store.events")
MEDIA = {"dram": "cpu", "ssd": "disk"}
COALESCE = 0.001  # seconds the thread waits after a wake-up for more changes to batch
RESYNC_EVERY = 1.0  # seconds between resyncs at most (each sends all the master holds)
BITS = {"dram": 1, "ssd": 2}  # a set of tiers as bits: the hook runs in the request path
TIERS_OF = [tuple(t for t, b in BITS.items() if mask & b) for mask in range(4)]
_COMPLETE = ReplicaStatus.COMPLETE
__all__ = ["ObjectEvents", "held_tiers"]


def held_tiers(meta: ObjectMeta | None) -> int:
    """The tiers (BITS) where `meta` has a complete replica (none while its put is under
    way)."""
    if meta is None or meta.put_deadline is not None:
        return 0
    reps = meta.replicas
    if len(reps) == 1:  # most objects: no loop
        r = reps[0]
        return BITS[r.tier] if r.status is _COMPLETE else 0
    mask = 0
    for r in reps:
        if r.status is _COMPLETE:
            mask |= BITS[r.tier]
    return mask


class Event(msgspec.Struct, omit_defaults=True, gc=False):
    """One event as the standard envelope has it (encoded as a map; a struct encodes in half
    a dict's time and is never tracked by the garbage collector)."""

    event_type: str
    event_id: int
    timestamp: int
    backend_id: str
    object_key: str | None = None
    medium: str | None = None


class ObjectEvents:
    """Publishes the object events of the master `attach`ed last, on `endpoint` (and serves
    replays on `replay_endpoint`, derived by default: see `replay_of`)."""

    def __init__(self, endpoint: str, replay_endpoint: str | None = None, *,
                 backend_id: str = "", queue_size: int = 1 << 16, buffer: int = 10_000,
                 max_batch: int = 128) -> None:
        self.backend_id, self.queue_size, self.max_batch = backend_id, queue_size, max_batch
        self.counts: Counter[str] = Counter()
        self._wire = wire = EventWire(endpoint, replay_endpoint or replay_of(endpoint), buffer,
                                      self.counts)
        self.endpoint, self.replay_endpoint = wire.endpoint, wire.replay_endpoint
        self._queue: deque[tuple[str, str, str]] = deque()  # (event_type, key, tier)
        self._overflow = False
        self._resync = False
        self._next_resync = 0.0
        self._master: StoreMaster | None = None
        self._event_id = 0
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._signaled = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="mooncake-store-events",
                                        daemon=True)
        self._thread.start()

    # -- the master's side (its lock held) ---------------------------------------------------
    def attach(self, master: StoreMaster) -> None:
        """Publish `master`'s changes from now on (a `cleared` first), no longer the last's."""
        old = self._master
        if old is not None:
            with old.state.lock:
                old.state.events = None
        with master.state.lock:
            self._master = master
            self._queue.append(("cleared", "", ""))
            master.state.events = self.changed
        self._wake()

    def changed(self, old: ObjectMeta | None, new: ObjectMeta | None) -> None:
        """An object changed from `old` to `new` (None: absent)."""
        before, after = held_tiers(old), held_tiers(new)
        if before == after:
            return
        if self._overflow:
            self.counts["dropped"] += len(TIERS_OF[before ^ after])
            return
        key = new.key if new is not None else old.key if old is not None else ""
        q = self._queue
        for tier in TIERS_OF[before & ~after]:
            q.append(("removed", key, tier))
        for tier in TIERS_OF[after & ~before]:
            q.append(("stored", key, tier))
        if len(q) > self.queue_size:
            self._overflow = True
        self._wake()

    def _wake(self) -> None:
        if not self._signaled:
            self._signaled = True
            try:
                os.write(self._wake_w, b"\0")
            except BlockingIOError:  # the pipe is full: the thread is awake anyway
                pass

    # -- the publisher thread --------------------------------------------------------------
    def _run(self) -> None:
        wire, poller = self._wire, zmq.Poller()
        poller.register(wire.pub, zmq.POLLIN)
        poller.register(wire.router, zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        while not self._stop.is_set():
            try:
                ready = dict(poller.poll(200))
                if self._wake_r in ready:
                    if len(self._queue) < self.max_batch:
                        time.sleep(COALESCE)  # more changes per batch; none wake us meanwhile
                    try:
                        os.read(self._wake_r, 4096)
                    except BlockingIOError:
                        pass
                    self._signaled = False
                if wire.pub in ready and wire.joined():  # it learns the next number
                    self.counts["subscribed"] += 1
                    wire.publish([])
                if wire.router in ready and wire.replay():  # the asker missed too much
                    self._resync = True
                if (self._overflow or self._resync) and time.monotonic() >= self._next_resync:
                    self._next_resync = time.monotonic() + RESYNC_EVERY
                    self._resync_now()
                self._drain()
            except Exception:  # a bug must not end the events (nor the master)
                self.counts["errors"] += 1
                log.exception("kv events: publishing failed")

    def _drain(self) -> None:
        q = self._queue
        items: list[tuple[str, str, str]] = []
        while q:
            item = q.popleft()
            if item[0] == "cleared":  # a batch of its own, in its place
                if items:
                    self._send(items)
                    items = []
                self._send([item])
                continue
            items.append(item)
            if len(items) >= self.max_batch:
                self._send(items)
                items = []
        if items:
            self._send(items)

    def _send(self, items: list[tuple[str, str, str]]) -> None:
        """One batch of (event_type, key, tier); then the GIL is let go, so that the master's
        threads never wait for it long (a thread in a syscall waits for the holder's switch
        interval, 5 ms, when the holder does not let go by itself)."""
        stamp, first, backend = int(time.time() * 1000), self._event_id, self.backend_id
        self._event_id += len(items)
        events = [Event(kind, first + i, stamp, backend) if kind == "cleared" else
                  Event(kind, first + i, stamp, backend, key, MEDIA.get(tier, tier))
                  for i, (kind, key, tier) in enumerate(items)]
        for kind in ("stored", "removed", "cleared"):
            if c := sum(1 for it in items if it[0] == kind):
                self.counts[kind] += c
        self._wire.publish(events)
        time.sleep(0)

    def _resync_now(self) -> None:
        """`cleared`, then what the master holds now, instead of what the queue held."""
        master = self._master
        self.counts["resyncs"] += 1
        metas: list[ObjectMeta] = []
        if master is not None:
            with master.state.lock:
                self._queue.clear()
                self._overflow = self._resync = False
                metas = list(master.state.objects.values())
        else:
            self._queue.clear()
            self._overflow = self._resync = False
        self._send([("cleared", "", "")])
        for i in range(0, len(metas), self.max_batch):
            items = [("stored", meta.key, t) for meta in metas[i:i + self.max_batch]
                     for t in TIERS_OF[held_tiers(meta)]]
            if items:
                self._send(items)

    def close(self) -> None:
        """Stop publishing (the master goes on without events)."""
        if self._stop.is_set():
            return
        master = self._master
        if master is not None:
            with master.state.lock:
                master.state.events = None
        self._stop.set()
        self._thread.join(timeout=5)
        self._wire.close()
        os.close(self._wake_r)
        os.close(self._wake_w)
