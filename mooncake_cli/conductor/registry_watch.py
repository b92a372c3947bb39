"""RegistryWatch: the conductor's side of instance registration through etcd (`--registry`).

Workers keep their registration bodies under `/mooncake/instances/CLUSTER/NAME` on a lease,
rewritten every heartbeat (`mooncake_cli.worker.etcd_registrar.EtcdRegistrar`; the keys and
the encoding are `mooncake_cli.api.registration`'s). The conductor lists the prefix once and
then watches it (`PrefixWatch`): each write registers (or refreshes) its instance, each deleted
key (a worker that left or whose lease expired) deregisters it at once. Several conductors
watching one prefix see the same instances. With the cluster secret, each body must be signed
(`mooncake_cli.http.auth.verify_record`, at most a minute old); unsigned,
wrongly signed, stale or malformed bodies are ignored (logged once per key).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from mooncake_cli.api.errors import ServingError
from mooncake_cli.api.registration import cluster_prefix, decode, parse
from mooncake_cli.conductor.etcd_watch import Entry, PrefixWatch
from mooncake_cli.conductor.instances import Instances
from mooncake_cli.etcd import EtcdClients
from mooncake_cli.http.auth import verify_record

log = logging.getLogger(__name__)


class RegistryWatch:
    """Registers in `instances` every worker found under the registry's prefix;
    `joined(name)` runs after each registration (peers' bookings of a new instance)."""

    def __init__(self, instances: Instances, url: str, timeout: float = 5.0,
                 secret: str = "", joined: Callable[[str], None] | None = None) -> None:
        endpoints, cluster = parse(url)
        self.instances = instances
        self.secret = secret
        self.joined = joined
        self.clients = EtcdClients(endpoints, timeout)
        self.prefix = cluster_prefix(cluster)
        self._names: dict[str, str] = {}  # etcd key -> instance name
        self._bad: set[str] = set()  # keys already warned about
        self.watch = PrefixWatch(self.clients, self.prefix, self, "conductor-etcd-registry")

    @property
    def ready(self) -> bool:
        return self.watch.ready.is_set()

    def start(self, wait: float = 10.0) -> RegistryWatch:
        """Start watching; wait up to `wait` seconds for the first list to be applied."""
        self.watch.start()
        if not self.watch.ready.wait(wait):
            log.warning("the etcd registry did not answer within %.0f s: instances join as "
                        "it does", wait)
        return self

    def close(self) -> None:
        self.watch.close()

    # -- the watch's sink -----------------------------------------------------------------
    def reset(self, entries: list[Entry]) -> None:
        now = {e.key for e in entries}
        for key in list(self._names):
            if key not in now:
                self.delete(key)
        for e in entries:
            self.put(e)

    def put(self, entry: Entry) -> None:
        try:
            body = decode(entry.value)
            if self.secret:
                body = verify_record(self.secret, body)
            name = self.instances.register(body).name
        except (ValueError, TypeError, AttributeError, ServingError) as e:
            if entry.key not in self._bad:
                log.warning("ignoring a bad registration in etcd at %s: %s", entry.key, e)
                self._bad.add(entry.key)
            return
        self._bad.discard(entry.key)
        old = self._names.get(entry.key)
        if old is not None and old != name:
            self.instances.deregister(old)
        self._names[entry.key] = name
        if self.joined is not None:
            self.joined(name)

    def synced(self, revision: int) -> None:
        pass

    def delete(self, key: str) -> None:
        self._bad.discard(key)
        name = self._names.pop(key, None)
        if name is not None and name not in self._names.values():
            self.instances.deregister(name)
