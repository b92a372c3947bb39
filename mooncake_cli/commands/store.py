"""`mooncake store`: run a master or a node contributing memory, and put/get/list/remove objects."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape

from mooncake_cli.commands import common as c
from mooncake_cli.commands.store_node import serve_ready
from mooncake_cli.config import human_size, load
from mooncake_cli.config.store import StoreConfig
from mooncake_cli.heap import tune_heap
from mooncake_cli.http.auth import require_secret, resolve_secret
from mooncake_cli.interfaces import ConfigError
from mooncake_cli.output import Out, table
from mooncake_cli.registry import Registry
from mooncake_cli.store.client import StoreClient
from mooncake_cli.store.errors import ObjectNotFound
from mooncake_cli.store.ha.election import HaMaster
from mooncake_cli.store.ha.leader import LeaderInfo
from mooncake_cli.store.master.events import ObjectEvents
from mooncake_cli.store.records import ReplicateConfig, StoreStats
from mooncake_cli.store.service import MasterService, events_from, master_from, truth
from mooncake_cli.transfer.engine import TransferEngine

app = typer.Typer(no_args_is_help=True,
                  help="Run the store's master and nodes, and put, get, list and remove objects.")

MASTER = typer.Option(None, "--master",
                      help="HOST:PORT of the store master, or etcd://HOST:PORT[,HOST:PORT]"
                           "[/CLUSTER] to follow the leader of an HA store "
                           "[default: 127.0.0.1:50051].")
STORE_TIMEOUT = typer.Option(None, "--timeout",
                             help="Seconds to wait for each reply of the master [default: 5].")


def store_config(out: Out, **flags: Any) -> StoreConfig:
    return load(StoreConfig, "store", out.config_file, **flags)


@app.command()
def master(
    ctx: typer.Context,
    host: str = typer.Option(None, "--host", help="Listen address [default: 127.0.0.1]."),
    port: int = typer.Option(None, "--port", help="RPC port (0 for any free port) "
                                                  "[default: 50051]."),
    secret: str = c.SECRET,
    secret_file: str = c.SECRET_FILE,
    lease_ttl: float = typer.Option(None, "--lease-ttl",
                                    help="Seconds a get or exists protects an object from "
                                         "removal and eviction [default: 5]."),
    put_timeout: float = typer.Option(None, "--put-timeout",
                                      help="Seconds before an unfinished put is discarded "
                                           "[default: 30]."),
    client_ttl: float = typer.Option(None, "--client-ttl",
                                     help="Seconds a silent client keeps its segments "
                                          "[default: 10]."),
    high_watermark: float = typer.Option(None, "--high-watermark",
                                         help="Usage ratio above which objects are evicted "
                                              "[default: 0.9]."),
    eviction_ratio: float = typer.Option(None, "--eviction-ratio",
                                         help="Share of a tier evicted at once [default: 0.05]."),
    eviction: str = typer.Option(None, "--eviction", metavar="POLICY",
                                 help="Which objects go first: lru, lfu, adaptive (whichever of "
                                      "lru, lfu and arc hits most lately), arc, prefix "
                                      "(KV-block chains: tails first, judged by their heads), "
                                      "or a policy a plugin registers [default: lru]."),
    metrics_port: int = typer.Option(None, "--metrics-port",
                                     help="Also serve Prometheus /metrics and /health on this "
                                          "HTTP port of the listen address (0 for any free "
                                          "port) [default: off]."),
    ha: str = typer.Option(None, "--ha",
                           help="etcd://HOST:PORT[,HOST:PORT][/CLUSTER]: run as one of several "
                                "masters; the one elected through an etcd lease serves, the "
                                "others stand by (refusing requests) and take over when it "
                                "dies [default: off]."),
    soft_pin_ttl: float = typer.Option(None, "--soft-pin-ttl",
                                       help="Seconds a soft pin lasts after the object's last "
                                            "use, unless its put says [default: 1800]."),
    enable_offload: str = typer.Option(None, "--enable-offload", "--enable_offload",
                                       metavar="BOOL", help="Use the SSD segments clients "
                                       "mount (false: DRAM only) [default: true]."),
    offload_on_evict: str = typer.Option(None, "--offload-on-evict", "--offload_on_evict",
                                         metavar="BOOL", help="An evicted object goes to its "
                                         "client's SSD segment when it has room [default: "
                                         "true]."),
    promotion_on_hit: str = typer.Option(None, "--promotion-on-hit", "--promotion_on_hit",
                                         metavar="BOOL", help="Copy an object held only on SSD "
                                         "back to DRAM after gets [default: true]."),
    promotion_admission_threshold: int = typer.Option(
        None, "--promotion-admission-threshold", "--promotion_admission_threshold",
        help="Gets of an SSD-only object before it is promoted [default: 1]."),
    root_fs_dir: str = typer.Option(
        None, "--root-fs-dir", "--root_fs_dir", metavar="DIR",
        help="A directory every client shares (a DFS mount): clients of the upstream API "
             "persist each object they put to a file under DIR/CLUSTER_ID and read it back "
             "once memory has evicted it [default: off]."),
    cluster_id: str = typer.Option(
        None, "--cluster-id", "--cluster_id", metavar="NAME",
        help="This store's subdirectory of --root-fs-dir [default: mooncake_cluster]."),
    kv_events: str = typer.Option(
        None, "--kv-events", metavar="ENDPOINT",
        help="Publish object events (stored, removed, cleared: the KV events wire, see "
             "docs/indexer.md) on this ZMQ endpoint: tcp://HOST:PORT (port 0: any free one), "
             "ipc://PATH, or a PORT of the listen address [default: off]."),
    kv_events_replay: str = typer.Option(
        None, "--kv-events-replay", metavar="ENDPOINT",
        help="Where missed event batches are replayed [default: --kv-events' port + 1, or "
             "its ipc path + .replay]."),
) -> None:
    """Run the store master (metadata, allocation, leases, eviction) until Ctrl-C. The
    offload/promotion flags take upstream's spellings too (--offload_on_evict=false)."""
    out: Out = ctx.obj
    if metrics_port is not None and not 0 <= metrics_port < 65536:
        raise ConfigError(f"--metrics-port {metrics_port} is out of range 0-65535")
    flags = {}
    for name, value in (("enable-offload", enable_offload),
                        ("offload-on-evict", offload_on_evict),
                        ("promotion-on-hit", promotion_on_hit)):
        if value is not None:
            try:
                flags[name.replace("-", "_")] = truth(value)
            except ValueError as e:
                raise ConfigError(f"--{name}: {e}") from None
    cfg = store_config(out, host=host, port=port, secret=resolve_secret(secret, secret_file)
                       or None, lease_ttl=lease_ttl,
                       put_timeout=put_timeout, client_ttl=client_ttl,
                       high_watermark=high_watermark, eviction_ratio=eviction_ratio,
                       eviction=eviction, metrics_port=metrics_port, ha=ha,
                       soft_pin_ttl=soft_pin_ttl,
                       promotion_admission_threshold=promotion_admission_threshold,
                       root_fs_dir=root_fs_dir, cluster_id=cluster_id, kv_events=kv_events,
                       kv_events_replay=kv_events_replay, **flags)
    require_secret(cfg.host, cfg.secret, "the store master")
    events = events_from(cfg)
    try:
        address = _serve_master(out, cfg, events)
    finally:
        if events is not None:
            events.close()
    out.event({"event": "stopped", "address": address}, "stopped")


