"""etcd metadata checks through etcd's own HTTP endpoints (/version, /health, the v3 JSON
gateway): reachable, healthy, advertised client URLs, a put/get/delete probe, stale segments."""

from __future__ import annotations

import base64
import json
import os
import secrets
import socket
from typing import Any
from urllib.parse import urlsplit

from mooncake_cli.doctor.check import Check, DoctorConfig, Status, is_loopback
from mooncake_cli.doctor.http_probe import describe, identify, request
from mooncake_cli.interfaces import MetadataError, SegmentDescriptor
from mooncake_cli.transfer.metadata import KEY_PREFIX, split_hostport

G = "metadata"
MAX_STALE_PROBES = 64


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _prefix_end(prefix: str) -> str:
    raw = bytearray(prefix.encode())
    raw[-1] += 1
    return base64.b64encode(bytes(raw)).decode()


def gateway(host: str, port: int, op: str, body: dict[str, Any], timeout: float) -> Any:
    """POST to etcd's v3 JSON gateway; MetadataError on an error reply."""
    r = request(host, port, "POST", f"/v3/{op}", json.dumps(body).encode(), timeout)
    data = r.json()
    if r.status != 200 or not isinstance(data, dict):
        raise MetadataError(f"etcd {op}: HTTP {r.status}: {r.body[:200]!r}")
    return data


def endpoint_check(host: str, port: int, timeout: float) -> tuple[Check, bool]:
    """Reachable and etcd, and healthy; (check, usable)."""
    name = f"etcd {host}:{port}"
    kind = identify(host, port, timeout)
    if kind.kind == "unreachable":
        return Check(G, name, Status.FAIL, f"{host}:{port}: {kind.detail}",
                     "start etcd, or check its --listen-client-urls (it must listen on an "
                     "address peers reach, not only 127.0.0.1) and the firewall"), False
    if kind.kind != "etcd":
        return Check(G, name, Status.FAIL, f"etcd://{host}:{port} is {describe(kind, host, port)}",
                     "point --metadata at etcd's client port (2379 by default)",
                     {"kind": kind.kind}), False
    try:
        health = request(host, port, "GET", "/health", timeout=timeout).json() or {}
    except OSError as e:
        health = {"error": str(e)}
    if str(health.get("health")) != "true":
        return Check(G, name, Status.FAIL, f"{kind.detail} answers but is unhealthy: {health}",
                     "etcdctl endpoint status --cluster; a member without quorum cannot serve "
                     "writes", {"version": kind.version, "health": health}), False
    return Check(G, name, Status.OK, f"{kind.detail}, healthy",
                 data={"version": kind.version}), True


def advertised_check(host: str, port: int, cfg: DoctorConfig) -> Check:
    try:
        members = gateway(host, port, "cluster/member/list", {}, cfg.timeout).get("members", [])
    except (OSError, MetadataError) as e:
        return Check(G, "etcd advertised URLs", Status.WARN, f"member list failed: {e}")
    urls = [u for m in members for u in m.get("clientURLs", [])]
    hosts = [urlsplit(u).hostname or "" for u in urls]
    if urls and all(is_loopback(h) for h in hosts):
        remote = cfg.remote_peers() or not is_loopback(host)
        return Check(G, "etcd advertised URLs", Status.WARN if remote else Status.OK,
                     f"etcd advertises only loopback client URLs ({', '.join(urls)})"
                     + (": clients that follow them from another host reach themselves"
                        if remote else "; fine while every peer is on this host"),
                     "restart etcd with --listen-client-urls http://0.0.0.0:2379 "
                     "--advertise-client-urls http://CLUSTER_IP:2379" if remote else "",
                     {"client_urls": urls})
    return Check(G, "etcd advertised URLs", Status.OK if urls else Status.WARN,
                 f"client URLs: {', '.join(urls) or 'none reported'}", data={"client_urls": urls})


def probe_check(host: str, port: int, timeout: float) -> Check:
    key = f"mooncake/doctor/probe-{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"
    value = secrets.token_hex(8)
    try:
        gateway(host, port, "kv/put", {"key": _b64(key), "value": _b64(value)}, timeout)
        kvs = gateway(host, port, "kv/range", {"key": _b64(key)}, timeout).get("kvs", [])
        got = base64.b64decode(kvs[0]["value"]).decode() if kvs else None
        gateway(host, port, "kv/deleterange", {"key": _b64(key)}, timeout)
        gone = not gateway(host, port, "kv/range", {"key": _b64(key)}, timeout).get("kvs")
    except (OSError, MetadataError, KeyError, ValueError) as e:
        return Check(G, "etcd put/get/delete", Status.FAIL, f"probe under {key} failed: {e}",
                     "check etcd's auth settings and that the member has quorum")
    if got != value or not gone:
        return Check(G, "etcd put/get/delete", Status.FAIL,
                     f"probe under {key}: read {got!r} for {value!r}, deleted: {gone}",
                     "etcd is not storing keys: check its logs and disk")
    return Check(G, "etcd put/get/delete", Status.OK, f"put, get and delete of {key} worked")


def _alive(desc: SegmentDescriptor, timeout: float) -> bool:
    try:
        with socket.create_connection((desc.host, desc.port), timeout=timeout):
            return True
    except OSError:
        return False


def stale_check(host: str, port: int, timeout: float) -> Check:
    body = {"key": _b64(KEY_PREFIX), "range_end": _prefix_end(KEY_PREFIX)}
    try:
        kvs = gateway(host, port, "kv/range", body, timeout).get("kvs", [])
    except (OSError, MetadataError) as e:
        return Check(G, "stale segments", Status.WARN, f"listing {KEY_PREFIX} failed: {e}")
    stale, names = [], []
    for kv in kvs[:MAX_STALE_PROBES]:
        key = base64.b64decode(kv["key"]).decode(errors="replace")
        names.append(key[len(KEY_PREFIX):])
        try:
            desc = SegmentDescriptor.from_json(base64.b64decode(kv.get("value", "")))
        except MetadataError:
            stale.append(f"{key} (malformed)")
            continue
        if not _alive(desc, min(timeout, 1.0)):
            stale.append(f"{key} ({desc.host}:{desc.port} refuses"
                         + (", no lease: never expires)" if kv.get("lease", "0") == "0" else ")"))
    if stale:
        return Check(G, "stale segments", Status.WARN,
                     f"{len(stale)} of {len(kvs)} segment descriptors point at dead engines: "
                     + "; ".join(stale),
                     "remove them: etcdctl del KEY (a leased one also expires on its own)",
                     {"stale": stale, "segments": names})
    return Check(G, "stale segments", Status.OK,
                 f"{len(kvs)} segment descriptor(s), every engine answers",
                 data={"segments": names})


def checks(url: str, cfg: DoctorConfig) -> list[Check]:
    eps = [split_hostport(e, "etcd endpoint") for e in url[len("etcd://"):].split(",")
           if e.strip()]
    out, usable = [], []
    for host, port in eps:
        check, ok = endpoint_check(host, port, cfg.timeout)
        out.append(check)
        if ok:
            usable.append((host, port))
    if not usable:
        return out
    host, port = usable[0]
    return [*out, advertised_check(host, port, cfg), probe_check(host, port, cfg.timeout),
            stale_check(host, port, cfg.timeout)]
