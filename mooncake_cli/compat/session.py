"""`setup` of the compat store: upstream's 13 parameters (or one dict of them) -> a transfer
engine and a store client.

`local_hostname` is a name, as upstream: "HOST" or "HOST:PORT" (the port only names it); the
engine listens on HOST at a free port from MC_STORE_CLIENT_MIN_PORT..MC_STORE_CLIENT_MAX_PORT
(12300-14300), and the segment is HOST:that port, so any number of clients may share one name.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import time
from dataclasses import dataclass
from typing import Any

from mooncake_cli.compat.rdma import rdma_transport
from mooncake_cli.config import TransferConfig, parse_size
from mooncake_cli.http.auth import env_secret
from mooncake_cli.interfaces import ConfigError, MooncakeError
from mooncake_cli.registry import Registry
from mooncake_cli.store.errors import StoreCode, StoreError
from mooncake_cli.store.ha.leader import LeaderResolver, is_ha
from mooncake_cli.transfer.engine import TransferEngine

log = logging.getLogger("mooncake.compat")
PARAMS = ("local_hostname", "metadata_server", "global_segment_size", "local_buffer_size",
          "protocol", "rdma_devices", "master_server_addr", "engine", "enable_ssd_offload",
          "ssd_offload_path", "tenant_id", "enable_client_http_server", "client_http_port")
DICT_ONLY = ("ipc_socket_path",)
MiB = 1 << 20
PORTS = (12300, 14300)


def bad(message: str) -> StoreError:
    return StoreError(message, StoreCode.INVALID_PARAMS)


@dataclass(frozen=True)
class SetupArgs:
    """upstream's setup parameters, checked."""

    host: str
    metadata: str
    segment: int
    buffer: int
    protocol: str
    master: str
    engine: Any = None
    ssd_dir: str | None = None
    tenant: str = "default"

    @classmethod
    def parse(cls, args: tuple[Any, ...], kwargs: dict[str, Any]) -> SetupArgs:
        """From setup's arguments (positional, keyword, or one dict); TypeError for a call
        upstream's pybind signature refuses, StoreError(INVALID_PARAMS) for bad values."""
        if len(args) == 1 and isinstance(args[0], dict) and not kwargs:
            conf = dict(args[0])
            unknown = sorted(set(conf) - set(PARAMS) - set(DICT_ONLY))
            if unknown:
                log.warning("setup: ignoring unknown keys %s", ", ".join(unknown))
            if "local_hostname" not in conf or "metadata_server" not in conf:
                raise bad("setup(dict) needs local_hostname and metadata_server")
            values = {k: conf[k] for k in PARAMS if k in conf}
        else:
            if len(args) > len(PARAMS):
                raise TypeError(f"setup() takes at most {len(PARAMS)} arguments")
            values = dict(zip(PARAMS, args, strict=False))
            for k, v in kwargs.items():
                if k not in PARAMS or k in values:
                    raise TypeError(f"setup() got an unexpected or repeated argument {k!r}")
                values[k] = v
            missing = [k for k in PARAMS[:7] if k not in values]
            if missing:
                raise TypeError(f"setup() missing arguments: {', '.join(missing)}")
        return cls._checked(values)

    @classmethod
    def _checked(cls, v: dict[str, Any]) -> SetupArgs:
        try:
            segment = parse_size(v.get("global_segment_size", 16 * MiB))
            buffer = parse_size(v.get("local_buffer_size", 16 * MiB))
        except (ConfigError, ValueError, TypeError) as e:
            raise bad(f"setup: {e}") from None
        host = str(v["local_hostname"]).strip()
        name, _, port = host.rpartition(":")
        host = name if port.isdigit() and name else host
        if not host or any(c in host for c in " /"):
            raise bad(f"setup: local_hostname {v['local_hostname']!r} is not a host name")
        master = str(v.get("master_server_addr", "127.0.0.1:50051"))
        if "://" in master and not is_ha(master):
            raise bad(f"setup: master_server_addr must be HOST:PORT or etcd://HOST:PORT, "
                      f"not {master}")
        if v.get("tenant_id", "default") != "default":
            log.warning("setup: tenant_id %r: this store has one key space for all tenants",
                        v["tenant_id"])
        if v.get("enable_client_http_server"):
            log.warning("setup: the client HTTP server is not served here (the store "
                        "master serves /metrics: `mooncake store master --metrics-port`)")
        ssd = str(v.get("ssd_offload_path") or os.environ.get("MOONCAKE_OFFLOAD_FILE_STORAGE_PATH",
                                                              "")) or None
        return cls(host.strip("[]"), metadata_url(str(v["metadata_server"])), segment, buffer,
                   str(v.get("protocol", "tcp")), master, v.get("engine"),
                   ssd if v.get("enable_ssd_offload") else None,
                   str(v.get("tenant_id", "default")))


