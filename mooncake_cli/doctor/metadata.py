"""Metadata checks: the URL parses, and the server it names is the kind it claims to be and
stores keys (etcd in doctor/etcd.py; the HTTP metadata server here)."""

from __future__ import annotations

import os
import secrets
import urllib.parse

from mooncake_cli.doctor import etcd
from mooncake_cli.doctor.check import Check, DoctorConfig, Status
from mooncake_cli.doctor.http_probe import describe, identify, request
from mooncake_cli.interfaces import ConfigError

G = "metadata"


def url_check(url: str) -> Check:
    from mooncake_cli.transfer.metadata_open import open_metadata

    try:
        if url.startswith("etcd://"):
            etcd_eps = [e for e in url[len("etcd://"):].split(",") if e.strip()]
            if not etcd_eps:
                raise ConfigError(f"no etcd endpoint in '{url}'")
            from mooncake_cli.transfer.metadata import split_hostport

            for e in etcd_eps:
                split_hostport(e, "etcd endpoint")
        else:
            open_metadata(url).close()
    except ConfigError as e:
        return Check(G, "url", Status.FAIL, str(e),
                     "use p2p, http://HOST:PORT/metadata or etcd://HOST:PORT[,HOST:PORT]")
    return Check(G, "url", Status.OK, f"'{url}' parses")


def http_checks(url: str, cfg: DoctorConfig) -> list[Check]:
    parts = urllib.parse.urlsplit(url)
    host, port = parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)
    path = parts.path or "/"
    key = f"mooncake/doctor/probe-{os.getpid()}-{secrets.token_hex(4)}"
    q = "?" + urllib.parse.urlencode({"key": key})
    kind = identify(host, port, cfg.timeout)
    if kind.kind in ("unreachable", "not-http"):
        fix = (f"start one: mooncake transfer metadata-server --host HOST --port {port}"
               if kind.kind == "unreachable" else
               "point --metadata at `mooncake transfer metadata-server`")
        return [Check(G, "http server", Status.FAIL, f"{host}:{port}: "
                      f"{describe(kind, host, port)}", fix, {"kind": kind.kind})]
    try:
        miss = request(host, port, "GET", path + q, timeout=cfg.timeout)
    except OSError as e:
        return [Check(G, "http server", Status.FAIL, f"{url}: GET failed: {e}",
                      "check the metadata server's log")]
    if miss.status != 404 or not miss.body.startswith(b"metadata not found"):
        if kind.kind == "mooncake-http":
            why, fix = (f"a Mooncake metadata server, but not at path {path}",
                        f"use http://{host}:{port}/metadata (or the server's --path)")
        else:
            why, fix = describe(kind, host, port), "point --metadata at the right server"
        return [Check(G, "http server", Status.FAIL,
                      f"{url} answered GET with HTTP {miss.status} {miss.body[:60]!r}: "
                      f"it is {why}", fix, {"kind": kind.kind})]
    checks = [Check(G, "http server", Status.OK,
                    f"{url}: a metadata server ({miss.server or 'no Server header'})")]
    value = secrets.token_hex(8).encode()
    try:
        put = request(host, port, "PUT", path + q, value, cfg.timeout)
        got = request(host, port, "GET", path + q, timeout=cfg.timeout)
        gone = request(host, port, "DELETE", path + q, timeout=cfg.timeout)
        after = request(host, port, "GET", path + q, timeout=cfg.timeout)
    except OSError as e:
        return [*checks, Check(G, "http put/get/delete", Status.FAIL, f"probe failed: {e}",
                               "check the metadata server's log")]
    worked = (put.status == 200 and got.body == value and gone.status == 200
              and after.status == 404)
    same = "same bytes" if got.body == value else "other bytes"
    checks.append(Check(
        G, "http put/get/delete", Status.OK if worked else Status.FAIL,
        f"PUT {put.status}, GET {got.status} ({same}), DELETE {gone.status}, "
        f"GET after delete {after.status}",
        "" if worked else "the server does not keep keys: check its version and log"))
    checks.append(Check(G, "stale segments", Status.SKIPPED, "the HTTP metadata protocol "
                        "has no list operation; dead engines' keys expire by TTL"))
    return checks


def checks(cfg: DoctorConfig) -> list[Check]:
    url = (cfg.metadata or "p2p").strip()
    if url.lower() in ("p2p", "p2phandshake"):
        return [Check(G, "metadata", Status.SKIPPED,
                      "p2p: no metadata server (peers describe themselves)",
                      "pass --metadata URL to check an etcd or HTTP metadata server")]
    first = url_check(url)
    if first.status is Status.FAIL:
        return [first]
    if url.startswith("etcd://"):
        return [first, *etcd.checks(url, cfg)]
    return [first, *http_checks(url, cfg)]
