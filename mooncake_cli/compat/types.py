"""Upstream `mooncake.store`'s small types: SoftPinAction, ReplicateConfig, the replica
descriptors of get_replica_desc, and BufferHandle (get_buffer's result).

ReplicateConfig has upstream 0.3.x's attributes (set after construction): `replica_num`
(best effort), `with_hard_pin`, `soft_pin_action` (PRESERVE / ENABLE / DISABLE), `soft_pin_ttl_ms`
(None or 0: the master's default), `preferred_segment` and `preferred_segments` (tried in order);
`with_soft_pin` (upstream <= 0.3.6) is the same switch as `soft_pin_action`. The placement
attributes of upstream's NoF/DFS tiers (`nof_replica_num`, `dfs_replica_num`,
`preferred_nof_segments`, `prefer_alloc_in_same_node`, `group_ids`, `data_type`) are kept and
shown, and have no effect here.
"""

from __future__ import annotations

import ctypes
import enum
from dataclasses import dataclass
from typing import Any

from mooncake_cli.store import records
from mooncake_cli.store.errors import ErrorCode, StoreError

__all__ = ["SoftPinAction", "ReplicateConfig", "ReplicaStatus", "BufferHandle",
           "ReplicaDescriptor", "MemoryDescriptor", "DiskDescriptor", "BufferDescriptor"]


class SoftPinAction(enum.IntEnum):
    PRESERVE = 0  # a new object: not soft-pinned (upsert: see the README)
    ENABLE = 1
    DISABLE = 2


class ReplicaStatus(enum.IntEnum):
    UNDEFINED = 0
    INITIALIZED = 1
    PROCESSING = 2
    COMPLETE = 3
    REMOVED = 4
    FAILED = 5


class ReplicateConfig:
    """Upstream's mutable placement config."""

    def __init__(self) -> None:
        self.replica_num = 1
        self.with_hard_pin = False
        self.soft_pin_action = SoftPinAction.PRESERVE
        self.soft_pin_ttl_ms: int | None = None
        self.preferred_segment = ""
        self.preferred_segments: list[str] = []
        self.nof_replica_num = 0
        self.dfs_replica_num = 0
        self.preferred_nof_segments: list[str] = []
        self.prefer_alloc_in_same_node = False
        self.group_ids: list[int] | None = None
        self.data_type = 0

    @property
    def with_soft_pin(self) -> bool:
        return SoftPinAction(self.soft_pin_action) is SoftPinAction.ENABLE

    @with_soft_pin.setter
    def with_soft_pin(self, on: bool) -> None:
        self.soft_pin_action = SoftPinAction.ENABLE if on else SoftPinAction.DISABLE

    def _native(self) -> records.ReplicateConfig:
        ttl = self.soft_pin_ttl_ms
        if ttl is not None and (not isinstance(ttl, int) or ttl < 0):
            raise StoreError(f"soft_pin_ttl_ms must be an integer >= 0, not {ttl!r}",
                             ErrorCode.INVALID_PARAMS)
        segs = [str(s) for s in self.preferred_segments or []]
        return records.ReplicateConfig(
            int(self.replica_num), str(self.preferred_segment or ""), self.with_soft_pin,
            bool(self.with_hard_pin), tuple(segs), (ttl or 0) / 1000)

    def __str__(self) -> str:
        ttl = "default" if self.soft_pin_ttl_ms is None else self.soft_pin_ttl_ms
        segs = ", ".join(self.preferred_segments or [])
        return (f"ReplicateConfig: {{ replica_num: {self.replica_num}, nof_replica_num: "
                f"{self.nof_replica_num}, dfs_replica_num: {self.dfs_replica_num}, "
                f"soft_pin_action: {SoftPinAction(self.soft_pin_action).name}, "
                f"soft_pin_ttl_ms: {ttl}, with_hard_pin: {int(bool(self.with_hard_pin))}, "
                f"preferred_segments: [{segs}], preferred_nof_segments: "
                f"[{', '.join(self.preferred_nof_segments)}], prefer_alloc_in_same_node: "
                f"{int(bool(self.prefer_alloc_in_same_node))} }}")


def native(config: Any) -> records.ReplicateConfig | None:
    """Our master's config of an upstream-style (or our own) ReplicateConfig."""
    if config is None or isinstance(config, records.ReplicateConfig):
        return config
    if isinstance(config, ReplicateConfig):
        return config._native()
    raise StoreError(f"config must be a ReplicateConfig, not {type(config).__name__}",
                     ErrorCode.INVALID_PARAMS)


@dataclass(frozen=True)
class BufferDescriptor:
    buffer_address: int
    size: int
    transport_endpoint: str


@dataclass(frozen=True)
class MemoryDescriptor:
    buffer_descriptor: BufferDescriptor


@dataclass(frozen=True)
class DiskDescriptor:
    file_path: str
    object_size: int


class ReplicaDescriptor:
    """One replica of an object as get_replica_desc shows it."""

    def __init__(self, replica: records.Replica | None, file: DiskDescriptor | None = None
                 ) -> None:
        self._r, self._file = replica, file
        self.status = ReplicaStatus.COMPLETE if replica is None or replica.status is \
            records.ReplicaStatus.COMPLETE else ReplicaStatus.PROCESSING

    @classmethod
    def file(cls, path: str, size: int) -> ReplicaDescriptor:
        """An object's file under the master's root_fs_dir (upstream's DISK replica)."""
        return cls(None, DiskDescriptor(path, size))

    def is_memory_replica(self) -> bool:
        return self._r is not None and self._r.tier == "dram"

    def is_disk_replica(self) -> bool:
        return self._file is not None

    def is_local_disk_replica(self) -> bool:
        """On a client's SSD segment (upstream's LOCAL_DISK: enable_ssd_offload)."""
        return self._r is not None and self._r.tier == "ssd"

    def get_memory_descriptor(self) -> MemoryDescriptor:
        if not self.is_memory_replica():
            raise RuntimeError("not a memory replica")
        r = self._r
        assert r is not None
        return MemoryDescriptor(BufferDescriptor(r.offset, r.size, r.segment))

    def get_disk_descriptor(self) -> DiskDescriptor:
        """A file replica's path and size; an SSD segment replica's as `segment@offset`."""
        if self._file is not None:
            return self._file
        if self._r is None or self._r.tier != "ssd":
            raise RuntimeError("not a disk replica")
        return DiskDescriptor(f"{self._r.segment}@{self._r.offset}", self._r.size)


class BufferHandle(bytearray):
    """An object's bytes held by the caller (get_buffer): `ptr()` and `size()` as upstream,
    and the buffer protocol (bytes(h), memoryview(h), numpy.frombuffer(h))."""

    def ptr(self) -> int:
        return ctypes.addressof((ctypes.c_char * max(len(self), 1)).from_buffer(self)) \
            if len(self) else 0

    def size(self) -> int:
        return len(self)
