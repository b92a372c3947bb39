"""BookingOrder: a conductor's decode booking holds only if it fits in etcd's order.

Conductors decide on their own view of the others' bookings, which lags by the time a booking
takes to reach them; two deciding at once (when a booking ends and each has a request waiting,
say) could both take the same room. So a booking, once decided, waits before its prefill is
sent: until it is written to etcd (at some revision r) and this conductor's watch has read
everything up to r. It then holds if this conductor's own bookings on that decode instance
written at or before r, plus the peers' bookings written before r that are still there, fit
the instance's KV capacity; otherwise it is given up and the request waits at the head of the
queue again (decided anew, on a view that now holds the bookings ahead of it). Every conductor
applies the same rule to the same total order, so the bookings that hold never add up to more
than the capacity. A booking whose check does not come within `timeout` seconds (etcd out of
reach) holds, and is counted in `timeouts`: the decode worker still refuses what it cannot hold.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from mooncake_cli.scheduler.state import Cluster

log = logging.getLogger(__name__)


@dataclass
class _Own:
    decode: str
    tokens: int
    revision: float = math.inf  # until written


def _resolve(fut: asyncio.Future[bool], value: bool) -> None:
    if not fut.done():
        fut.set_result(value)


class BookingOrder:
    """`peers_before(decode, revision)` gives the peers' bookings ahead of `revision`;
    `synced()` the revision this conductor's watch has read up to."""

    def __init__(self, cluster: Cluster, lock: threading.RLock,
                 peers_before: Callable[[str, int], int], synced: Callable[[], int],
                 timeout: float = 5.0) -> None:
        self.cluster, self.lock = cluster, lock
        self.peers_before, self.synced = peers_before, synced
        self.timeout = timeout
        self.held = self.yielded = self.timeouts = 0
        self.waits: deque[float] = deque(maxlen=1024)  # seconds each recent check took
        self._mine = threading.Lock()
        self._own: dict[str, _Own] = {}  # this conductor's live bookings by etcd key
        self._waiting: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Future[bool]]] = {}

    # -- what this conductor's bookings do ------------------------------------------------
    def booked(self, key: str, decode: str, tokens: int) -> None:
        with self._mine:
            self._own[key] = _Own(decode, tokens)

    def released(self, key: str) -> None:
        with self._mine:
            self._own.pop(key, None)

    def written(self, keys: list[str], revision: int) -> None:
        """The publisher wrote these bookings at `revision`."""
        with self._mine:
            for key in keys:
                own = self._own.get(key)
                if own is not None:
                    own.revision = revision
        self.check()

    async def holds(self, key: str) -> bool:
        """Whether booking `key` holds in etcd's order (True for a key not booked here)."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[bool] = loop.create_future()
        with self._mine:
            if key not in self._own:
                return True
            self._waiting[key] = (loop, fut)
        self.check()
        start = time.monotonic()
        try:
            held = await asyncio.wait_for(fut, self.timeout)
            self.waits.append(time.monotonic() - start)
            return held
        except TimeoutError:
            self.timeouts += 1
            log.warning("booking %s not confirmed in etcd's order within %.0f s: taken as "
                        "held", key, self.timeout)
            return True
        finally:
            with self._mine:
                self._waiting.pop(key, None)

    def wait_ms(self) -> dict[str, float | None]:
        """p50 and p99 of the recent checks' waits, in milliseconds."""
        waits = sorted(self.waits)
        if not waits:
            return {"p50": None, "p99": None}
        return {q: round(waits[min(len(waits) - 1, int(f * len(waits)))] * 1e3, 2)
                for q, f in (("p50", 0.5), ("p99", 0.99))}

    # -- deciding -------------------------------------------------------------------------
    def check(self) -> None:
        """Decide every waiting booking that is written and read back (any thread)."""
        synced = self.synced()
        with self._mine:
            ready = [(*self._waiting.pop(key), self._own[key]) for key in list(self._waiting)
                     if key in self._own and self._own[key].revision <= synced]
        for loop, fut, own in ready:
            ok = self._fits(own.decode, own.revision)
            if ok:
                self.held += 1
            else:
                self.yielded += 1
            loop.call_soon_threadsafe(_resolve, fut, ok)

    def _fits(self, decode: str, revision: float) -> bool:
        with self._mine:
            own = sum(o.tokens for o in self._own.values()
                      if o.decode == decode and o.revision <= revision)
        with self.lock:
            state = self.cluster.by_name.get(decode)
            cap = state.kv_capacity_tokens if state is not None else None
            return cap is None or own + self.peers_before(decode, int(revision)) <= cap
