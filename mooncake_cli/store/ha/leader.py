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

import msgspec

from mooncake_cli.etcd import EtcdClients, EtcdUrl, is_etcd
from mooncake_cli.store.errors import RpcFailed, StoreCode, StoreError

KEY_PREFIX = "/mooncake/store/"
NOT_LEADER = StoreCode.UNAVAILABLE_IN_CURRENT_STATUS  # the code a standby answers with


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
    return is_etcd(address)


@dataclass(frozen=True)
class HaAddress(EtcdUrl):
    """The etcd endpoints and the cluster name of an `etcd://...` address."""

    @classmethod
    def parse(cls, url: str, what: str = "an HA address") -> HaAddress:
        parsed = EtcdUrl.parse(url, what)
        return cls(parsed.endpoints, parsed.cluster)

    @property
    def key(self) -> str:
        return f"{KEY_PREFIX}{self.cluster}/leader"


class Etcd(EtcdClients):
    """etcd through etcd3gw, trying each endpoint in turn; RpcFailed when none answers."""

    def __init__(self, where: HaAddress, timeout: float) -> None:
        super().__init__(where.endpoints, timeout, RpcFailed)
        self.where = where

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
