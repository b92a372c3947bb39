"""KVMemory: a decode worker's KV blocks as its sequences grow — the next block of every running
sequence, preemption of the most recently admitted ones when none is free (their KV parked in
the store), and resumption, oldest first, as room comes back. Runs on the decode loop's thread;
the lists it shares with the worker change under the worker's condition `cv`."""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from mooncake_cli.engine import KVCache
from mooncake_cli.engine.errors import CacheFull
from mooncake_cli.worker.decode_request import DecodeRequest
from mooncake_cli.worker.metrics import WorkerMetrics
from mooncake_cli.worker.parking import Parking

log = logging.getLogger("mooncake.worker")


@dataclass
class KVMemory:
    cache: KVCache
    parking: Parking
    metrics: WorkerMetrics
    cv: threading.Condition
    running: list[DecodeRequest]  # in admission order
    preempted: deque[DecodeRequest]
    end: Callable[[DecodeRequest], None]  # finish a request (the caller holds cv)
    stopping: Callable[[], bool]

    @property
    def watermark(self) -> int:
        """Blocks kept free for growth: 1% of the cache."""
        return max(1, self.cache.num_blocks // 100)

    def preempt(self, req: DecodeRequest) -> None:
        """Take `req` out of the batch, park its KV in the store and free its blocks."""
        with self.cv:
            self.running.remove(req)
        parked = self.parking.park(req.seq)
        with self.cv:
            self.cache.release(req.seq.block_table)
            req.seq.num_computed = 0
            req.preemptions += 1
            self.preempted.append(req)
        self.metrics.add("preemptions")
        self.metrics.add("parked_blocks", parked)
        log.info("preempted %s (%d tokens, %d blocks parked)", req.request_id, len(req.seq),
                 parked)

    def make_room(self) -> None:
        """Give every running sequence the block its next token needs, preempting the most
        recently admitted ones while none is free."""
        i = 0
        while i < len(self.running):
            seq = self.running[i].seq
            try:
                self.cache.ensure(seq.block_table, seq.num_computed + 1)
                i += 1
            except CacheFull:
                self.preempt(self.running[-1])

    def resume(self) -> None:
        """Resume preempted sequences, oldest first, each one whose room is free (a long one
        that does not fit yet does not hold back shorter ones: no new reservation is taken
        while any waits, so it gets its room as the others finish)."""
        for req in sorted(self.preempted, key=lambda r: r.order):
            if self.stopping():
                return
            if req.cancelled:
                with self.cv:
                    self.end(req)
                continue
            if self.cache.allocator.free < self.cache.blocks_for(len(req.seq)) + self.watermark:
                continue
            got = self.parking.resume(req.seq)
            self.metrics.add("reloaded_blocks", got.reloaded_blocks)
            self.metrics.add("recomputed_tokens", got.recomputed_tokens)
            with self.cv:
                self.preempted.remove(req)
                self.running.append(req)
                self.running.sort(key=lambda r: r.order)
