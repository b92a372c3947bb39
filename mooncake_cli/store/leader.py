"""Who leads the store: the leader record a master publishes in etcd, and how clients find it.

An HA address is `etcd://HOST:PORT[,HOST:PORT...][/CLUSTER]` (CLUSTER defaults to "default"):
the masters of one cluster campaign for the key `/mooncake/store/CLUSTER/leader`, attached to
the winner's lease; its value is the leader's JSON record {"address": "H:P", "id": ...}. The
key's etcd create-revision is the leader's term: it grows with every election.

    where = HaAddress.parse("etcd://127.0.0.1:2379/prod")
    info = LeaderResolver(where).lookup()     # LeaderInfo or None while nobody leads
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import msgspec

from mooncake_cli.interfaces import ConfigError
from mooncake_cli.store.errors import ErrorCode, RpcFailed, StoreError

KEY_PREFIX = "/mooncake/store/"
NOT_LEADER = ErrorCode.UNAVAILABLE_IN_CURRENT_STATUS  # the code a standby answers with


class NotLeader(StoreError):
    """Sent by a standby master: it serves nothing; the message names the leader."""

    code = NOT_LEADER


class LeaderInfo(msgspec.Struct, frozen=True):
    """The leading master: its RPC address, its term (0 without HA) and election id."""

    address: str
    term: int = 0
    id: str = ""
    ha: bool = False


def is_ha(address: str) -> bool:
    return isinstance(address, str) and address.strip().lower().startswith("etcd://")


@dataclass(frozen=True)
class HaAddress:
    """The etcd endpoints and the cluster name of an `etcd://...` address."""

    endpoints: tuple[tuple[str, int], ...]
    cluster: str = "default"

    @classmethod
    def parse(cls, url: str) -> HaAddress:
        if not is_ha(url):
            raise ConfigError(f"an HA address starts with etcd://, not {url!r}")
        rest = url.strip()[len("etcd://"):]
        hosts, _, cluster = rest.partition("/")
        cluster = cluster.strip("/") or "default"
        if not all(c.isalnum() or c in "-_." for c in cluster):
            raise ConfigError(f"bad cluster name {cluster!r} in {url!r}: use letters, digits, "
                              f"'-', '_' and '.'")
        endpoints = []
        for item in hosts.split(","):
            host, sep, port = item.strip().rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ConfigError(f"bad etcd endpoint {item!r} in {url!r}: expected HOST:PORT "
                                  f"(etcd://HOST:PORT[,HOST:PORT...][/CLUSTER])")
            endpoints.append((host.strip("[]"), int(port)))
        return cls(tuple(endpoints), cluster)

    @property
    def key(self) -> str:
        return f"{KEY_PREFIX}{self.cluster}/leader"


class Etcd:
    """etcd through etcd3gw, trying each endpoint in turn."""

    def __init__(self, where: HaAddress, timeout: float) -> None:
        import etcd3gw

        self.where = where
        self.clients = [etcd3gw.client(host=h, port=p, timeout=timeout)
                        for h, p in where.endpoints]

    def each(self, what: str, fn: Any) -> Any:
        """`fn(client)` on the first endpoint that answers; RpcFailed when none does."""
        errors = []
        for (host, port), client in zip(self.where.endpoints, self.clients, strict=True):
            try:
                return fn(client)
            except Exception as e:  # etcd3gw raises requests' and its own errors
                errors.append(f"{host}:{port}: {type(e).__name__}: {e}")
        raise RpcFailed(f"etcd {what} failed on every endpoint: " + "; ".join(errors))

    def leader(self) -> LeaderInfo | None:
        """The leader record in etcd now, or None while nobody leads."""
        items = self.each("get", lambda c: c.get(self.where.key, metadata=True))
        if not items:
            return None
        value, meta = items[0]
        try:
            record = json.loads(value)
            return LeaderInfo(str(record["address"]), int(meta["create_revision"]),
                              str(record.get("id", "")), True)
        except (ValueError, KeyError, TypeError):
            return None  # not ours: treat as nobody leading


class LeaderResolver:
    """Finds the leader of an HA store for clients."""

    def __init__(self, url: str, timeout: float = 2.0) -> None:
        self.where = HaAddress.parse(url)
        self.url = url
        self._etcd = Etcd(self.where, timeout)

    def lookup(self) -> LeaderInfo | None:
        """The leader now (None while an election is on); RpcFailed when etcd is unreachable."""
        return self._etcd.leader()

    def wait(self, deadline: float, interval: float = 0.1) -> LeaderInfo:
        """Poll until a leader is published; RpcFailed at `deadline` (time.monotonic())."""
        last = "no leader is published"
        while True:
            try:
                info = self.lookup()
                if info is not None:
                    return info
            except RpcFailed as e:
                last = str(e)
            if time.monotonic() + interval > deadline:
                raise RpcFailed(f"no store leader found at {self.url}: {last}")
            time.sleep(interval)
