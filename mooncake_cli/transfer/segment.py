"""A segment: the named set of buffers one engine has registered, in one offset space.

Each registered buffer becomes a `Region` with a `base` in the segment's offset space (aligned,
never reused), so a peer addresses memory as (segment name, offset). Every access is checked
against the regions: nothing outside them is ever read or written.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from typing import Any

from mooncake_cli.interfaces import RegionInfo, TransferError

ALIGN = 4096
_LOCATION = re.compile(r"^(cpu|cuda|npu):\d+$")


@dataclass(frozen=True)
class Region:
    base: int
    length: int
    location: str
    view: memoryview  # host memory, byte-addressed
    shm: str | None = None
    keep: Any = None  # the registered object, kept alive while registered

    def info(self) -> RegionInfo:
        return RegionInfo(self.base, self.length, self.location, self.shm)


def host_view(obj: Any) -> tuple[memoryview, str]:
    """A writable byte view of `obj` and its location; ValueError explains what is wrong."""
    mod = type(obj).__module__
    if mod.startswith("torch"):
        if obj.device.type != "cpu":
            raise ValueError(f"tensors on {obj.device} cannot be registered: this engine moves "
                             "host memory; copy the tensor to the CPU (pinned) first")
        if not obj.is_contiguous():
            raise ValueError("tensor must be contiguous")
        import torch

        arr = obj.reshape(-1).view(torch.uint8).numpy()
        return memoryview(arr).cast("B"), "cpu:0"
    try:
        view = memoryview(obj)
    except TypeError as e:
        raise ValueError(f"cannot register {type(obj).__name__}: not a buffer") from e
    if view.readonly:
        raise ValueError(f"{type(obj).__name__} is read-only; register a writable buffer "
                         "(bytearray, numpy array, tensor)")
    if not view.c_contiguous:
        raise ValueError("buffer must be C-contiguous")
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view, "cpu:0"


class Segment:
    """Registered regions of one engine. Lookups read an immutable snapshot: no lock needed."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._regions: tuple[Region, ...] = ()
        self._next = 0

    def register(self, obj: Any, location: str | None = None, shm: str | None = None,
                 view: memoryview | None = None) -> Region:
        if view is None:
            view, loc = host_view(obj)
        else:
            loc = "cpu:0"
        location = location or loc
        if not _LOCATION.match(location):
            raise ValueError(f"bad location '{location}': use cpu:N, cuda:N or npu:N")
        with self._lock:
            region = Region(self._next, len(view), location, view, shm, obj)
            self._next += (len(view) + ALIGN - 1) // ALIGN * ALIGN or ALIGN
            self._regions = (*self._regions, region)
        return region

    def unregister(self, region: Region) -> None:
        with self._lock:
            if region not in self._regions:
                raise ValueError(f"region at offset {region.base} is not registered")
            self._regions = tuple(r for r in self._regions if r is not region)

    @property
    def regions(self) -> tuple[Region, ...]:
        return self._regions

    def view(self, offset: int, length: int) -> memoryview:
        """The bytes [offset, offset+length) of one region; TransferError when out of bounds."""
        if offset < 0 or length < 0:
            raise TransferError(f"negative offset or length ({offset}, {length})")
        for r in self._regions:
            if r.base <= offset and offset + length <= r.base + r.length:
                start = offset - r.base
                return r.view[start:start + length]
        raise TransferError(f"out of bounds: [{offset}, {offset + length}) is not inside one "
                            f"registered region of segment '{self.name}'")
