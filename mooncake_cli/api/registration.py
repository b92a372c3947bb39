"""Instance registration as both sides see it: what a worker writes and a conductor reads.

A worker registers over HTTP (`mooncake_cli.worker.registration.Registrar`: a `roles.Registration`
POSTed to REGISTER as a heartbeat, a `roles.Deregistration` to DEREGISTER when it leaves) or in
etcd (`mooncake_cli.worker.etcd_registrar.EtcdRegistrar`: the registration body, `encode`d and
signed with the cluster secret when there is one, under `cluster_prefix(cluster) + name` on a
lease). The conductor serves the paths (`mooncake_cli.conductor.http_front`) or watches the
prefix (`mooncake_cli.conductor.registry_watch.RegistryWatch`, which `decode`s each body).
"""

from __future__ import annotations

import json
from typing import Any

from mooncake_cli.etcd import EtcdUrl

PREFIX = "/mooncake/instances/"  # etcd keys: PREFIX + CLUSTER + "/" + NAME
REGISTER = "/v1/instances/register"
DEREGISTER = "/v1/instances/deregister"


def parse(url: str) -> tuple[list[tuple[str, int]], str]:
    """([(host, port), ...], cluster) of an etcd://H:P[,H:P][/CLUSTER] URL."""
    where = EtcdUrl.parse(url, "an etcd registry")
    return list(where.endpoints), where.cluster


def cluster_prefix(cluster: str) -> str:
    """The etcd prefix under which `cluster`'s workers keep their registrations."""
    return f"{PREFIX}{cluster}/"


def encode(body: dict[str, Any]) -> str:
    """A registration body as it is stored in etcd."""
    return json.dumps(body)


def decode(value: str | bytes) -> dict[str, Any]:
    """The body `encode` stored; ValueError when it is not a JSON object."""
    body = json.loads(value)
    if not isinstance(body, dict):
        raise ValueError(f"a registration must be a JSON object, not {body!r:.80}")
    return body
