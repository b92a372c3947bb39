"""The engine's side as its transports see it (`spi.EngineSide`): its memory, write
capabilities and descriptor, and the services of the engine's listener protocol that a
transport uses instead of speaking it: links to peers' listeners and doors on its own sockets."""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

from mooncake_cli.interfaces import SegmentDescriptor
from mooncake_cli.transfer.capability import Grants
from mooncake_cli.transfer.client import TargetClient
from mooncake_cli.transfer.door import Door
from mooncake_cli.transfer.segment import Segment


class EngineServices:
    def __init__(self, segment: Segment, grants: Grants, describe: Callable[[], bytes],
                 secret: str | None, timeout: float, encrypt: bool) -> None:
        self.segment, self.grants, self._describe = segment, grants, describe
        self.secret, self.timeout, self.encrypt = secret, timeout, encrypt

    def describe(self) -> bytes:
        return self._describe()

    def link(self, peer: SegmentDescriptor, timeout: float, encrypt: bool = False) -> TargetClient:
        return TargetClient(peer.host, peer.port, self.secret, timeout, encrypt)

    def door(self, sock: socket.socket, magic: bytes, serve: Callable[[Any], None], name: str,
             limit: int = 64, handshake_timeout: float = 5.0) -> Door:
        return Door(sock, magic, self.secret, serve, name, limit, handshake_timeout)