def _serve_master(out: Out, cfg: StoreConfig, events: ObjectEvents | None) -> str:
    """Serve until a signal; the address served."""
    with c.stop_signals() as stop, MasterService(
            master_from(cfg, events), cfg.host, cfg.port, cfg.secret or None,
            metrics_port=None if cfg.metrics_port < 0 else cfg.metrics_port,
            encrypt=cfg.encrypt or None, starting=bool(cfg.ha)) as service:
        ready: dict[str, Any] = {"event": "ready", "address": service.address,
                                 "auth": bool(cfg.secret), "eviction": cfg.eviction}
        events_line = ""
        if events is not None:
            events.backend_id = service.address
            ready.update(kv_events=events.endpoint, kv_events_replay=events.replay_endpoint)
            events_line = (f"  kv events: {escape(events.endpoint)} (replay "
                           f"{escape(events.replay_endpoint)})\n")
        if service.metrics_url:
            ready["metrics"] = service.metrics_url
        if cfg.ha:
            ready["ha"] = cfg.ha
        fs_dir = service.master.state.fs_dir
        if fs_dir:
            ready["fs_dir"] = fs_dir
        fs_line = f"  upstream API clients persist to: {escape(fs_dir)}\n" if fs_dir else ""
        metrics_line = (f"  metrics: {escape(service.metrics_url)}\n"
                        if service.metrics_url else "")
        target = cfg.ha or service.address
        out.event(ready,
                  f"store master at [bold]{escape(service.address)}[/bold]"
                  f"{', secret required' if cfg.secret else ''}"
                  f"{', HA candidate (standby until elected)' if cfg.ha else ''}, "
                  f"eviction {escape(cfg.eviction)}\n"
                  f"  node:  mooncake store serve --master {escape(target)}\n"
                  f"  stats: mooncake store stat --master {escape(target)}\n"
                  f"{metrics_line}"
                  f"{events_line}"
                  f"{fs_line}"
                  "Ctrl-C to stop.")

        def changed(leading: bool, info: LeaderInfo | None) -> None:
            term = info.term if info is not None else None
            out.event({"event": "leading" if leading else "standby", "address": service.address,
                       "term": term}, f"elected leader (term {term})" if leading else
                      "lost the leadership: standing by")

        ha_master = HaMaster(service, cfg.ha, lambda: master_from(cfg, events),
                             on_change=changed) if cfg.ha else None
        try:
            c.wait_for_signal(stop, settle_heap=True)
        finally:
            if ha_master is not None:
                ha_master.close()
    return service.address


