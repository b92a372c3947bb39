"""`bench chaos`: kill the HA store's leader at random moments under a put/get/remove workload
and count what an acknowledged write lost; then put throughput with HA on and off.

    report = run(BenchChaosConfig(kills=20), TransferConfig(), Registry.from_env())

Chaos: three `--ha` masters, two store nodes, and in this process a client with no segment (so
every replica lives in another process) running puts, gets and removes without pause, plus a
prober reading one fixed key. Each round waits a random 0.3-1.5 s, SIGKILLs the leader, starts
a master in its place, notes when the prober's first get started after the kill succeeds, then
pauses the workload and checks every key: each acknowledged put not removed since must read
back byte for byte (else `lost`), each acknowledged remove must stay gone (else
`resurrected`); a value read with other bytes at any time counts in `wrong_bytes`. Puts and
removes that raised are in doubt and not counted either way.

Throughput: one cluster with HA and one without side by side (same nodes, same sizes): each
row is `duration` seconds of sequential puts by a segment-less client per cluster, taken in
ten turns that alternate between the two, so the load of a shared machine falls on both.
"""

from __future__ import annotations

import random
import statistics
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from mooncake_cli.bench.chaos_cluster import ChaosCluster
from mooncake_cli.bench.chaos_load import Workload, throughput
from mooncake_cli.bench.stats import Progress
from mooncake_cli.config import TransferConfig, parse_size, size_field
from mooncake_cli.interfaces import ConfigError, MooncakeError
from mooncake_cli.registry import Registry
from mooncake_cli.store.client import StoreClient
from mooncake_cli.transfer.engine import TransferEngine

RECOVERY_LIMIT = 30.0  # seconds a round waits for gets to work again before it gives up


@dataclass(frozen=True)
class BenchChaosConfig:
    """A chaos benchmark ([bench_chaos] in the config file)."""

    kills: int = 20
    etcd: str = ""  # etcd://HOST:PORT to use; empty: start a local etcd
    sizes: str = "4KiB,1MiB"  # throughput rows
    duration: float = 2.0  # seconds per throughput row
    segment_size: int = size_field(256 << 20, "bytes each store node contributes")
    seed: int = 0

    def __post_init__(self) -> None:
        if self.kills < 0:
            raise ConfigError(f"--kills must be >= 0, not {self.kills}")
        if self.duration <= 0:
            raise ConfigError(f"--duration must be > 0 seconds, not {self.duration:g}")
        if self.etcd and not self.etcd.startswith("etcd://"):
            raise ConfigError(f"--etcd must be etcd://HOST:PORT, not {self.etcd!r}")
        if max(self.size_list) * 4 > self.segment_size:
            raise ConfigError("--segment-size must hold at least four of the largest value")

    @property
    def size_list(self) -> list[int]:
        try:
            sizes = [parse_size(s) for s in self.sizes.split(",") if s.strip()]
        except ConfigError as e:
            raise ConfigError(f"--sizes: {e}") from None
        if not sizes or min(sizes) < 1:
            raise ConfigError("--sizes needs value sizes >= 1 byte, e.g. 4KiB,1MiB")
        return sizes


@dataclass
class ChaosReport:
    kills: int = 0
    acked_puts: int = 0
    acked_removes: int = 0
    in_doubt: int = 0  # puts and removes that raised (not counted as lost or resurrected)
    lost: int = 0
    resurrected: int = 0
    wrong_bytes: int = 0
    misses: int = 0  # gets of an acknowledged key that answered "not found" (even briefly)
    recovery_s: list[float] = field(default_factory=list)
    throughput: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        rec = sorted(self.recovery_s)
        out["recovery_p50_s"] = statistics.median(rec) if rec else None
        out["recovery_max_s"] = rec[-1] if rec else None
        return out


def _chaos(cfg: BenchChaosConfig, engine: TransferEngine, report: ChaosReport,
           progress: Progress | None) -> None:
    rng = random.Random(cfg.seed)
    with ChaosCluster(cfg.etcd or None, True, cfg.segment_size) as cluster:
        client = StoreClient(cluster.url, engine, 0, timeout=8)
        prober = StoreClient(cluster.url, engine, 0, timeout=8)
        load = Workload(client, prober, rng.randrange(1 << 30))
        try:
            load.start()
            for n in range(cfg.kills):
                if progress:
                    progress(n, cfg.kills, f"kill {n + 1}/{cfg.kills}")
                time.sleep(rng.uniform(0.3, 1.5))
                killed = cluster.kill_leader()
                spare = _in_background(cluster.adopt, cluster.spawn_master())
                up = load.probe_after(killed, RECOVERY_LIMIT)
                if up is None:
                    raise MooncakeError(f"gets did not work again within {RECOVERY_LIMIT:g} s "
                                        f"of kill {n + 1}")
                report.recovery_s.append(round(up - killed, 3))
                spare.join(120)
                load.check(report)
                report.kills += 1
        finally:
            load.stop()
            load.tally(report)
            report.misses = load.misses
            client.close()
            prober.close()


def _in_background(fn: Any, *args: Any) -> threading.Thread:
    thread = threading.Thread(target=fn, args=args, daemon=True)
    thread.start()
    return thread


def _throughput(cfg: BenchChaosConfig, engine: TransferEngine, report: ChaosReport,
                progress: Progress | None) -> None:
    with ChaosCluster(None, False, cfg.segment_size) as off, \
            ChaosCluster(cfg.etcd or None, True, cfg.segment_size) as on:
        clients = {"off": StoreClient(off.url, engine, 0, timeout=8),
                   "on": StoreClient(on.url, engine, 0, timeout=8)}
        try:
            for size in cfg.size_list:
                if progress:
                    progress(0, cfg.duration, f"put {size} B, HA off and on in turns")
                row: dict[str, Any] = {"size": size,
                                       **throughput(clients, size, cfg.duration,
                                                    cfg.segment_size)}
                row["ops_ratio"] = row["on"]["ops_per_s"] / row["off"]["ops_per_s"]
                row["p50_ratio"] = row["on"]["p50_us"] / row["off"]["p50_us"]
                report.throughput.append(row)
        finally:
            for c in clients.values():
                c.close()


def run(cfg: BenchChaosConfig, base: TransferConfig, registry: Registry,
        progress: Progress | None = None) -> ChaosReport:
    """The chaos rounds, then the throughput rows."""
    report = ChaosReport()
    with TransferEngine(base, registry) as engine:
        if cfg.kills:
            _chaos(cfg, engine, report, progress)
        if cfg.size_list:
            _throughput(cfg, engine, report, progress)
    return report
