"""`tcp` transport: the engine's wire protocol over TCP sockets.

Payloads go out with `sendmsg` straight from registered memory and land with `recv_into`
straight into it; the engine opens several connections per peer and spreads slices over them.
Its endpoint owns the engine's listener (`TargetServer`), which also answers DESCRIBE for p2p
metadata and proves the secret for same-host transports.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mooncake_backends.tcp.server import TargetServer

from mooncake_cli.interfaces import EngineSide, SegmentDescriptor
from mooncake_cli.transfer.client import TargetClient


class TcpEndpoint:
    def __init__(self, engine: EngineSide) -> None:
        self.server = TargetServer(engine.segment, engine.describe, engine.host, engine.port,
                                   engine.secret, grants=engine.grants,
                                   encrypt=engine.encrypt)
        self.port: int = self.server.port
        self._encrypt = engine.encrypt

    @property
    def audit(self) -> Any:
        return self.server.audit

    @audit.setter
    def audit(self, log: Any) -> None:
        self.server.audit = log

    def register(self, region: Any) -> Mapping[str, str]:
        return {}  # the listener checks every request against the segment itself

    def unregister(self, region: Any) -> None:
        pass

    def fields(self) -> Mapping[str, str]:
        return {}

    def connect(self, peer: SegmentDescriptor, secret: str | None, timeout: float) -> TargetClient:
        return TargetClient(peer.host, peer.port, secret, timeout, self._encrypt)

    def close(self) -> None:
        self.server.close()


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
