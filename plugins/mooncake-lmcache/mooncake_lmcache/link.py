"""The connector's hold on the store: a transfer engine and a StoreClient, and a breaker that
turns an unreachable store into misses.

When the master does not answer (RpcFailed), the link is marked down for `retry_interval`
seconds: every call meanwhile returns its miss value at once instead of waiting `timeout` again,
and the first call after that asks the master afresh (the client reconnects by itself, and its
heartbeat re-mounts the segment on a restarted or newly elected master). Any other store error
(a key not found, a replica whose transfer failed, a full store) is a miss for that call only.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from mooncake_cli.config import TransferConfig
from mooncake_cli.interfaces import MooncakeError
from mooncake_cli.registry import Registry
from mooncake_cli.store import ReplicateConfig, StoreError
from mooncake_cli.store.client import StoreClient
from mooncake_cli.store.errors import RpcFailed
from mooncake_cli.transfer.engine import TransferEngine

from mooncake_lmcache.settings import PluginSettings, StoreUnreachable

log = logging.getLogger("mooncake_lmcache")
T = TypeVar("T")


class StoreLink:
    """An open StoreClient per `settings`; StoreUnreachable when the master does not answer."""

    def __init__(self, settings: PluginSettings) -> None:
        self.settings = settings
        self.engine = TransferEngine(TransferConfig(host=settings.host, timeout=settings.timeout),
                                     Registry.from_env())
        try:
            self.client = StoreClient(settings.master, self.engine, settings.segment_size,
                                      secret=settings.secret or None, timeout=settings.timeout)
        except MooncakeError as e:
            self.engine.close()
            if isinstance(e, RpcFailed):
                raise StoreUnreachable(f"the mooncake store master at {settings.master} did not "
                                       f"answer within {settings.timeout:g} s: {e}") from e
            raise StoreUnreachable(f"cannot join the mooncake store at {settings.master}: "
                                   f"{e}") from e
        own = self.client.owner.segment.name if self.client.owner.segment is not None else ""
        self.replicate = ReplicateConfig(settings.replica_num,
                                         own if settings.prefer_local else "",
                                         soft_pin=settings.soft_pin)
        self._down_until = 0.0
        self._lock = threading.Lock()

    def land_reads_in(self, pool: Any) -> bool:
        """Register `pool` (LMCache's CPU buffer, a tensor) with the transfer engine, so that
        reads into buffers carved from it land there with no staging copy; False when it
        cannot be (reads are then staged)."""
        if pool is None or not hasattr(pool, "numel") or pool.numel() == 0:
            return False
        try:
            self.engine.register(pool)
        except MooncakeError as e:
            log.info("mooncake store: reads are staged (LMCache's buffer not registered: %s)", e)
            return False
        return True

    @property
    def up(self) -> bool:
        """False while a recent failure to reach the master is being waited out."""
        return time.monotonic() >= self._down_until

    def guard(self, what: str, call: Callable[[], T], miss: T) -> T:
        """`call()`, or `miss` when the store is down or refuses (the reason logged)."""
        if not self.up:
            return miss
        try:
            return call()
        except RpcFailed as e:
            self.mark_down(e)
        except StoreError as e:
            log.warning("mooncake store %s: %s", what, e)
        return miss

    def mark_down(self, why: Exception) -> None:
        with self._lock:
            first = self.up
            self._down_until = time.monotonic() + self.settings.retry_interval
        if first:
            log.warning("mooncake store at %s is unreachable (%s); answering misses for %g s",
                        self.settings.master, why, self.settings.retry_interval)

    def close(self) -> None:
        try:
            self.client.close()
        finally:
            self.engine.close()