def metadata_url(url: str) -> str:
    if url.strip().lower() in ("p2phandshake", "p2p", ""):
        return "p2p"
    if not url.startswith(("http://", "https://", "etcd://")) and "://" in url:
        raise bad(f"setup: metadata_server {url!r} is not P2PHANDSHAKE, http:// or etcd://")
    return url if "://" in url else f"etcd://{url}"  # upstream: a bare HOST:PORT is etcd


def ssd_size(args: SetupArgs) -> int:
    """The SSD segment's size: 4 x global_segment_size, or the size of the data file already in
    ssd_offload_path when that is bigger (upstream sets up over whatever the directory holds;
    a smaller file is grown)."""
    from mooncake_backends.ssd import DATA

    try:
        have = os.path.getsize(os.path.join(args.ssd_dir or "", DATA))
    except OSError:
        have = 0
    return max(4 * args.segment, have)


def master_reachable(address: str, timeout: float) -> bool:
    """A quick TCP probe of HOST:PORT (of the leader an etcd://... address publishes), so a dead
    master fails setup at once (not after RPC timeouts). ConfigError for a bad etcd address."""
    if is_ha(address):
        try:
            address = LeaderResolver(address, timeout).wait(time.monotonic() + timeout).address
        except StoreError:
            return False
    host, _, port = str(address).rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout).close()
    except (OSError, ValueError):
        return False
    return True


def port_range() -> tuple[int, int]:
    try:
        low = int(os.environ.get("MC_STORE_CLIENT_MIN_PORT", PORTS[0]))
        high = int(os.environ.get("MC_STORE_CLIENT_MAX_PORT", PORTS[1]))
    except ValueError:
        raise bad("MC_STORE_CLIENT_MIN_PORT / MAX_PORT must be port numbers") from None
    if not 0 < low <= high < 65536:
        raise bad(f"client port range {low}-{high} is not within 1-65535")
    return low, high


def start_engine(args: SetupArgs, registry: Registry, timeout: float) -> TransferEngine:
    """A transfer engine listening on args.host at a free port of `port_range()`."""
    names = registry.names("mooncake.transports")
    if args.protocol == "rdma":  # nixl, or a warning naming what runs instead
        transport = rdma_transport(registry)
    else:
        transport = args.protocol if args.protocol in names else "auto"
        if transport != args.protocol:
            log.warning("protocol %r is not available here: using %s", args.protocol,
                        transport)
    low, high = port_range()
    ports = random.sample(range(low, high + 1), min(64, high - low + 1))
    last: Exception | None = None
    for port in ports:
        try:
            config = TransferConfig(host=args.host, port=port, metadata=args.metadata,
                                    transport=transport, timeout=timeout, secret=env_secret())
            return TransferEngine(config, registry)
        except ConfigError as e:
            raise bad(f"setup: {e}") from None
        except (MooncakeError, OSError) as e:  # taken: the next one
            last = e
    raise StoreError(f"setup: no free port in {low}-{high} on {args.host}: {last}",
                     StoreCode.INTERNAL_ERROR)
