"""etcd metadata through etcd3gw (etcd's JSON gateway). A descriptor is attached to a lease
that a keeper thread refreshes; when the engine dies the lease, and the descriptor, expire."""

from __future__ import annotations

from typing import Any

from mooncake_cli.etcd import EtcdClients
from mooncake_cli.interfaces import MetadataError, SegmentDescriptor
from mooncake_cli.transfer.metadata import KEY_PREFIX, Keeper, split_hostport


class EtcdMetadata:
    kind = "etcd"

    def __init__(self, url: str, timeout: float, ttl: float) -> None:
        endpoints = [split_hostport(e, "etcd endpoint")
                     for e in url[len("etcd://"):].split(",") if e.strip()]
        if not endpoints:
            raise MetadataError(f"no etcd endpoint in '{url}'")
        self._etcd = EtcdClients(endpoints, timeout)
        self._each = self._etcd.each
        self._ttl = max(int(ttl), 2)
        self._leases: dict[str, tuple[Any, Keeper]] = {}

    def publish(self, desc: SegmentDescriptor) -> None:
        key, value = KEY_PREFIX + desc.name, desc.to_json().decode()
        self.withdraw_local(desc.name)

        def put(client: Any) -> Any:
            lease = client.lease(ttl=self._ttl)
            client.put(key, value, lease=lease)
            return lease

        held = [self._each("put", put)]

        def refresh() -> None:
            """Keep the lease alive; when it expired anyway (etcd was away longer than the
            TTL, or another endpoint took over), publish again under a fresh lease."""
            try:
                alive = held[0].refresh() > 0
            except Exception:
                alive = False
            if not alive:
                held[0] = self._each("put", put)
                self._leases[desc.name] = (held[0], keeper)

        keeper = Keeper(self._ttl / 3, refresh, f"mooncake-etcd-lease-{desc.name}")
        self._leases[desc.name] = (held[0], keeper)

    def lookup(self, name: str) -> SegmentDescriptor:
        values = self._each("get", lambda c: c.get(KEY_PREFIX + name))
        if not values:
            raise MetadataError(f"segment '{name}' not found in etcd")
        return SegmentDescriptor.from_json(values[0])

    def withdraw_local(self, name: str) -> Any:
        item = self._leases.pop(name, None)
        if item:
            item[1].stop()
        return item

    def withdraw(self, name: str) -> None:
        item = self.withdraw_local(name)
        if item:
            try:
                item[0].revoke()
            except Exception:
                pass
        self._each("delete", lambda c: c.delete(KEY_PREFIX + name))

    def close(self) -> None:
        for name in list(self._leases):
            try:
                self.withdraw(name)
            except MetadataError:
                pass
