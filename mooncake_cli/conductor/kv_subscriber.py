"""One thread per registered event stream: a ZMQ SUB socket on the publisher's endpoint, its
batches in sequence-number order into a `StreamIndex`, missed ones asked of the replay endpoint.

vLLM's replay protocol (`vllm/distributed/kv_events.py`, a ROUTER): send the first missing
sequence number as 8 bytes big-endian; the answer is every buffered batch from there on as
[topic, seq, payload], then [b"", -1 as 8 bytes, b""]. It is asked here through a DEALER, so
each frame list starts with the empty delimiter.

Order: batches are applied once each, in order. A batch ahead of the next expected number is a
gap: the replay's batches from the expected one up to it are applied first (those it no longer
buffers, or all of them without a replay endpoint, are counted `unrecovered`). The first batch
seen opens a gap from 0, so a conductor that registers a running engine gets what its buffer
still holds. A number below the expected one is a restarted publisher: the stream starts over
(its blocks forgotten). A malformed message is counted and logged (rarely), never raised.
With `clear_on_loss` (a store master's stream, whose events are not idempotent hints but the
only record of what it holds), a gap the replay cannot fill forgets the index first: the
master answers such a replay with a resync (`cleared`, then all it holds). Its topic names
the master's process: another topic is a restarted master, read as a sequence number going
back (a restart found by the numbers alone would miss one that has published more by the
time we reconnect).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Sequence
from typing import Protocol

import zmq

from mooncake_cli.conductor.kv_events import Event, Malformed, decode_batch, sequence_number

log = logging.getLogger(__name__)
END_SEQ = (-1).to_bytes(8, "big", signed=True)
MAX_MESSAGE = 32 << 20  # bytes of one ZMQ message (a bigger one drops the connection)
RCV_HWM = 10_000  # batches queued in the SUB socket before ZMQ drops (then: a gap, a replay)


class Index(Protocol):
    """What a stream's events go into (event_index.StreamIndex, store_index.StoreIndex)."""

    def apply(self, events: Sequence[Event]) -> None: ...

    def clear(self) -> None: ...


