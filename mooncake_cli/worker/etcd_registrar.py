"""The worker's side of instance registration through etcd (`--conductor etcd://...`).

A worker given `--conductor etcd://HOST:PORT[,HOST:PORT][/CLUSTER]` keeps its registration
body (role, name, url, load) under `mooncake_cli.api.registration.cluster_prefix(CLUSTER) + NAME`
(/mooncake/instances/CLUSTER/NAME), attached to a lease of 3 heartbeats that it refreshes
(rewriting the body, so the load stays current); a worker that dies lets the lease, and the key,
expire. A conductor given `--registry etcd://...` watches the prefix
(`mooncake_cli.conductor.registry_watch.RegistryWatch`). With the cluster secret, each body is
signed (`mooncake_cli.http.auth.sign_record`) and the conductor ignores bodies that are
unsigned, wrongly signed or older than a minute.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from mooncake_cli.api.registration import cluster_prefix, encode, parse
from mooncake_cli.etcd import EtcdClients
from mooncake_cli.http.auth import sign_record
from mooncake_cli.interfaces import MetadataError

log = logging.getLogger(__name__)


class _Etcd(EtcdClients):
    """The registry's endpoints and the key prefix of its cluster."""

    def __init__(self, url: str, timeout: float) -> None:
        endpoints, cluster = parse(url)
        super().__init__(endpoints, timeout)
        self.prefix = cluster_prefix(cluster)


class EtcdRegistrar:
    """The worker side: same interface as the HTTP `Registrar` (start, close, registered)."""

    def __init__(self, url: str, payload: Callable[[], dict[str, Any]], interval: float,
                 timeout: float = 5.0, secret: str = "") -> None:
        self.etcd = _Etcd(url, timeout)
        self.payload = payload
        self.secret = secret
        self.interval = interval
        self.ttl = max(2, int(round(interval * 3)))
        self.registered = 0
        self._lease: Any = None
        self._failing = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name="mooncake-worker-etcd-register")

    def start(self) -> EtcdRegistrar:
        self._thread.start()
        return self

    def _publish(self) -> None:
        body = self.payload()
        key = self.etcd.prefix + str(body["name"])
        if self.secret:
            body = sign_record(self.secret, body)

        def put(client: Any) -> None:
            alive = False
            if self._lease is not None:
                try:
                    alive = self._lease.refresh() > 0
                except Exception:
                    alive = False
            if not alive:
                self._lease = client.lease(ttl=self.ttl)
            client.put(key, encode(body), lease=self._lease)

        self.etcd.each("register", put)

    def _run(self) -> None:
        while True:
            try:
                self._publish()
                self.registered += 1
                self._failing = False
            except MetadataError as e:
                if not self._failing:
                    log.warning("cannot register in etcd (will keep trying): %s", e)
                self._failing = True
                self._lease = None
            if self._stop.wait(self.interval):
                return

    def close(self, name: str) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.interval + 5)
        try:
            self.etcd.each("deregister", lambda c: c.delete(self.etcd.prefix + name))
            if self._lease is not None:
                self._lease.revoke()
        except Exception as e:  # the lease expires anyway
            log.warning("could not deregister %s from etcd: %s", name, e)
