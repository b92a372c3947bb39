"""Store master checks: reachable and answering, leadership, segments mounted, capacity used,
clock skew, the master's root_fs_dir on this host."""

from __future__ import annotations

import os
import time
from typing import Any

import zmq

from mooncake_cli.config import human_size
from mooncake_cli.config.store import StoreConfig
from mooncake_cli.doctor.check import Check, DoctorConfig, Status
from mooncake_cli.interfaces import ConfigError
from mooncake_cli.store.errors import StoreError
from mooncake_cli.store.records import StoreStats
from mooncake_cli.store.wire import protocol
from mooncake_cli.store.wire.rpc import MasterConnection

G = "master"
HIGH_WATERMARK = StoreConfig.high_watermark


def ask(address: str, secret: str, timeout: float, request: Any, kind: Any) -> Any:
    """One request over a fresh connection; StoreError when it fails or is refused."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    conn = MasterConnection(ctx, address, secret or None, timeout)
    try:
        return conn.call(request, kind)
    finally:
        conn.close()
        ctx.term()


def leader_check(address: str, secret: str, timeout: float) -> tuple[Check, bool]:
    """Who leads, asked of the master (a standby answers too); (check, this one serves)."""
    who = getattr(protocol, "WhoLeads", None)
    try:
        from mooncake_cli.store.ha.leader import LeaderInfo
    except ImportError:
        who = None
    if who is None:
        return Check(G, "leader", Status.SKIPPED, "this build's master protocol has no "
                     "who_leads request"), True
    info = ask(address, secret, timeout, who(), LeaderInfo)
    data = {"leader": info.address, "term": info.term, "ha": info.ha}
    if not info.ha:
        return Check(G, "leader", Status.OK, f"{address} runs alone (no HA): it serves",
                     data=data), True
    if not info.address:
        return Check(G, "leader", Status.FAIL, "no master leads: an election is under way "
                     "or no master can reach etcd", "check the masters' logs and etcd", data), \
            False
    if info.address != address:
        return Check(G, "leader", Status.WARN, f"{address} is a standby; {info.address} leads "
                     f"(term {info.term})", "give clients the HA address etcd://.../CLUSTER so "
                     "they follow the leader", data), False
    return Check(G, "leader", Status.OK, f"{address} leads (term {info.term})", data=data), True


def resolve(address: str, timeout: float) -> str:
    """The leader's HOST:PORT for an HA address etcd://...; `address` itself otherwise."""
    if not address.startswith("etcd://"):
        return address
    try:
        from mooncake_cli.store.ha.leader import LeaderResolver
    except ImportError as e:
        raise ConfigError(f"this build has no HA store support for {address}") from e

    info = LeaderResolver(address, timeout).lookup()
    if info is None:
        raise StoreError(f"no master leads the HA store at {address} (election under way?)")
    return info.address


def capacity_checks(s: StoreStats) -> list[Check]:
    segs = sum(t.segments for t in s.tiers.values())
    used = sum(t.bytes_used for t in s.tiers.values())
    cap = sum(t.capacity for t in s.tiers.values())
    per_tier = {str(k): {"segments": t.segments, "used": t.bytes_used, "capacity": t.capacity}
                for k, t in s.tiers.items()}
    out = [Check(G, "segments", Status.OK if segs else Status.FAIL,
                 f"{segs} segment(s) mounted by {s.clients} client(s)",
                 "" if segs else "no node contributes memory, so every put fails with no "
                 "space: start `mooncake store serve --master ADDR --segment-size SIZE`",
                 {"tiers": per_tier})]
    if cap:
        ratio = used / cap
        out.append(Check(G, "capacity", Status.WARN if ratio >= HIGH_WATERMARK else Status.OK,
                         f"{human_size(used)} of {human_size(cap)} used ({ratio:.0%}), "
                         f"{s.objects} object(s)",
                         f"above the {HIGH_WATERMARK:.0%} high watermark the master evicts: "
                         "add nodes or --segment-size" if ratio >= HIGH_WATERMARK else "",
                         {"used": used, "capacity": cap}))
    return out