class Subscriber:
    """`sub` is connected by the caller (so a bad endpoint is the caller's error)."""

    def __init__(self, ctx: zmq.Context, sub: zmq.Socket, replay_endpoint: str | None,
                 index: Index, name: str, replay_timeout: float = 2.0,
                 clear_on_loss: bool = False) -> None:
        self.ctx, self.sub, self.replay_endpoint = ctx, sub, replay_endpoint
        self.index, self.name, self.replay_timeout = index, name, replay_timeout
        self.clear_on_loss = clear_on_loss
        self.topic: bytes | None = None
        self.counts: Counter[str] = Counter()
        self.expected = 0
        self._dealer: zmq.Socket | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"kv-events-{name}")

    @staticmethod
    def connect(ctx: zmq.Context, endpoint: str) -> zmq.Socket:
        """A SUB socket on `endpoint`, all topics; zmq.ZMQError for a bad endpoint."""
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.RCVHWM, RCV_HWM)
        sub.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        try:
            sub.connect(endpoint)
        except zmq.ZMQError:
            sub.close(linger=0)
            raise
        return sub

    def start(self) -> Subscriber:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Asks the thread to end (within its 0.1 s poll); `join` waits for it."""
        self._stop.set()

    def join(self, timeout: float = 5.0) -> None:
        self._thread.join(timeout)

    def alive(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                if self.sub.poll(100):
                    frames = self.sub.recv_multipart(zmq.NOBLOCK)
                    try:
                        self.handle(frames)
                    except Exception:  # a bug here must not end the stream's events
                        self.counts["errors"] += 1
                        log.exception("kv events of %s: a batch failed", self.name)
        except zmq.ZMQError as e:  # the context terminated under us: closing
            if not self._stop.is_set():
                log.warning("kv events of %s: %s; no more events from it", self.name, e)
        finally:
            self.sub.close(linger=0)
            if self._dealer is not None:
                self._dealer.close(linger=0)

    # -- one message ----------------------------------------------------------------------
    def handle(self, frames: list[bytes]) -> None:
        try:
            if len(frames) != 3:
                raise Malformed(f"{len(frames)} frames (topic, seq, payload expected)")
            seq = sequence_number(frames[1])
        except Malformed as e:
            self._malformed(e)
            return
        restarted = seq < self.expected
        if self.clear_on_loss:  # a store master: its topic names its process
            restarted |= self.topic is not None and frames[0] != self.topic
            self.topic = frames[0]
        if restarted:
            self.counts["restarts"] += 1
            log.warning("kv events of %s: the publisher restarted (sequence number %d after "
                        "%d); its blocks are forgotten", self.name, seq, self.expected - 1)
            self.index.clear()
            self.expected = 0
        if seq > self.expected:
            self._fill(seq)
        self._apply(seq, frames[2])

    def _apply(self, seq: int, payload: bytes) -> None:
        self.expected = seq + 1
        self.counts["batches"] += 1
        try:
            batch = decode_batch(payload)
        except Malformed as e:
            self._malformed(e)
            return
        good = [ev for ev in batch.events if not isinstance(ev, Malformed)]
        for bad in batch.events:
            if isinstance(bad, Malformed):
                self._malformed(bad, "event")
        self.counts["events"] += len(good)
        self.index.apply(good)

    def _malformed(self, e: Malformed, what: str = "message") -> None:
        self.counts[f"malformed_{what}s"] += 1
        n = self.counts[f"malformed_{what}s"]
        if n & (n - 1) == 0:  # the 1st, 2nd, 4th, 8th...: seen, without flooding the log
            log.warning("kv events of %s: malformed %s skipped (%d so far): %s",
                        self.name, what, n, e)

    # -- gaps -----------------------------------------------------------------------------
    def _fill(self, upto: int) -> None:
        """Apply the batches [expected, upto) from the replay endpoint."""
        self.counts["gaps"] += 1
        start = self.expected
        got = self._replay(start, upto) if self.replay_endpoint else {}
        if self.clear_on_loss and len(got) < upto - start:
            self.counts["cleared_on_loss"] += 1
            self.index.clear()
        for seq in range(start, upto):
            payload = got.get(seq)
            if payload is None:
                self.counts["unrecovered"] += 1
                continue
            self.counts["replayed"] += 1
            self._apply(seq, payload)
        if len(got) < upto - start:
            log.warning("kv events of %s: batches %d to %d missed, %d of them not replayed",
                        self.name, start, upto - 1, upto - start - len(got))
        self.expected = upto

    def _replay(self, start: int, upto: int) -> dict[int, bytes]:
        if self._dealer is None:
            self._dealer = self.ctx.socket(zmq.DEALER)
            self._dealer.setsockopt(zmq.LINGER, 0)
            self._dealer.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE)
            self._dealer.connect(self.replay_endpoint or "")
        dealer = self._dealer
        dealer.send_multipart([b"", start.to_bytes(8, "big")])
        out: dict[int, bytes] = {}
        deadline = time.monotonic() + 10 * self.replay_timeout  # for the whole answer
        while True:
            if time.monotonic() > deadline or not dealer.poll(int(self.replay_timeout * 1000)):
                log.warning("kv events of %s: no answer from the replay endpoint %s within "
                            "%g s", self.name, self.replay_endpoint, self.replay_timeout)
                dealer.close(linger=0)  # a late answer must not be read as the next one's
                self._dealer = None
                return out
            frames = dealer.recv_multipart()
            if len(frames) != 4 or frames[0] != b"" or len(frames[2]) != 8:
                self._malformed(Malformed(f"replay answer of {len(frames)} frames"))
                continue
            if frames[2] == END_SEQ:
                return out
            seq = int.from_bytes(frames[2], "big")
            if start <= seq < upto:
                out[seq] = frames[3]
