"""Upstream `mooncake.store`'s small types: SoftPinAction, ReplicateConfig, the replica
descriptors of get_replica_desc, and BufferHandle (get_buffer's result).

ReplicateConfig has upstream 0.3.x's attributes (set after construction): `replica_num`
(best effort), `with_hard_pin`, `soft_pin_action` (PRESERVE / ENABLE / DISABLE), `soft_pin_ttl_ms`
(None or 0: the master's default), `preferred_segment` and `preferred_segments` (tried in order);
`with_soft_pin` (upstream <= 0.3.6) is the same switch as `soft_pin_action`. The placement
attributes of upstream's NoF/DFS tiers (`nof_replica_num`, `dfs_replica_num`,
`preferred_nof_segments`, `prefer_alloc_in_same_node`, `group_ids` (None or a list of str),
`data_type` (an ObjectDataType)) are kept and shown, and have no effect here. As upstream's
pybind11 class, a value of the wrong type raises TypeError when it is set (pyconv.py), and no
other attribute can be set.
"""

from __future__ import annotations

import ctypes
import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mooncake_cli.compat import pyconv
from mooncake_cli.store import records
from mooncake_cli.store.errors import StoreCode, StoreError

__all__ = ["SoftPinAction", "ObjectDataType", "ReplicateConfig", "ReplicaStatus",
           "BufferHandle", "ReplicaDescriptor", "MemoryDescriptor", "DiskDescriptor",
           "BufferDescriptor"]


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


class ObjectDataType(enum.IntEnum):
    """What an object holds (upstream's placement hint; no effect here)."""

    UNKNOWN = 0
    KVCACHE = 1
    TENSOR = 2
    WEIGHT = 3
    SAMPLE = 4
    ACTIVATION = 5
    GRADIENT = 6
    OPTIMIZER_STATE = 7
    METADATA = 8
    GENERAL = 9


class _Field:
    """One of ReplicateConfig's typed attributes: set through `convert` (pyconv.py), so a value
    of the wrong type raises TypeError as upstream's pybind11 setter does."""

    def __init__(self, convert: Callable[[Any], Any], default: Callable[[], Any]) -> None:
        self.convert, self.default = convert, default

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        return self if obj is None else obj._values[self.name]

    def __set__(self, obj: Any, value: Any) -> None:
        obj._values[self.name] = self.convert(value)

    def __delete__(self, obj: Any) -> None:
        raise AttributeError(f"{self.name} cannot be deleted")


class ReplicateConfig:
    """Upstream's mutable placement config: its attributes only, each of its type."""

    __slots__ = ("_values",)
    replica_num = _Field(pyconv.as_u64, lambda: 1)
    with_hard_pin = _Field(pyconv.as_bool, lambda: False)
    soft_pin_action = _Field(pyconv.as_enum(SoftPinAction), lambda: SoftPinAction.PRESERVE)
    soft_pin_ttl_ms = _Field(pyconv.as_optional_u64, lambda: None)
    preferred_segment = _Field(pyconv.as_str, lambda: "")
    preferred_segments = _Field(pyconv.as_str_list, list)
    nof_replica_num = _Field(pyconv.as_u64, lambda: 0)
    dfs_replica_num = _Field(pyconv.as_u64, lambda: 0)
    preferred_nof_segments = _Field(pyconv.as_str_list, list)
    prefer_alloc_in_same_node = _Field(pyconv.as_bool, lambda: False)
    group_ids = _Field(pyconv.as_optional_str_list, lambda: None)
    data_type = _Field(pyconv.as_enum(ObjectDataType), lambda: ObjectDataType.UNKNOWN)

    def __init__(self) -> None:
        self._values = {k: f.default() for k, f in vars(ReplicateConfig).items()
                        if isinstance(f, _Field)}

    @property
    def with_soft_pin(self) -> bool:
        return SoftPinAction(self.soft_pin_action) is SoftPinAction.ENABLE

    @with_soft_pin.setter
    def with_soft_pin(self, on: Any) -> None:
        on = pyconv.as_bool(on)
        self.soft_pin_action = SoftPinAction.ENABLE if on else SoftPinAction.DISABLE

    def _native(self) -> records.ReplicateConfig:
        return records.ReplicateConfig(
            self.replica_num, self.preferred_segment, self.with_soft_pin, self.with_hard_pin,
            tuple(self.preferred_segments), (self.soft_pin_ttl_ms or 0) / 1000)

    def __str__(self) -> str:
        ttl = "default" if self.soft_pin_ttl_ms is None else self.soft_pin_ttl_ms
        segs = ", ".join(self.preferred_segments or [])
        return (f"ReplicateConfig: {{ replica_num: {self.replica_num}, nof_replica_num: "
                f"{self.nof_replica_num}, dfs_replica_num: {self.dfs_replica_num}, "
                f"soft_pin_action: {SoftPinAction(self.soft_pin_action).name}, "
                f"soft_pin_ttl_ms: {ttl}, with_hard_pin: {int(self.with_hard_pin)}, "
                f"preferred_segments: [{segs}], preferred_nof_segments: "
                f"[{', '.join(self.preferred_nof_segments)}], prefer_alloc_in_same_node: "
                f"{int(self.prefer_alloc_in_same_node)}, data_type: {self.data_type.name}"
                + ("" if self.group_ids is None else f", group_ids: [{', '.join(self.group_ids)}]")
                + " }")


def native(config: Any) -> records.ReplicateConfig | None:
    """Our master's config of an upstream-style (or our own) ReplicateConfig."""
    if config is None or isinstance(config, records.ReplicateConfig):
        return config
    if isinstance(config, ReplicateConfig):
        return config._native()
    raise StoreError(f"config must be a ReplicateConfig, not {type(config).__name__}",
                     StoreCode.INVALID_PARAMS)


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