@app.command()
def serve(
    ctx: typer.Context,
    master: str = MASTER,
    segment_size: str = typer.Option(None, "--segment-size",
                                     help="DRAM to contribute (e.g. 1GiB) [default: 64MiB]."),
    ssd_dir: str = typer.Option(None, "--ssd-dir",
                                help="Also contribute an SSD tier: a data file and its manifest "
                                     "in this directory. Objects evicted from DRAM are "
                                     "offloaded there, and a node restarted on it serves them "
                                     "again [default: none]."),
    ssd_size: str = typer.Option(None, "--ssd-size",
                                 help="Size of the SSD tier's data file (e.g. 8GiB) [default: "
                                      "the size of the file already there]."),
    hugepages: bool = typer.Option(None, "--hugepages/--no-hugepages",
                                   help="Put the DRAM segment on huge pages; without reserved "
                                        "huge pages, warn and use normal pages [default: no]."),
    timeout: float = STORE_TIMEOUT,
    host: str = c.HOST, port: int = c.PORT, advertise: str = c.ADVERTISE, name: str = c.NAME,
    metadata: str = c.METADATA, transport: str = c.TRANSPORT, secret: str = c.SECRET,
) -> None:
    """Contribute a DRAM segment (and optionally an SSD tier) to the store until Ctrl-C."""
    out: Out = ctx.obj
    scfg = store_config(out, master=master, segment_size=segment_size, timeout=timeout,
                        secret=secret, ssd_dir=ssd_dir, ssd_size=ssd_size, hugepages=hugepages)
    if scfg.segment_size <= 0:
        raise ConfigError("--segment-size must be positive for a node")
    tcfg = c.transfer_config(out, host=host, port=port, advertise=advertise, name=name,
                             metadata=metadata, transport=transport, secret=secret)
    tune_heap()
    with c.stop_signals() as stop, TransferEngine(tcfg, Registry.from_env()) as engine, \
            StoreClient(scfg.master, engine, scfg.segment_size, secret=scfg.secret or None,
                        timeout=scfg.timeout, heartbeat=scfg.heartbeat,
                        ssd_dir=scfg.ssd_dir or None, ssd_size=scfg.ssd_size,
                        hugepages=scfg.hugepages) as client:
        out.event(*serve_ready(scfg, engine.name, client))
        c.wait_for_signal(stop, settle_heap=True)
    out.event({"event": "stopped", "segment": engine.name}, "stopped; segment unmounted")


@contextmanager
def _client(out: Out, master: str | None, secret: str | None,
            timeout: float | None) -> Iterator[StoreClient]:
    """A short-lived client that contributes no memory."""
    cfg = store_config(out, master=master, secret=secret, timeout=timeout)
    tcfg = c.transfer_config(out, secret=secret)
    tune_heap()
    with TransferEngine(tcfg, Registry.from_env()) as engine, \
            StoreClient(cfg.master, engine, 0, secret=cfg.secret or None,
                        timeout=cfg.timeout, heartbeat=cfg.heartbeat) as client:
        yield client


@app.command()
def put(
    ctx: typer.Context,
    key: str = typer.Argument(..., help="Key of the new object."),
    file: str = typer.Argument(..., help="File to store, or - for stdin."),
    replicas: int = typer.Option(1, "--replicas", help="Replicas on distinct segments (as "
                                 "many as there are, at least one)."),
    soft_pin: bool = typer.Option(False, "--soft-pin", help="Evict only after unpinned objects."),
    hard_pin: bool = typer.Option(False, "--hard-pin", help="Never evict."),
    master: str = MASTER, secret: str = c.SECRET, timeout: float = STORE_TIMEOUT,
) -> None:
    """Store a file's bytes under a new key."""
    out: Out = ctx.obj
    data = c.read_input(file)
    config = ReplicateConfig(replicas, soft_pin=soft_pin, hard_pin=hard_pin)
    with _client(out, master, secret, timeout) as client:
        client.put(key, data, config)
        replicas = len(client.describe(key).replicas)  # best effort: what was placed
    out.event({"event": "put", "key": key, "bytes": len(data), "replicas": replicas},
              f"stored {len(data)} bytes under {escape(key)} ({replicas} "
              f"replica{'s' if replicas != 1 else ''})")


