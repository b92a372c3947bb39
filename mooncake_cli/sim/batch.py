"""A simulated continuous-batching instance: decode steps for its running batch and, when
colocated (as in vLLM), the prefills of its own queue, either run whole (stalling the batch,
prefill first) or in chunks sharing each step's token budget with the decodes.

Runs of identical decode steps are simulated as one event, cut short at the next step
boundary when a request joins.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable

from mooncake_cli.scheduler.costmodel import CostModel
from mooncake_cli.scheduler.index import CacheIndex
from mooncake_cli.scheduler.state import InstanceState
from mooncake_cli.sim.events import EventLoop, SimRecord


class BatchInstance:
    """Decode (and optionally prefill) on one simulated instance."""

    def __init__(self, state: InstanceState, model: CostModel, loop: EventLoop,
                 index: CacheIndex | None = None, chunk_tokens: int = 0,
                 on_first_token: Callable[[SimRecord], None] | None = None,
                 booked: bool = True) -> None:
        self.state, self.model, self.loop = state, model, loop
        self.booked = booked  # the scheduler counted the request in state.batch already
        self.index, self.chunk = index, chunk_tokens
        self.on_first_token = on_first_token
        self.batch: list[SimRecord] = []
        self.waiting: deque[SimRecord] = deque()  # colocated: prefills in arrival order
        self.joining: list[SimRecord] = []
        self._ctx = 0  # KV tokens held by the batch
        self._head_done = 0  # tokens of the head prefill computed so far (chunked)
        self._head_cached = 0
        self._busy = False
        self._seg: tuple[float, float, int] | None = None  # decode run: start, step, steps
        self._version = 0

    # -- inputs ---------------------------------------------------------------------------
    def join(self, rec: SimRecord) -> None:
        """A request whose first token exists joins the batch at the next step boundary."""
        rec.remaining = rec.req.output_tokens - 1
        rec.instance = rec.instance or self.state.name
        if not self.booked:
            self.state.batch += 1
            self.state.context_tokens += rec.req.input_tokens + rec.req.output_tokens
        if rec.remaining <= 0:
            self._finish(rec, rec.last)
            return
        self.joining.append(rec)
        self._replan()

    def enqueue(self, rec: SimRecord) -> None:
        """Colocated: a request to prefill here, after those already waiting."""
        rec.instance = self.state.name
        self.waiting.append(rec)
        self._replan()

    # -- the step loop --------------------------------------------------------------------
    def _replan(self) -> None:
        now = self.loop.now
        if not self._busy:
            self._next()
        elif self._seg is not None:  # cut the decode run at the next step boundary
            t0, step, steps = self._seg
            done = min(steps, max(0, math.ceil((now - t0) / step - 1e-9)))
            if done < steps:
                self._apply(t0, step, done)
                self._version += 1
                self.loop.at(t0 + done * step, self._next_from, self._version)

    def _next_from(self, version: int) -> None:
        if version == self._version:
            self._next()

    def _end_run(self, version: int, t0: float, step: float, steps: int) -> None:
        if version == self._version:
            self._apply(t0, step, steps)
            self._next()

    def _apply(self, t0: float, step: float, steps: int) -> None:
        self._seg = None
        if steps <= 0:
            return
        end = t0 + steps * step
        for rec in self.batch:
            rec.tokens(t0, step, steps)
        self._ctx += steps * len(self.batch)
        self._retire(end)

    def _retire(self, now: float) -> None:
        keep = []
        for rec in self.batch:
            if rec.remaining <= 0:
                self._ctx -= rec.req.input_tokens + rec.req.output_tokens
                self._finish(rec, now)
            else:
                keep.append(rec)
        self.batch = keep

    def _finish(self, rec: SimRecord, now: float) -> None:
        rec.finished = now
        self.state.batch -= 1
        self.state.context_tokens -= rec.req.input_tokens + rec.req.output_tokens

    def _context(self) -> int:
        return self._ctx

    def _next(self) -> None:
        now = self.loop.now
        self._busy, self._seg = False, None
        if self.joining:
            self.batch.extend(self.joining)
            self._ctx += sum(r.req.input_tokens + r.req.output_tokens - r.remaining
                             for r in self.joining)
            self.joining = []
        if self.waiting:
            self._busy = True
            self._prefill_step(now)
        elif self.batch:
            self._busy = True
            step = self.model.decode_step_time(len(self.batch), self._context())
            steps = min(r.remaining for r in self.batch)
            self._seg = (now, step, steps)
            self._version += 1
            self.loop.at(now + steps * step, self._end_run, self._version, now, step, steps)

    def _prefill_step(self, now: float) -> None:
        head = self.waiting[0]
        n = head.req.input_tokens
        if self._head_done == 0:
            self._head_cached = self._lookup(head)
            self._head_done = self._head_cached
        budget = n - self._head_done
        decode = 0.0
        if self.chunk:
            budget = min(budget, max(1, self.chunk - len(self.batch)))
            decode = self.model.decode_step_time(len(self.batch), self._context())
        t = decode + self.model.prefill_time(self._head_done + budget, self._head_done)
        self._version += 1
        self.loop.at(now + t, self._end_prefill_step, self._version, now, t, budget)

    def _end_prefill_step(self, version: int, t0: float, t: float, tokens: int) -> None:
        if version != self._version:
            return
        now = self.loop.now
        if self.chunk and self.batch:
            self._apply(t0, t, 1)
        self._head_done += tokens
        head = self.waiting[0]
        if self._head_done >= head.req.input_tokens:
            self.waiting.popleft()
            self._head_done = 0
            head.first_token = head.last = now
            if self.index is not None:
                self.index.store(self.state.name, head.req.hash_ids)
            self.state.queued -= 1
            if self.on_first_token is not None:
                self.on_first_token(head)
            self.join(head)
        self._next()

    def _lookup(self, rec: SimRecord) -> int:
        if self.index is None:
            return 0
        blocks = self.index.prefix_len(self.state.name, rec.req.hash_ids)
        self.index.touch(self.state.name, rec.req.hash_ids[:blocks])
        rec.hit_tokens = min(blocks * self.model.block_tokens, rec.req.input_tokens)
        return rec.hit_tokens
