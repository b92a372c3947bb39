"""Mooncake Store: the master's metadata/allocation/lease/eviction logic (master/, network-free;
its eviction policies in eviction/), its RPC service (service.MasterService), the wire between
them (wire/), HA through etcd (ha/) and the client (client/: StoreClient, imported on first
use)."""

from types import MappingProxyType
from typing import Any

from mooncake_cli.store.errors import StoreCode, StoreError, error_from_code
from mooncake_cli.store.master import StoreMaster
from mooncake_cli.store.records import (
    MAX_KEY_BYTES,
    MAX_OBJECT_SIZE,
    MAX_REPLICAS,
    Mount,
    ObjectMeta,
    Replica,
    ReplicaStatus,
    ReplicateConfig,
    StoreStats,
    TickReport,
    TierStats,
)

__all__ = [
    "MAX_KEY_BYTES", "MAX_OBJECT_SIZE", "MAX_REPLICAS", "StoreCode", "ObjectMeta", "Replica",
    "ReplicaStatus", "ReplicateConfig", "Mount", "StoreError", "StoreMaster", "StoreStats",
    "TickReport", "TierStats", "error_from_code",
]


_LAZY = MappingProxyType({"StoreClient": "client", "MasterService": "service",
                          "StoreConfig": "config"})


def __getattr__(name: str) -> Any:  # the networked parts load pyzmq and the engine: on demand
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"mooncake_cli.store.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'mooncake_cli.store' has no attribute {name!r}")
