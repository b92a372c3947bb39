"""A segment: the named set of buffers one engine has registered, in one offset space.

Each registered buffer becomes a `Region` with a `base` in the segment's offset space (aligned,
never reused), so a peer addresses memory as (segment name, offset). Every access is checked
against the regions: nothing outside them is ever read or written.

A segment made with `addressed=True` puts each region at its own virtual address (the base is
the memory's address in this process), so peers address it as upstream Mooncake's engine does:
by raw pointers (mooncake_cli.compat.engine). Its regions must not overlap.

Host memory is read and written in place. Device memory (a CUDA tensor) has no host view: its
bytes are staged through host buffers with `load` (device -> host) and `sink` + `commit`
(host -> device), one slice at a time.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field
from typing import Any

from mooncake_cli.interfaces import RegionInfo, TransferError

ALIGN = 4096
_LOCATION = re.compile(r"^(cpu|cuda|npu):\d+$")


@dataclass(frozen=True)
class Region:
    base: int
    length: int
    location: str
    view: memoryview | None  # host memory, byte-addressed; None for device memory
    shm: str | None = None
    keep: Any = None  # the registered object, kept alive while registered
    device: Any = None  # flat uint8 tensor on a device, when `view` is None
    # transports' opaque fields for this region, filled by the engine as each endpoint
    # registers it (before the region is published)
    extra: dict[str, str] = field(default_factory=dict, compare=False, hash=False)

    def info(self) -> RegionInfo:
        return RegionInfo(self.base, self.length, self.location, dict(self.extra))

    def load(self, start: int, n: int) -> memoryview:
        """Bytes [start, start+n) in host memory: the region itself, or a staged copy."""
        if self.view is not None:
            return self.view[start:start + n]
        return memoryview(self.device[start:start + n].cpu().numpy()).cast("B")

    def sink(self, start: int, n: int) -> memoryview:
        """Host memory to receive bytes meant for [start, start+n); then call `commit`."""
        if self.view is not None:
            return self.view[start:start + n]
        return memoryview(bytearray(n))

    def commit(self, start: int, data: memoryview) -> None:
        """Move bytes received into a `sink` buffer to the device (nothing to do for host)."""
        if self.view is None and len(data):
            import torch

            self.device[start:start + len(data)].copy_(torch.frombuffer(data, dtype=torch.uint8))


def host_view(obj: Any) -> tuple[memoryview, str]:
    """A writable byte view of `obj` and its location; ValueError explains what is wrong."""
    mod = type(obj).__module__
    if mod.startswith("torch"):
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


class Overlap(ValueError):
    """A region of an addressed segment would overlap one already registered."""


def address_of(view: memoryview | None, device: Any) -> int:
    """The virtual address of a host view's first byte, or of a device tensor's."""
    if view is None:
        return int(device.data_ptr())
    import numpy as np

    return int(np.frombuffer(view, np.uint8).ctypes.data) if len(view) else 0


class Segment:
    """Registered regions of one engine. Lookups read an immutable snapshot: no lock needed."""

    def __init__(self, name: str, addressed: bool = False) -> None:
        self.name = name
        self.addressed = addressed
        self._lock = threading.Lock()
        self._regions: tuple[Region, ...] = ()
        self._next = 0

    def register(self, obj: Any, location: str | None = None, shm: str | None = None,
                 view: memoryview | None = None) -> Region:
        if view is None and type(obj).__module__.startswith("torch") and \
                obj.device.type != "cpu":
            return self.register_device(obj)
        if view is None:
            view, loc = host_view(obj)
        else:
            loc = "cpu:0"
        return self._add(len(view), location or loc, view, shm, obj, None)

    def register_device(self, tensor: Any, location: str | None = None) -> Region:
        """Register a contiguous tensor whose bytes move through host staging buffers."""
        import torch

        if not tensor.is_contiguous():
            raise ValueError("tensor must be contiguous")
        flat = tensor.reshape(-1).view(torch.uint8)
        dev = tensor.device
        return self._add(flat.numel(), location or f"{dev.type}:{dev.index or 0}", None, None,
                         tensor, flat)

    def _add(self, length: int, location: str, view: memoryview | None, shm: str | None,
             keep: Any, device: Any) -> Region:
        if not _LOCATION.match(location):
            raise ValueError(f"bad location '{location}': use cpu:N, cuda:N or npu:N")
        with self._lock:
            if self.addressed:
                base = address_of(view, device)
                for r in self._regions:
                    if base < r.base + r.length and r.base < base + max(length, 1):
                        raise Overlap(f"[{base:#x}, {base + length:#x}) overlaps the region "
                                      f"registered at {r.base:#x} ({r.length} bytes)")
            else:
                base = self._next
                self._next += (length + ALIGN - 1) // ALIGN * ALIGN or ALIGN
            region = Region(base, length, location, view, shm, keep, device)
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

    def locate(self, offset: int, length: int) -> tuple[Region, int]:
        """The region holding [offset, offset+length) and the start inside it; TransferError
        when the range is not inside one region."""
        if offset < 0 or length < 0:
            raise TransferError(f"negative offset or length ({offset}, {length})")
        for r in self._regions:
            if r.base <= offset and offset + length <= r.base + r.length:
                return r, offset - r.base
        raise TransferError(f"out of bounds: [{offset}, {offset + length}) is not inside one "
                            f"registered region of segment '{self.name}'")
