"""Where a prefill worker's vLLM publishes its KV events (vLLM's `--kv-events-config`: ZMQ PUB
batches of BlockStored, BlockRemoved, AllBlocksCleared, and a ROUTER that replays missed ones).
The worker's registration names them (`kv_events`): the conductor subscribes and routes on
what they say this worker holds (mooncake_cli/conductor/event_routing.py).

A worker listening on loopback publishes on Unix sockets in a folder only its user can enter
(vLLM binds ipc:// endpoints; a tcp:// one on 127.0.0.1 it would connect to, not bind). One
listening beyond loopback publishes on two free TCP ports of every interface (vLLM binds
tcp://* only), advertised at the address peers reach it at.
"""

from __future__ import annotations

import ipaddress
import shutil
import socket
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class EventSockets:
    bind: str  # what vLLM binds its PUB socket to
    bind_replay: str
    endpoint: str  # what a subscriber connects to
    replay_endpoint: str
    folder: Path | None = None  # the Unix sockets' folder (loopback)

    @classmethod
    def open(cls, listen_host: str, reach: str) -> EventSockets:
        if _loopback(listen_host):
            folder = Path(tempfile.mkdtemp(prefix="mooncake-vllm-events-"))
            pub, replay = f"ipc://{folder}/pub", f"ipc://{folder}/replay"
            return cls(pub, replay, pub, replay, folder)
        port, replay_port = _free_port(), _free_port()
        host = f"[{reach}]" if ":" in reach else reach
        return cls(f"tcp://*:{port}", f"tcp://*:{replay_port}", f"tcp://{host}:{port}",
                   f"tcp://{host}:{replay_port}")

    def config(self) -> dict[str, Any]:
        """vLLM's KVEventsConfig."""
        return {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": self.bind,
                "replay_endpoint": self.bind_replay, "topic": ""}

    def registration(self, block_size: int) -> dict[str, Any]:
        """The `kv_events` of the worker's registration (mooncake_cli.api.roles.KvEvents)."""
        return {"endpoint": self.endpoint, "replay_endpoint": self.replay_endpoint,
                "block_size": block_size}

    def close(self) -> None:
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
