"""The store master's object events, published over ZMQ as the shared KV events contract has
them (docs/indexer.md#store-streams): one `stored` per object and medium when a put ends (or a
replica lands on another tier), one `removed` when that medium's last complete replica goes
(removed, evicted, offloaded away, expired, its node gone), `cleared` when the master's state
starts over (a new master, an HA term won or lost) and before a resync.

Wire: vLLM's batches, [topic b"", sequence number (8 bytes big-endian), msgpack
[timestamp, [events...], 0]], each event a map in the standard envelope with `object_key`
({"event_type", "event_id", "timestamp", "object_key", "medium" ("cpu": DRAM, "disk": SSD),
"backend_id"}). A ROUTER answers vLLM's replay request from the last `buffer` batches.

The master's request path only appends to a deque under the lock it already holds
(`changed`) and wakes this thread through a pipe; nothing there blocks. Past `queue_size`
waiting events the queue stops taking them (counted `dropped`) and the thread resyncs:
under the master's lock it empties the queue and copies the object table, then publishes
`cleared` and one `stored` per held object and medium. A replay asked from before the oldest
buffered batch (a subscriber too far behind) gets what is buffered and the same resync.
A new subscriber (the XPUB hears it) gets an empty batch, so it learns the next number and
asks the replay endpoint for what came before.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import Counter, deque
from typing import TYPE_CHECKING, Any

import msgspec
import zmq

from mooncake_cli.store.errors import ErrorCode, StoreError
from mooncake_cli.store.records import ObjectMeta, ReplicaStatus

if TYPE_CHECKING:
    from mooncake_cli.store.master.facade import StoreMaster

log = logging.getLogger("mooncake.store.events")
MEDIA = {"dram": "cpu", "ssd": "disk"}
END_SEQ = (-1).to_bytes(8, "big", signed=True)
_NONE: frozenset[str] = frozenset()
_COMPLETE = ReplicaStatus.COMPLETE
_ENCODER = msgspec.msgpack.Encoder()


def held_tiers(meta: ObjectMeta | None) -> frozenset[str]:
    """The tiers where `meta` has a complete replica (none while its put is under way)."""
    if meta is None or meta.put_deadline is not None:
        return _NONE
    return frozenset(r.tier for r in meta.replicas if r.status is _COMPLETE)


def endpoint_of(value: str, host: str = "127.0.0.1") -> str:
    """A publisher endpoint from `value`: tcp://HOST:PORT, ipc://PATH, or a bare PORT on
    `host` (the master's listen address)."""
    if value.isdigit():
        value = f"tcp://[{host}]:{value}" if ":" in host else f"tcp://{host}:{value}"
    replay_of(value)  # StoreError when it is neither
    return value


def replay_of(endpoint: str) -> str:
    """The replay endpoint derived from a publisher's: the next TCP port (0 stays 0: any free
    one), or the IPC path with ".replay" appended."""
    if endpoint.startswith("ipc://"):
        return endpoint + ".replay"
    base, _, port = endpoint.rpartition(":")
    if not endpoint.startswith("tcp://") or not port.isdigit():
        raise StoreError(f"kv events endpoint {endpoint!r}: use tcp://HOST:PORT or ipc://PATH",
                         ErrorCode.INVALID_PARAMS)
    return f"{base}:{int(port) + 1 if int(port) else 0}"


def _bind(sock: zmq.Socket, endpoint: str) -> str:
    """Bind `endpoint` (a TCP port 0: any free one); the endpoint bound."""
    base, _, port = endpoint.rpartition(":")
    try:
        if endpoint.startswith("tcp://") and port == "0":
            sock.bind(f"{base}:*")
            return sock.getsockopt_string(zmq.LAST_ENDPOINT)
        sock.bind(endpoint)
    except zmq.ZMQError as e:
        raise StoreError(f"cannot publish kv events on {endpoint}: {e}",
                         ErrorCode.RPC_FAIL) from None
    return endpoint


class ObjectEvents:
    """Publishes the object events of the master `attach`ed last, on `endpoint` (and serves
    replays on `replay_endpoint`, derived by default: see `replay_of`)."""

    def __init__(self, endpoint: str, replay_endpoint: str | None = None, *,
                 backend_id: str = "", queue_size: int = 1 << 16, buffer: int = 10_000,
                 max_batch: int = 512) -> None:
        self.backend_id, self.queue_size, self.max_batch = backend_id, queue_size, max_batch
        replay = replay_endpoint or replay_of(endpoint)
        self.counts: Counter[str] = Counter()
        self._ctx = zmq.Context()
        self._pub = self._ctx.socket(zmq.XPUB)
        self._router = self._ctx.socket(zmq.ROUTER)
        for s in (self._pub, self._router):
            s.setsockopt(zmq.LINGER, 0)
        self._pub.setsockopt(zmq.XPUB_VERBOSE, 1)  # every subscription, not just the first
        self._pub.setsockopt(zmq.SNDHWM, 100_000)
        try:
            self.endpoint = _bind(self._pub, endpoint)
            self.replay_endpoint = _bind(self._router, replay)
        except StoreError:
            self._pub.close()
            self._router.close()
            self._ctx.term()
            raise
        self._queue: deque[tuple[str, str, str]] = deque()  # (event_type, key, tier)
        self._overflow = False
        self._resync = False
        self._master: StoreMaster | None = None
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer)
        self._seq = self._event_id = 0
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
            self.counts["dropped"] += len(before ^ after)
            return
        key = new.key if new is not None else old.key if old is not None else ""
        q = self._queue
        for tier in before - after:
            q.append(("removed", key, tier))
        for tier in after - before:
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
        poller = zmq.Poller()
        poller.register(self._pub, zmq.POLLIN)
        poller.register(self._router, zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        while not self._stop.is_set():
            try:
                ready = dict(poller.poll(200))
                if self._wake_r in ready:
                    try:
                        os.read(self._wake_r, 4096)
                    except BlockingIOError:
                        pass
                    self._signaled = False
                if self._pub in ready:
                    self._subscriptions()
                if self._router in ready:
                    self._replay()
                if self._overflow or self._resync:
                    self._resync_now()
                self._drain()
            except Exception:  # a bug must not end the events (nor the master)
                self.counts["errors"] += 1
                log.exception("kv events: publishing failed")

    def _subscriptions(self) -> None:
        joined = False
        while True:
            try:
                msg = self._pub.recv(zmq.NOBLOCK)
            except zmq.Again:
                break
            joined |= msg[:1] == b"\x01"
        if joined:
            self.counts["subscribed"] += 1
            self._publish([])

    def _drain(self) -> None:
        q = self._queue
        events: list[dict[str, Any]] = []
        stamp = int(time.time() * 1000)
        while q:
            kind, key, tier = q.popleft()
            if kind == "cleared":
                if events:
                    self._publish(events)
                    events = []
                self._publish([self._event("cleared", "", "", stamp)])
                continue
            events.append(self._event(kind, key, tier, stamp))
            if len(events) >= self.max_batch:
                self._publish(events)
                events = []
        if events:
            self._publish(events)

    def _event(self, kind: str, key: str, tier: str, stamp: int) -> dict[str, Any]:
        self._event_id += 1
        self.counts[kind] += 1
        ev: dict[str, Any] = {"event_type": kind, "event_id": self._event_id - 1,
                              "timestamp": stamp, "backend_id": self.backend_id}
        if kind != "cleared":
            ev["object_key"] = key
            ev["medium"] = MEDIA.get(tier, tier)
        return ev

    def _publish(self, events: list[dict[str, Any]]) -> None:
        payload = _ENCODER.encode([time.time(), events, 0])
        seq = self._seq
        self._seq += 1
        try:
            self._pub.send_multipart([b"", seq.to_bytes(8, "big"), payload], zmq.NOBLOCK)
        except zmq.Again:  # (a PUB drops for slow subscribers rather than raise; to be sure)
            self.counts["unsent"] += 1
        self._buffer.append((seq, payload))
        self.counts["batches"] += 1

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
        stamp = int(time.time() * 1000)
        self._publish([self._event("cleared", "", "", stamp)])
        events: list[dict[str, Any]] = []
        for meta in metas:
            for tier in sorted(held_tiers(meta)):
                events.append(self._event("stored", meta.key, tier, stamp))
                if len(events) >= self.max_batch:
                    self._publish(events)
                    events = []
        if events:
            self._publish(events)

    def _replay(self) -> None:
        while True:
            try:
                frames = self._router.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            ident, rest = frames[0], frames[1:]
            if len(rest) != 2 or rest[0] != b"" or len(rest[1]) != 8:
                self.counts["bad_replays"] += 1
                continue
            start = int.from_bytes(rest[1], "big")
            oldest = self._buffer[0][0] if self._buffer else self._seq
            for seq, payload in self._buffer:
                if seq >= start:
                    self._router.send_multipart([ident, b"", b"", seq.to_bytes(8, "big"),
                                                 payload])
            self._router.send_multipart([ident, b"", b"", END_SEQ, b""])
            self.counts["replays"] += 1
            if start < oldest:  # the asker missed more than is buffered
                self._resync = True

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
        self._pub.close()
        self._router.close()
        self._ctx.term()
        os.close(self._wake_r)
        os.close(self._wake_w)
