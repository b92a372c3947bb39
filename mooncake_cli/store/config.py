"""Settings of the store's master and clients (frozen, like mooncake_cli.config's dataclasses;
build one with `mooncake_cli.config.load(StoreConfig, "store", file, **flags)`)."""

from __future__ import annotations

from dataclasses import dataclass

from mooncake_cli.config import size_field
from mooncake_cli.interfaces import ConfigError


@dataclass(frozen=True)
class StoreConfig:
    """The master's listener and policy, and what a client needs to reach it."""

    master: str = "127.0.0.1:50051"  # clients: HOST:PORT of the master
    host: str = "127.0.0.1"  # master: bind address
    port: int = 50051  # master: RPC port
    secret: str = ""  # shared secret: every request carries an HMAC-SHA256 keyed by it
    segment_size: int = size_field(64 << 20, "DRAM a client contributes")
    timeout: float = 5.0  # seconds a client waits for one reply
    heartbeat: float = 1.0  # seconds between a client's heartbeats (keep it under client_ttl)
    lease_ttl: float = 5.0
    put_timeout: float = 30.0
    client_ttl: float = 10.0
    high_watermark: float = 0.90
    eviction_ratio: float = 0.05

    def __post_init__(self) -> None:
        if not 0 <= self.port < 65536:
            raise ConfigError(f"port {self.port} is out of range 0-65535")
        if self.segment_size < 0:
            raise ConfigError("segment_size must not be negative")
        if min(self.timeout, self.heartbeat, self.lease_ttl, self.put_timeout,
               self.client_ttl) <= 0:
            raise ConfigError("timeout, heartbeat and the TTLs must be positive")
        if not 0 < self.high_watermark <= 1 or not 0 < self.eviction_ratio <= 1:
            raise ConfigError("high_watermark and eviction_ratio must be in (0, 1]")
