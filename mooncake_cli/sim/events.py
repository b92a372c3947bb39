"""The discrete-event core of the simulator: a clock with a heap of timed callbacks, and the
per-request record every simulated instance fills in."""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mooncake_cli.sim.trace import TraceRequest


class EventLoop:
    """Timed callbacks run in (time, insertion) order; deterministic."""

    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[..., None], tuple[Any, ...]]] = []
        self._seq = 0

    def at(self, when: float, fn: Callable[..., None], *args: Any) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (max(when, self.now), self._seq, fn, args))

    def next_time(self) -> float:
        return self._heap[0][0] if self._heap else math.inf

    def run_until(self, t: float) -> None:
        """Run every callback due at or before `t`."""
        while self._heap and self._heap[0][0] <= t:
            when, _, fn, args = heapq.heappop(self._heap)
            self.now = when
            fn(*args)
        self.now = max(self.now, t)


@dataclass(eq=False, slots=True)
class SimRecord:
    """One request's life in the simulator."""

    req: TraceRequest
    arrival: float
    rejected: bool = False
    retry_after: float | None = None
    first_token: float | None = None  # end of its prefill
    hit_tokens: int = 0  # input tokens reused (local or fetched)
    fetched_tokens: int = 0
    instance: str = ""
    remaining: int = 0  # decode tokens still to generate
    last: float = 0.0  # time of its latest token
    finished: float | None = None
    top: list[float] = field(default_factory=list)  # min-heap: its longest 10% token gaps
    longest: float = 0.0  # its longest token gap
    want: int = 0  # how many gaps are its longest 10% (set on the first token)

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.arrival

    def tokens(self, t0: float, step: float, steps: int) -> None:
        """`steps` decode steps of `step` seconds starting at `t0` each gave one token."""
        self._gap(t0 + step - self.last, 1)
        if steps > 1:
            self._gap(step, steps - 1)
        self.last = t0 + steps * step
        self.remaining -= steps

    def _gap(self, gap: float, count: int) -> None:
        top = self.top
        want = self.want or max(1, math.ceil(0.1 * (self.req.output_tokens - 1)))
        self.want = want
        if len(top) >= want and gap <= top[0]:
            return  # shorter than every gap kept
        if gap > self.longest:
            self.longest = gap
        for _ in range(min(count, want)):
            if len(top) < want:
                heapq.heappush(top, gap)
            elif gap > top[0]:
                heapq.heapreplace(top, gap)
            else:
                break

    def tbt(self) -> float | None:
        """Mean of the longest 10% of its token gaps (0 for a single token; None if it
        never finished)."""
        if self.first_token is None or self.remaining > 0:
            return None
        if self.req.output_tokens <= 1 or not self.top:
            return 0.0
        return sum(self.top) / len(self.top)
