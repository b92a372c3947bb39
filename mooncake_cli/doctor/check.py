"""What every doctor check returns, and what every check is given."""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from mooncake_cli.interfaces import ConfigError, MooncakeError
from mooncake_cli.transfer.metadata import split_hostport

GROUP_NAMES = ("install", "environment", "metadata", "master", "rdma", "nixl", "memory",
               "network", "topology")


class Status(str, Enum):
    OK = "ok"
    WARN = "warn"
    FAIL = "fail"
    SKIPPED = "skipped"


@dataclass(frozen=True)
class Check:
    """One finding: its group, name, status, the evidence it rests on, and the fix."""

    group: str
    name: str
    status: Status
    evidence: str
    fix: str = ""
    data: Mapping[str, Any] = field(default_factory=dict)  # raw facts for --json

    def to_dict(self) -> dict[str, Any]:
        return {"group": self.group, "check": self.name, "status": self.status.value,
                "evidence": self.evidence, "fix": self.fix, "data": dict(self.data)}


class DoctorFailed(MooncakeError):
    """At least one doctor check failed (exit 1 through the app's error map)."""


@dataclass(frozen=True)
class DoctorConfig:
    """What to check: the cluster's addresses (empty: not checked) and the local plan."""

    metadata: str = "p2p"
    master: str = ""  # HOST:PORT or HA etcd://... of the store master; empty: not checked
    peer: str = ""  # HOST:PORT of a `mooncake transfer serve` target; empty skips the probe
    peer_mtu: int = 0  # the peer's RDMA active MTU, compared with ours (0: unknown)
    relays: tuple[str, ...] = ()  # HOST:PORT of hosts' relays: the link matrix between them
    device: str = ""  # only this RDMA device
    root: str = "/"  # where /sys, /proc and /dev are read (a captured tree in tests)
    segment_size: int = 64 << 20  # bytes the node plans to register
    host: str = "127.0.0.1"  # the engine's listen address
    port: int = 0  # the engine's listen port (0: any)
    secret: str = ""
    timeout: float = 3.0  # seconds per network probe
    loopback: bool = True  # run the live loopback transfer
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))

    def __post_init__(self) -> None:
        if self.master and not self.master.startswith("etcd://"):
            split_hostport(self.master, "--master")
        if self.peer:
            split_hostport(self.peer, "--peer")
        for relay in self.relays:
            split_hostport(relay, "--relay")
        if self.peer_mtu and self.peer_mtu not in (256, 512, 1024, 2048, 4096):
            raise ConfigError(f"--peer-mtu {self.peer_mtu} is not an IB MTU: use 256, 512, "
                              "1024, 2048 or 4096")
        if not os.path.isdir(self.root):
            raise ConfigError(f"--sysfs-root {self.root} is not a directory")
        if self.segment_size < 0:
            raise ConfigError("--segment-size must not be negative")
        if not 0 <= self.port < 65536:
            raise ConfigError(f"--port {self.port} is out of range 0-65535")
        if self.timeout <= 0:
            raise ConfigError("--timeout must be > 0 seconds")

    def path(self, rel: str) -> str:
        """`rel` (like "proc/meminfo") under the configured root."""
        return os.path.join(self.root, rel)

    def cluster_hosts(self) -> list[str]:
        """Hosts the node talks to: metadata endpoints, master, peer, relays."""
        ha = self.master.startswith("etcd://")
        hosts = metadata_hosts("etcd://" + self.master.split("/", 3)[2]) if ha else []
        hosts += [split_hostport(a, "address")[0] for a in (self.master, self.peer,
                                                            *self.relays)
                  if a and not a.startswith("etcd://")]
        return metadata_hosts(self.metadata) + hosts

    def remote_peers(self) -> bool:
        """Whether any configured cluster address is off this host."""
        return any(not is_loopback(h) for h in self.cluster_hosts())


def metadata_hosts(url: str) -> list[str]:
    url = url.strip()
    if url.startswith("etcd://"):
        eps = url[len("etcd://"):].split(",")
    elif url.startswith(("http://", "https://")):
        eps = [url.split("://", 1)[1].split("/", 1)[0]]
    else:
        return []
    out = []
    for e in eps:
        if e.strip():
            host = e.strip().rpartition(":")[0] if ":" in e else e.strip()
            out.append(host.strip("[]"))
    return out


def is_loopback(host: str) -> bool:
    if host.lower() in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def read(path: str) -> str | None:
    try:
        with open(path) as fh:
            return fh.read()
    except OSError:
        return None
