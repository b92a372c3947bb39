"""Mooncake Store: the master's metadata/allocation/lease/eviction logic (network-free)."""

from mooncake_cli.store.errors import ErrorCode, StoreError, error_from_code
from mooncake_cli.store.master import StoreMaster
from mooncake_cli.store.records import (
    MAX_KEY_BYTES,
    MAX_OBJECT_SIZE,
    MAX_REPLICAS,
    ObjectMeta,
    Replica,
    ReplicaStatus,
    ReplicateConfig,
    Segment,
    StoreStats,
    TickReport,
    TierStats,
)

__all__ = [
    "MAX_KEY_BYTES", "MAX_OBJECT_SIZE", "MAX_REPLICAS", "ErrorCode", "ObjectMeta", "Replica",
    "ReplicaStatus", "ReplicateConfig", "Segment", "StoreError", "StoreMaster", "StoreStats",
    "TickReport", "TierStats", "error_from_code",
]