def checks(cfg: DoctorConfig) -> list[Check]:
    if not cfg.master:
        return [Check(G, "master", Status.SKIPPED, "no --master given",
                      "pass --master HOST:PORT to check a store master")]
    try:
        address = resolve(cfg.master, cfg.timeout)
        leader, serves = leader_check(address, cfg.secret, cfg.timeout)
        sent = time.time()
        s = ask(address, cfg.secret, cfg.timeout, protocol.Stats(), StoreStats) if serves \
            else None
        back = time.time()
    except (StoreError, ConfigError) as e:
        wrong_secret = "secret" in str(e) or "MAC" in str(e)
        return [Check(G, "reachable", Status.FAIL, str(e),
                      "give the master's --secret (or MOONCAKE_SECRET)" if wrong_secret else
                      f"start it (mooncake store master --port {cfg.master.rpartition(':')[2]}) "
                      "or fix --master; check the firewall for its port")]
    if s is None:
        return [Check(G, "reachable", Status.OK, f"{address} answers who_leads"), leader]
    return [
        Check(G, "reachable", Status.OK, f"{address} answers stats: {s.objects} object(s), "
              f"{s.pending} pending put(s), {s.clients} client(s)",
              data={"objects": s.objects, "clients": s.clients, "hits": s.hits,
                    "misses": s.misses}),
        leader,
        *capacity_checks(s),
        skew_check(s.clock - (sent + back) / 2, (back - sent) / 2) if s.clock else
        Check(G, "clock skew", Status.SKIPPED, "this master does not report its clock"),
        fs_dir_check(address, cfg.secret, cfg.timeout),
    ]


def fs_dir_check(address: str, secret: str, timeout: float) -> Check:
    """The directory the master tells clients of the upstream API to persist to (its
    --root_fs_dir/--cluster_id): there and writable on this host, or their setup fails."""
    try:
        fs_dir = str(ask(address, secret, timeout, protocol.GetFsdir(), str))
    except StoreError as e:
        return Check(G, "root_fs_dir", Status.SKIPPED, f"the master does not say: {e}")
    if not fs_dir:
        return Check(G, "root_fs_dir", Status.OK, "none named: objects live in memory and "
                     "SSD segments only", data={"fs_dir": ""})
    root = os.path.dirname(fs_dir.rstrip("/"))
    data = {"fs_dir": fs_dir}
    if not os.path.isdir(root):
        return Check(G, "root_fs_dir", Status.FAIL,
                     f"the master's root_fs_dir {root} is not a directory on this host: setup "
                     f"of an upstream-API client here fails (-1)",
                     f"mount the shared file system at {root} on this host, or start the "
                     "master with the --root_fs_dir every client host mounts", data)
    here = fs_dir if os.path.isdir(fs_dir) else root
    if not os.access(here, os.W_OK | os.X_OK):
        return Check(G, "root_fs_dir", Status.FAIL,
                     f"{here} is not writable by this user (uid {os.getuid()}): setup of an "
                     "upstream-API client here fails (-1)",
                     f"run the clients as the user that owns {here}, or give this one write "
                     "access", data)
    return Check(G, "root_fs_dir", Status.OK, f"{fs_dir}: clients here persist to it", data=data)


def skew_check(skew: float, uncertainty: float) -> Check:
    """Our clock against the master's: leases and TTLs are timed by the master, but logs,
    etcd leases and heartbeats across hosts assume clocks within a second."""
    evidence = f"master clock - ours = {skew * 1e3:+.1f} ms (+/- {uncertainty * 1e3:.1f} ms)"
    fix = "run NTP (chrony or systemd-timesyncd) on every host: `timedatectl` shows whether " \
          "the clock is synchronised"
    if abs(skew) - uncertainty > 5.0:
        return Check(G, "clock skew", Status.FAIL, evidence, fix, data={"skew_s": skew})
    if abs(skew) - uncertainty > 0.5:
        return Check(G, "clock skew", Status.WARN, evidence, fix, data={"skew_s": skew})
    return Check(G, "clock skew", Status.OK, evidence, data={"skew_s": skew})
