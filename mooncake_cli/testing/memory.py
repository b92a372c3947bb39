"""`memory`: an in-process transport for unit tests (httpx's MockTransport idea). Engines of
one process reach each other's segments by a token in their descriptors; every slice is a
bounds-checked copy through `Segment.locate`, and whole batches go through `post`, the path a
one-sided transport takes. `handler`, when set, sees each slice first and may fail it with a
reason (a dead peer, a refusal) before any byte moves.

Not an entry point: tests name it in their own Registry:

    EntryPoint("memory", "mooncake_cli.testing.memory:MemoryTransport", "mooncake.transports")

It imports nothing of mooncake_cli but the service-provider interface (transfer/spi.py).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from mooncake_cli.transfer.spi import (
    EngineSide,
    LocalChannel,
    Memory,
    SegmentDescriptor,
    Slice,
    TransferError,
)

_SEGMENTS: dict[str, Memory] = {}  # token -> memory of a live engine in this process
_LOCK = threading.Lock()

Handler = Callable[[Slice], "str | None"]


class MemoryChannel(LocalChannel):
    """Bounds-checked copies into and out of a peer engine's memory: per request (`read`,
    `write`, LocalChannel's) or whole batches (`post`)."""

    def __init__(self, segment: Memory, transport: MemoryTransport) -> None:
        super().__init__(segment)
        self._transport = transport

    def _copy(self, s: Slice) -> None:
        handler = self._transport.handler
        if handler is not None and (why := handler(s)):
            raise TransferError(why)
        region, start = self._segment.locate(s.remote_offset, s.length)
        if s.op == "read":
            view = s.region.sink(s.start, s.length)
            view[:] = region.load(start, s.length)
            s.region.commit(s.start, view)
        else:
            view = region.sink(start, s.length)
            view[:] = s.region.load(s.start, s.length)
            region.commit(start, view)
        self._transport.moved.append(s)

    def post(self, slices: Sequence[Slice], done: Callable[[int, str | None], None],
             timeout: float) -> None:
        for k, s in enumerate(slices):
            try:
                self._copy(s)
            except TransferError as e:
                done(k, str(e))
                continue
            done(k, None)


class MemoryEndpoint:
    def __init__(self, transport: MemoryTransport, engine: EngineSide) -> None:
        self._transport = transport
        self.token = uuid.uuid4().hex
        with _LOCK:
            _SEGMENTS[self.token] = engine.segment

    def register(self, region: Any) -> Mapping[str, str]:
        return {}

    def unregister(self, region: Any) -> None:
        pass

    def fields(self) -> Mapping[str, str]:
        return {"memory": self.token}

    def connect(self, peer: SegmentDescriptor, secret: str | None,
                timeout: float) -> MemoryChannel:
        segment = _SEGMENTS.get(peer.extra.get("memory", ""))
        if segment is None:
            raise TransferError(f"'{peer.name}' is not an engine of this process")
        return MemoryChannel(segment, self._transport)

    def close(self) -> None:
        with _LOCK:
            _SEGMENTS.pop(self.token, None)


class MemoryTransport:
    name = "memory"
    priority = 100  # wins over every real transport in a test's registry
    inline_bytes = 1 << 62
    max_slices = 1
    batched = True

    def __init__(self) -> None:
        self.handler: Handler | None = None
        self.moved: list[Slice] = []  # every slice that moved bytes, in order

    def available(self) -> tuple[bool, str]:
        return True, ""

    def reachable(self, peer: SegmentDescriptor, local: SegmentDescriptor) -> tuple[bool, str]:
        if peer.extra.get("memory", "") in _SEGMENTS:
            return True, "an engine of this process"
        return False, "not an engine of this process"

    def attach(self, engine: EngineSide) -> MemoryEndpoint:
        return MemoryEndpoint(self, engine)
