"""`tcp` transport: data over the engine's links (the target side is every engine's listener).

Payloads go out with `sendmsg` straight from registered memory and land with `recv_into`
straight into it; the engine opens several links per peer and spreads slices over them. The
listener checks each request against the peer's registered regions and write capabilities,
so this transport has nothing to register and publishes nothing of its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mooncake_cli.transfer.spi import EngineSide, Link, SegmentDescriptor


class TcpEndpoint:
    def __init__(self, engine: EngineSide) -> None:
        self._engine = engine

    def register(self, region: Any) -> Mapping[str, str]:
        return {}  # the listener checks every request against the segment itself

    def unregister(self, region: Any) -> None:
        pass

    def fields(self) -> Mapping[str, str]:
        return {}

    def connect(self, peer: SegmentDescriptor, secret: str | None, timeout: float) -> Link:
        return self._engine.link(peer, timeout, self._engine.encrypt)

    def close(self) -> None:
        pass


class TcpTransport:
    name = "tcp"
    priority = 10
    inline_bytes = 64 << 10  # above this, worker threads overlap the socket round trips
    max_slices = 64

    def why_priority(self) -> str:
        return "auto's fallback: any peer with a listener"

    def available(self) -> tuple[bool, str]:
        return True, ""

    def reachable(self, peer: SegmentDescriptor, local: SegmentDescriptor) -> tuple[bool, str]:
        if peer.host and peer.port > 0:
            return True, f"listener at {peer.host}:{peer.port}"
        return False, "the peer publishes no listener"

    def attach(self, engine: EngineSide) -> TcpEndpoint:
        return TcpEndpoint(engine)
