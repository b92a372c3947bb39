"""etcd as every role reaches it: `etcd://HOST:PORT[,HOST:PORT...][/CLUSTER]` addresses, and
calls through etcd3gw that go to the first endpoint that answers."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from mooncake_cli.interfaces import ConfigError, MetadataError


def is_etcd(address: str) -> bool:
    return isinstance(address, str) and address.strip().lower().startswith("etcd://")


@dataclass(frozen=True)
class EtcdUrl:
    """The endpoints and the cluster name (default "default") of an etcd:// address."""

    endpoints: tuple[tuple[str, int], ...]
    cluster: str = "default"

    @classmethod
    def parse(cls, url: str, what: str = "an etcd address") -> EtcdUrl:
        if not is_etcd(url):
            raise ConfigError(f"{what} starts with etcd://, not {url!r}")
        hosts, _, cluster = url.strip()[len("etcd://"):].partition("/")
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


class EtcdClients:
    """One etcd3gw client per endpoint; `each` runs a call on the first that answers and
    raises `error` naming every endpoint's failure when none does."""

    def __init__(self, endpoints: Sequence[tuple[str, int]], timeout: float,
                 error: Callable[[str], Exception] = MetadataError) -> None:
        import etcd3gw

        self.endpoints = list(endpoints)
        self.clients = [etcd3gw.client(host=h, port=p, timeout=timeout)
                        for h, p in self.endpoints]
        self._error = error

    def each(self, what: str, fn: Callable[[Any], Any]) -> Any:
        errors = []
        for (host, port), client in zip(self.endpoints, self.clients, strict=True):
            try:
                return fn(client)
            except Exception as e:  # etcd3gw raises requests' and its own errors
                errors.append(f"{host}:{port}: {type(e).__name__}: {e}")
        raise self._error(f"etcd {what} failed on every endpoint: " + "; ".join(errors))
