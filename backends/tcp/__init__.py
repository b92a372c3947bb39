"""`tcp` transport: the engine's wire protocol over TCP sockets.

Payloads go out with `sendmsg` straight from registered memory and land with `recv_into`
straight into it; the engine opens several connections per peer and spreads slices over them.
"""

from __future__ import annotations

from mooncake_cli.interfaces import SegmentDescriptor
from mooncake_cli.transfer.client import TargetClient


class TcpTransport:
    name = "tcp"
    priority = 10
    inline_bytes = 64 << 10  # above this, worker threads overlap the socket round trips
    max_slices = 64

    def available(self) -> tuple[bool, str]:
        return True, ""

    def reachable(self, peer: SegmentDescriptor, local: SegmentDescriptor) -> bool:
        return bool(peer.host) and peer.port > 0

    def connect(self, peer: SegmentDescriptor, secret: str | None, timeout: float) -> TargetClient:
        return TargetClient(peer.host, peer.port, secret, timeout)
