"""The sockets of the store master's object events (events.py): a ZMQ XPUB publishing vLLM's
batches [topic, sequence number (8 bytes big-endian), msgpack [timestamp, [events...], 0]],
and a ROUTER answering vLLM's replay request (the first missing sequence number as 8 bytes;
the answer: each buffered batch from there as [b"", topic, seq, payload], then the end
marker [b"", b"", -1, b""]) from the last `buffer` batches. Used by one thread only.

The topic is `mooncake-store/<16 random hex digits>`, one per publisher: a subscriber that
sees it change knows the master restarted, whatever sequence number it is at.
"""

from __future__ import annotations

import secrets
import time
from collections import Counter, deque
from collections.abc import Sequence
from typing import Any

import msgspec
import zmq

from mooncake_cli.store.errors import StoreCode, StoreError

END_SEQ = (-1).to_bytes(8, "big", signed=True)
_ENCODER = msgspec.msgpack.Encoder()


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
                         StoreCode.RPC_FAIL) from None
    return endpoint


class EventWire:
    """The bound sockets, the sequence numbers and the replay buffer."""

    def __init__(self, endpoint: str, replay_endpoint: str, buffer: int,
                 counts: Counter[str]) -> None:
        self.counts = counts
        self._ctx = zmq.Context()
        self.pub = self._ctx.socket(zmq.XPUB)
        self.router = self._ctx.socket(zmq.ROUTER)
        for s in (self.pub, self.router):
            s.setsockopt(zmq.LINGER, 0)
        self.pub.setsockopt(zmq.XPUB_VERBOSE, 1)  # every subscription, not just the first
        self.pub.setsockopt(zmq.SNDHWM, 100_000)
        try:
            self.endpoint = _bind(self.pub, endpoint)
            self.replay_endpoint = _bind(self.router, replay_endpoint)
        except StoreError:
            self.close()
            raise
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer)
        self._seq = 0
        self.topic = f"mooncake-store/{secrets.token_hex(8)}".encode()

    def publish(self, events: Sequence[Any]) -> None:
        payload = _ENCODER.encode([time.time(), events, 0])
        seq = self._seq
        self._seq += 1
        try:
            self.pub.send_multipart([self.topic, seq.to_bytes(8, "big"), payload], zmq.NOBLOCK)
        except zmq.Again:  # (a PUB drops for slow subscribers rather than raise; to be sure)
            self.counts["unsent"] += 1
        self._buffer.append((seq, payload))
        self.counts["batches"] += 1

    def joined(self) -> bool:
        """Whether a subscriber joined since the last call (the XPUB's messages read)."""
        joined = False
        while True:
            try:
                msg = self.pub.recv(zmq.NOBLOCK)
            except zmq.Again:
                return joined
            joined |= msg[:1] == b"\x01"

    def replay(self) -> bool:
        """Answer the replay requests waiting; whether one asked from before the buffer."""
        behind = False
        while True:
            try:
                frames = self.router.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return behind
            ident, rest = frames[0], frames[1:]
            if len(rest) != 2 or rest[0] != b"" or len(rest[1]) != 8:
                self.counts["bad_replays"] += 1
                continue
            start = int.from_bytes(rest[1], "big")
            oldest = self._buffer[0][0] if self._buffer else self._seq
            for seq, payload in self._buffer:
                if seq >= start:
                    self.router.send_multipart([ident, b"", self.topic, seq.to_bytes(8, "big"),
                                                payload])
            self.router.send_multipart([ident, b"", b"", END_SEQ, b""])
            self.counts["replays"] += 1
            behind |= start < oldest

    def close(self) -> None:
        self.pub.close()
        self.router.close()
        self._ctx.term()
