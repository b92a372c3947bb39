"""The staging region a store client moves remote replicas through: registered with the engine
once and reused (grown on demand up to MAX_STAGE), so no op registers memory of its own.

glibc's heap settings that make the values a get returns cheap are the process owner's choice
(mooncake_cli.heap.tune_heap, called by the roles): this runs inside hosts too.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from mooncake_cli.transfer.engine import TransferEngine
from mooncake_cli.transfer.segment import Region

MIN_STAGE = 16 << 20
MAX_STAGE = 256 << 20  # bytes of the staging region at most


class Staging:
    """One reusable region of `engine`, used by one caller at a time."""

    def __init__(self, engine: TransferEngine) -> None:
        self.engine = engine
        self._region: Region | None = None
        self._lock = threading.Lock()

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
