"""Where a read can land without staging: the engine's registered host memory holding a
caller's buffer (a caller that registered, say, its whole KV buffer pool once has every read
into that pool go straight there)."""

from __future__ import annotations

import ctypes

from mooncake_cli.transfer.engine import TransferEngine
from mooncake_cli.transfer.segment import Region


def address(view: memoryview) -> int:
    """The address of a writable, non-empty byte view's first byte."""
    return ctypes.addressof(ctypes.c_char.from_buffer(view))


class Landing:
    """Finds the registered region of `engine` that holds a buffer (addresses cached)."""

    def __init__(self, engine: TransferEngine) -> None:
        self.engine = engine
        self._starts: dict[int, int] = {}  # region base -> address of its host memory

    def find(self, dest: memoryview) -> tuple[Region, int] | None:
        """The host region holding all of `dest` and where `dest` starts in it, or None (for a
        read-only or empty view too)."""
        if dest.readonly or not dest.nbytes:
            return None
        at = address(dest)
        for region in self.engine.segment.regions:
            if region.view is None or region.view.readonly:
                continue
            start = self._starts.get(region.base)
            if start is None:
                start = self._starts[region.base] = address(region.view)
            if start <= at and at + dest.nbytes <= start + region.length:
                return region, at - start
        return None
