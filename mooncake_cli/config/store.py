"""Settings of the store's master and clients (frozen, like mooncake_cli.config's dataclasses;
build one with `mooncake_cli.config.load(StoreConfig, "store", file, **flags)`)."""

from __future__ import annotations

from dataclasses import dataclass

from mooncake_cli.api.kv_events import endpoint_of
from mooncake_cli.config import size_field
from mooncake_cli.etcd import EtcdUrl, is_etcd
from mooncake_cli.interfaces import ConfigError, MooncakeError


@dataclass(frozen=True)
class StoreConfig:
    """The master's listener and policy, and what a client needs to reach it."""

    master: str = "127.0.0.1:50051"  # clients: HOST:PORT of the master, or etcd://... (HA)
    host: str = "127.0.0.1"  # master: bind address
    port: int = 50051  # master: RPC port
    metrics_port: int = -1  # master: HTTP port of /metrics and /health (-1: off, 0: any free)
    ha: str = ""  # master: etcd://HOST:PORT[,...][/CLUSTER] to run as an HA candidate
    kv_events: str = ""  # master: ZMQ endpoint (or PORT) to publish object events on; "" off
    kv_events_replay: str = ""  # master: their replay endpoint ("": kv_events' port + 1)
    secret: str = ""  # shared secret: every request carries an HMAC-SHA256 keyed by it
    encrypt: bool = False  # CurveZMQ on the RPC, keyed by the secret (master and clients)
    segment_size: int = size_field(64 << 20, "DRAM a client contributes")
    timeout: float = 5.0  # seconds a client waits for one reply
    heartbeat: float = 1.0  # seconds between a client's heartbeats (keep it under client_ttl)
    lease_ttl: float = 5.0
    put_timeout: float = 30.0
    client_ttl: float = 10.0
    high_watermark: float = 0.90
    eviction_ratio: float = 0.05
    eviction: str = "lru"  # master: eviction policy (lru, lfu, adaptive, arc, prefix, a plugin's)
    soft_pin_ttl: float = 1800.0  # master: seconds a soft pin lasts after the last use
    enable_offload: bool = True  # master: use clients' SSD segments (off: DRAM only)
    offload_on_evict: bool = True  # master: an evicted object goes to its client's SSD
    promotion_on_hit: bool = True  # master: an SSD-only object is copied back to DRAM on gets
    promotion_admission_threshold: int = 1  # master: gets of an SSD-only object before promotion
    root_fs_dir: str = ""  # master: a shared directory clients of the upstream API persist to
    cluster_id: str = "mooncake_cluster"  # master: its subdirectory of root_fs_dir
    ssd_dir: str = ""  # node: directory of its SSD tier (data file + manifest); "" for none
    ssd_size: int = size_field(0, "SSD a node contributes (0: the data file's present size)")
    hugepages: bool = False  # node: DRAM segment on huge pages (falls back with a warning)

    def __post_init__(self) -> None:
        if not 0 <= self.port < 65536:
            raise ConfigError(f"port {self.port} is out of range 0-65535")
        if not -1 <= self.metrics_port < 65536:
            raise ConfigError(f"metrics_port {self.metrics_port} is out of range 0-65535 "
                              f"(-1: no metrics)")
        if self.ha:
            EtcdUrl.parse(self.ha, "an HA address")  # ConfigError saying what is wrong
        if self.kv_events_replay and not self.kv_events:
            raise ConfigError("kv_events_replay needs kv_events, the events' endpoint")
        for name in ("kv_events", "kv_events_replay"):
            if getattr(self, name):
                try:
                    endpoint_of(getattr(self, name), self.host)
                except MooncakeError as e:
                    raise ConfigError(f"{name}: {e}") from None
        if is_etcd(self.master):
            EtcdUrl.parse(self.master, "an HA address")
        if self.segment_size < 0:
            raise ConfigError("segment_size must not be negative")
        if self.ssd_size < 0:
            raise ConfigError("ssd_size must not be negative")
        if self.ssd_size and not self.ssd_dir:
            raise ConfigError("ssd_size needs ssd_dir, the directory of the SSD tier")
        if min(self.timeout, self.heartbeat, self.lease_ttl, self.put_timeout,
               self.client_ttl, self.soft_pin_ttl) <= 0:
            raise ConfigError("timeout, heartbeat and the TTLs must be positive")
        if self.promotion_admission_threshold < 1:
            raise ConfigError("promotion_admission_threshold must be at least 1 get")
        if self.root_fs_dir and not self.root_fs_dir.startswith("/"):
            raise ConfigError(f"root_fs_dir {self.root_fs_dir!r} must be an absolute path")
        if not self.cluster_id or self.cluster_id in (".", "..") or "/" in self.cluster_id \
                or "\0" in self.cluster_id:
            raise ConfigError(f"cluster_id {self.cluster_id!r} must be a directory name")
        if not 0 < self.high_watermark <= 1 or not 0 < self.eviction_ratio <= 1:
            raise ConfigError("high_watermark and eviction_ratio must be in (0, 1]")
        if not isinstance(self.eviction, str) or not self.eviction:
            raise ConfigError(f"an eviction policy is a name, not {self.eviction!r}")
        # the name itself is checked when the master makes its policy (store.eviction)
