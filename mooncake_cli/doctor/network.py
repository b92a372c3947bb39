"""Network checks: the ephemeral port range, TIME_WAIT sockets, a live loopback transfer
through our TransferEngine and, with --peer, a probe and a short bandwidth test."""

from __future__ import annotations

import os
import time

from mooncake_cli.config import TransferConfig, human_size
from mooncake_cli.doctor.check import Check, DoctorConfig, Status, read
from mooncake_cli.interfaces import MooncakeError
from mooncake_cli.registry import Registry
from mooncake_cli.transfer.batch import Op
from mooncake_cli.transfer.engine import TransferEngine

G = "network"
TIME_WAIT = "06"  # the st column of /proc/net/tcp
MIN_RANGE = 10000
LOOPBACK_BYTES = 4 << 20
PEER_SECONDS = 1.0


def port_range(cfg: DoctorConfig) -> tuple[int, int] | None:
    raw = (read(cfg.path("proc/sys/net/ipv4/ip_local_port_range")) or "").split()
    return (int(raw[0]), int(raw[1])) if len(raw) == 2 and all(x.isdigit() for x in raw) \
        else None


def range_check(cfg: DoctorConfig) -> Check:
    rng = port_range(cfg)
    if rng is None:
        return Check(G, "ephemeral ports", Status.SKIPPED, "ip_local_port_range not readable")
    lo, hi = rng
    data = {"low": lo, "high": hi}
    if cfg.port and lo <= cfg.port <= hi:
        return Check(G, "ephemeral ports", Status.WARN, f"the engine's port {cfg.port} lies in "
                     f"the ephemeral range {lo}-{hi}: an outgoing connection can take it first",
                     f"pick a port outside it, or sysctl -w net.ipv4.ip_local_reserved_ports="
                     f"{cfg.port}", data)
    if hi - lo + 1 < MIN_RANGE:
        return Check(G, "ephemeral ports", Status.WARN, f"range {lo}-{hi} has only "
                     f"{hi - lo + 1} ports: many peers x connections can exhaust it",
                     'sysctl -w net.ipv4.ip_local_port_range="1024 65000"', data)
    return Check(G, "ephemeral ports", Status.OK, f"range {lo}-{hi} ({hi - lo + 1} ports)",
                 data=data)


def time_wait_check(cfg: DoctorConfig) -> Check:
    tables = [read(cfg.path(f"proc/net/{t}")) for t in ("tcp", "tcp6")]
    if all(t is None for t in tables):
        return Check(G, "TIME_WAIT", Status.SKIPPED, "proc/net/tcp not readable")
    count = sum(1 for t in tables if t for line in t.splitlines()[1:]
                if len(line.split()) > 3 and line.split()[3] == TIME_WAIT)
    rng = port_range(cfg)
    size = rng[1] - rng[0] + 1 if rng else 28232
    data = {"time_wait": count, "ephemeral": size}
    if count >= size // 2:
        return Check(G, "TIME_WAIT", Status.FAIL if count >= size * 9 // 10 else Status.WARN,
                     f"{count} sockets in TIME_WAIT against {size} ephemeral ports: new "
                     "connections fail with EADDRNOTAVAIL once they run out",
                     "sysctl -w net.ipv4.tcp_tw_reuse=1, widen ip_local_port_range, and keep "
                     "connections open (fewer --connections churn)", data)
    return Check(G, "TIME_WAIT", Status.OK, f"{count} sockets in TIME_WAIT "
                 f"({size} ephemeral ports)", data=data)


def _round_trip(engine: TransferEngine, target: str, remote: int, n: int) -> float:
    """Write a random pattern of `n` bytes to `target`, read it back; seconds, or raise."""
    region = engine.allocate(n)
    try:
        view = region.view
        if view is None:
            raise MooncakeError("the dram tier gave a buffer without a host view")
        pattern = os.urandom(n)
        view[:n] = pattern
        start = time.perf_counter()
        engine.transfer(Op.WRITE, region, 0, target, remote, n)
        view[:n] = bytes(n)
        engine.transfer(Op.READ, region, 0, target, remote, n)
        took = time.perf_counter() - start
        if bytes(view[:n]) != pattern:
            raise MooncakeError(f"{n} bytes written to {target} read back different")
        return took
    finally:
        engine.unregister(region)


def loopback_check(cfg: DoctorConfig) -> Check:
    if not cfg.loopback:
        return Check(G, "loopback transfer", Status.SKIPPED, "disabled by --no-loopback")
    ecfg = TransferConfig(transport="tcp", secret=cfg.secret, timeout=cfg.timeout)
    registry = Registry.from_env(cfg.env)
    try:
        with TransferEngine(ecfg, registry) as target, TransferEngine(ecfg, registry) as me:
            remote = target.allocate(LOOPBACK_BYTES)
            took = _round_trip(me, target.name, remote.base, LOOPBACK_BYTES)
    except (MooncakeError, OSError) as e:
        return Check(G, "loopback transfer", Status.FAIL, f"a tcp transfer between two local "
                     f"engines failed: {e}", "run `mooncake --log-level debug bench transfer "
                     "--mode local --transport tcp` to see where it stops")
    rate = 2 * LOOPBACK_BYTES / took if took > 0 else 0.0
    return Check(G, "loopback transfer", Status.OK, f"wrote and read back "
                 f"{human_size(LOOPBACK_BYTES)} over tcp between two engines "
                 f"({human_size(rate)}/s)", data={"bytes": 2 * LOOPBACK_BYTES, "seconds": took})


def peer_checks(cfg: DoctorConfig) -> list[Check]:
    if not cfg.peer:
        return [Check(G, "peer", Status.SKIPPED, "no --peer given",
                      "pass --peer HOST:PORT of a `mooncake transfer serve` to test the path")]
    from mooncake_cli.bench.transfer import BenchTransferConfig, measure

    ecfg = TransferConfig(secret=cfg.secret, timeout=cfg.timeout)
    try:
        with TransferEngine(ecfg, Registry.from_env(cfg.env)) as me:
            desc = me.metadata.lookup(cfg.peer)
            probe = Check(G, "peer", Status.OK, f"{cfg.peer} answers: segment {desc.name}, "
                          f"{len(desc.regions)} region(s), transport {me.transport_for(cfg.peer)}",
                          data={"regions": len(desc.regions), "auth": desc.auth})
            bench = BenchTransferConfig(mode="initiator", target=cfg.peer, block_size=1 << 20,
                                        batch_size=1, duration=PEER_SECONDS,
                                        buffer_size=1 << 20)
            region = me.allocate(bench.buffer_size)
            result = measure(me, region, bench, cfg.peer)
    except MooncakeError as e:
        return [Check(G, "peer", Status.FAIL, f"{cfg.peer}: {e}",
                      "is `mooncake transfer serve` running there, reachable through the "
                      "firewall, and given the same --secret?")]
    return [probe, Check(G, "peer bandwidth", Status.OK, f"{result.seconds:g} s of 1 MiB "
                         f"writes to {cfg.peer} over {result.transport}, read back verified: "
                         f"{result.gbps:g} GB/s, p50 {result.p50_us} us",
                         data=result.to_dict())]


def checks(cfg: DoctorConfig) -> list[Check]:
    return [range_check(cfg), time_wait_check(cfg), loopback_check(cfg), *peer_checks(cfg)]
