"""`initialize` of the compat transfer engine: upstream's arguments -> an addressed engine.

upstream's `local_hostname` is "HOST" or "HOST:PORT"; with P2PHANDSHAKE the segment is named
HOST:RPC_PORT (the port it listens on, `get_rpc_port`), otherwise it is named `local_hostname`
in the metadata server (`http://...`, `etcd://...`, or a bare HOST:PORT of etcd).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from mooncake_cli.compat.rdma import rdma_transport
from mooncake_cli.compat.session import metadata_url
from mooncake_cli.config import TransferConfig
from mooncake_cli.http.auth import env_secret
from mooncake_cli.registry import Registry
from mooncake_cli.transfer.engine import TransferEngine

log = logging.getLogger("mooncake.compat")
METADATA_TYPES = ("", "p2p", "p2phandshake", "http", "etcd")


@dataclass(frozen=True)
class EngineArgs:
    host: str
    port: int
    name: str  # the segment name ("" for p2p: HOST:RPC_PORT)
    metadata: str
    protocol: str

    @classmethod
    def parse(cls, local_hostname: str, metadata_server: str, protocol: str,
              device_name: str, metadata_type: str = "") -> EngineArgs:
        """ValueError (or TypeError for a non-string) saying what is wrong."""
        for what, v in (("local_hostname", local_hostname), ("metadata_server", metadata_server),
                        ("protocol", protocol), ("device_name", device_name),
                        ("metadata_type", metadata_type)):
            if not isinstance(v, str):
                raise TypeError(f"{what} must be a string, not {type(v).__name__}")
        if metadata_type.lower() not in METADATA_TYPES:
            raise ValueError(f"metadata_type {metadata_type!r}: use p2p, http or etcd")
        name = local_hostname.strip()
        host, _, port = name.rpartition(":")
        if not (host and port.isdigit()):
            host, port = name, "0"
        host = host.strip("[]")
        if not host or any(c in host for c in " /"):
            raise ValueError(f"local_hostname {local_hostname!r} is not a host name")
        if not 0 <= int(port) < 65536:
            raise ValueError(f"local_hostname {local_hostname!r}: port out of range")
        meta = metadata_url(metadata_server)
        if meta == "p2p":
            name = ""
        return cls(host, int(port), name, meta, protocol.strip().lower())


def transport_for(protocol: str, registry: Registry) -> str:
    """Our transport choice for upstream's protocol name (see compat/engine.py)."""
    if protocol == "tcp":
        return "tcp"
    if protocol == "rdma":
        return rdma_transport(registry)
    if protocol not in ("", "auto", "shm"):
        log.warning("protocol %r is not provided here: using every available transport",
                    protocol)
    return "auto"


def start(args: EngineArgs, registry: Registry) -> TransferEngine:
    """An engine listening on args.host (at args.port, or a free one) whose segment addresses
    are virtual addresses."""
    config = TransferConfig(host=args.host, port=args.port, name=args.name,
                            metadata=args.metadata, secret=env_secret(),
                            transport=transport_for(args.protocol, registry))
    return TransferEngine(config, registry, addressed=True)