@app.command()
def get(
    ctx: typer.Context,
    key: str = typer.Argument(..., help="Key to read."),
    output: str = typer.Option("-", "-o", "--output", help="File to write, or - for stdout."),
    master: str = MASTER, secret: str = c.SECRET, timeout: float = STORE_TIMEOUT,
) -> None:
    """Read an object into a file or stdout."""
    out: Out = ctx.obj
    c.check_output(out, output)
    with _client(out, master, secret, timeout) as client:
        data = client.get(key)
    if c.write_output(output, data):
        return
    out.event({"event": "get", "key": key, "bytes": len(data), "output": output},
              f"read {len(data)} bytes of {escape(key)} into {escape(output)}")


@app.command()
def rm(
    ctx: typer.Context,
    key: str = typer.Argument(..., help="Key to remove."),
    force: bool = typer.Option(False, "--force", help="Remove even while a lease is held."),
    master: str = MASTER, secret: str = c.SECRET, timeout: float = STORE_TIMEOUT,
) -> None:
    """Remove an object."""
    out: Out = ctx.obj
    with _client(out, master, secret, timeout) as client:
        client.remove(key, force)
    out.event({"event": "removed", "key": key}, f"removed {escape(key)}")


@app.command()
def ls(
    ctx: typer.Context,
    prefix: str = typer.Argument("", help="List only keys starting with this."),
    master: str = MASTER, secret: str = c.SECRET, timeout: float = STORE_TIMEOUT,
) -> None:
    """List the complete objects (keys, sizes, replicas), sorted by key."""
    out: Out = ctx.obj
    rows: list[dict[str, Any]] = []
    with _client(out, master, secret, timeout) as client:
        for key in client.list(prefix):
            try:  # describe grants no lease and counts no access
                meta = client.describe(key)
            except ObjectNotFound:  # removed since the listing
                continue
            rows.append({"key": key, "size": meta.size, "replicas": len(meta.replicas)})

    def human(con: Console) -> None:
        con.print(table(None, ["key", "size", "replicas"],
                        [(r["key"], human_size(r["size"]), r["replicas"]) for r in rows]))

    out.emit(rows, human)


@app.command()
def stat(
    ctx: typer.Context,
    master: str = MASTER, secret: str = c.SECRET, timeout: float = STORE_TIMEOUT,
) -> None:
    """Show the leader, the master's segments, usage per tier, objects and counters."""
    out: Out = ctx.obj
    address = store_config(out, master=master).master
    with _client(out, master, secret, timeout) as client:
        leader = client.leader()
        stats = client.stats()
    data = _stats_dict(address, stats)
    data["leader"] = {"address": leader.address, "ha": leader.ha, "term": leader.term,
                      "id": leader.id}

    def human(con: Console) -> None:
        con.print(f"master {escape(address)}: {stats.objects} objects "
                  f"({stats.pending} puts pending), {stats.clients} clients")
        con.print(f"leader {escape(leader.address)}"
                  + (f" (HA term {leader.term}, id {leader.id})" if leader.ha else ""))
        con.print(table("tiers", ["tier", "segments", "objects", "used", "capacity", "usage"],
                        [(t["tier"], t["segments"], t["objects"], human_size(t["bytes_used"]),
                          human_size(t["capacity"]), f"{t['usage'] * 100:.1f}%")
                         for t in data["tiers"]]))
        con.print(table("counters", ["hits", "misses", "evictions", "puts", "gets"],
                        [(stats.hits, stats.misses, stats.evictions, stats.puts, stats.gets)]))
        if data["policy"]:
            causes = ", ".join(f"{k} {v}" for k, v in sorted(data["evicted_by"].items()))
            copied = ", ".join(f"{k} {human_size(v)}" for k, v in
                               sorted(data["copied_bytes"].items()))
            con.print(f"eviction {escape(data['policy'])}: hit ratio "
                      f"{data['hit_ratio']:.3f}; evicted by cause: {causes or 'none'}; "
                      f"copied: {copied or 'nothing'}")

    out.emit(data, human)


def _stats_dict(address: str, stats: StoreStats) -> dict[str, Any]:
    tiers = []
    for name, t in sorted(stats.tiers.items()):
        tiers.append({"tier": name, "segments": t.segments, "objects": t.objects,
                      "bytes_used": t.bytes_used, "capacity": t.capacity,
                      "resident_bytes": t.resident_bytes,
                      "usage": t.bytes_used / t.capacity if t.capacity else 0.0})
    return {"master": address, "objects": stats.objects, "pending": stats.pending,
            "clients": stats.clients, "segments": sum(t["segments"] for t in tiers),
            "tiers": tiers, "hits": stats.hits, "misses": stats.misses,
            "evictions": stats.evictions, "puts": stats.puts, "gets": stats.gets,
            "policy": stats.policy, "evicted_by": dict(stats.evicted_by),
            "copied_bytes": dict(stats.copied_bytes),
            "hit_ratio": stats.hits / stats.gets if stats.gets else 0.0}
