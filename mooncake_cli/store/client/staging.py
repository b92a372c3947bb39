"""The staging region a store client moves remote replicas through: registered with the engine
once and reused (grown on demand up to MAX_STAGE), so no op registers memory of its own.

Also `keep_freed_memory`: the values a get returns are fresh multi-MiB `bytes`, and glibc hands
each freed one back to the kernel, so the next lands in fresh pages and page-faults its way
through the copy (1.5 GB/s instead of memcpy speed here); this lets freed blocks be reused.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from mooncake_cli.transfer.engine import TransferEngine
from mooncake_cli.transfer.segment import Region

MIN_STAGE = 16 << 20
MAX_STAGE = 256 << 20  # bytes of the staging region at most
KEEP_FREED = 512 << 20  # free heap bytes glibc may keep (see keep_freed_memory)


def keep_freed_memory() -> None:
    """Let glibc serve blocks under 64 MiB from the heap and keep up to KEEP_FREED bytes of it
    free for reuse. Idempotent; a no-op off glibc."""
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt(-3, 64 << 20)  # M_MMAP_THRESHOLD
        libc.mallopt(-1, KEEP_FREED)  # M_TRIM_THRESHOLD
    except (OSError, AttributeError):
        pass


class Staging:
    """One reusable region of `engine`, used by one caller at a time."""

    def __init__(self, engine: TransferEngine) -> None:
        self.engine = engine
        self._region: Region | None = None
        self._lock = threading.Lock()
        keep_freed_memory()

    @contextmanager
    def hold(self, need: int) -> Iterator[Region | None]:
        """The region, at least `need` bytes, for the caller alone until the block ends; None
        when `need` is over MAX_STAGE (register the caller's own buffer instead)."""
        with self._lock:
            if need > MAX_STAGE:
                yield None
                return
            if self._region is None or self._region.length < need:
                if self._region is not None:
                    self.engine.unregister(self._region)
                    self._region = None
                size = MIN_STAGE
                while size < need:
                    size *= 2
                self._region = self.engine.allocate(min(size, MAX_STAGE), shared=False)
            yield self._region

    def close(self) -> None:
        with self._lock:
            if self._region is not None:
                self.engine.unregister(self._region)
                self._region = None
