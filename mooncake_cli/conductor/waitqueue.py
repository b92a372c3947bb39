"""WaitQueue: a request the cluster has no room for now waits, first come first served, instead
of getting 429 — the head tries again whenever room may have appeared (a decode booking ended)
and at least every `POLL_S`, for as long as its client waits; the others sleep until they are
the head (polling all of them cost 2,000 waiters 40,000 timer wake-ups a second). A bounded
length (503 with Retry-After beyond it), a client that leaves gives its place up, and with a
TTFT SLO a request whose predicted TTFT (the queue wait plus its prefill) breaks it is refused
at once, with the predicted wait as Retry-After.

The predicted wait of the k-th in line is (k + 1) x the time per admission: the larger of the
measured one (1 / the rate at which waiting requests were recently admitted) and the
scheduler's estimate of the time until the next slot frees (the `retry_after_s` of its latest
waiting decision: a prefill's time when prefill queues are full, the time between decode
completions when decode KV is) — erring long, so admitted requests keep the SLO.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from starlette.requests import Request

from mooncake_cli.api.errors import ErrorCode, ServingError
from mooncake_cli.scheduler.scheduler import Decision

T = TypeVar("T")
POLL_S = 0.05
RATE_WINDOW = 16  # admissions of waiting requests the rate is measured over


@dataclass
class Ticket:
    """One request's passage: what was predicted at arrival and what happened."""

    arrived: float = field(default_factory=time.monotonic)
    position: int = 0
    predicted_wait_s: float = 0.0
    predicted_ttft_s: float | None = None
    waited_s: float = 0.0
    requeued: int = 0
    placed_ttft_s: float | None = None  # the estimate from placement on (no queue wait)
    migrations: list[dict[str, Any]] = field(default_factory=list)  # moves of its answer
    migration: dict[str, Any] | None = None  # the move this placement is for, if one
    prefetch: dict[str, Any] | None = None  # the prefetch ordered while it waited, if one

    def headers(self) -> dict[str, str]:
        """What the answer tells the client about its wait and moves (for benchmarks and
        dashboards; a stream's headers leave before any move)."""
        out = {"X-Mooncake-Queue-Wait": f"{self.waited_s:.3f}"}
        if self.predicted_ttft_s is not None:
            out["X-Mooncake-Predicted-TTFT"] = f"{self.predicted_ttft_s:.3f}"
        if self.migrations:
            out["X-Mooncake-Migrations"] = str(len(self.migrations))
        return out

    def explain(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "position": self.position, "predicted_wait_s": round(self.predicted_wait_s, 3),
            "waited_s": round(time.monotonic() - self.arrived, 3), "requeued": self.requeued}
        if self.migration is not None:
            out["migration"] = dict(self.migration)
        if self.prefetch is not None:
            out["prefetch"] = dict(self.prefetch)
        return out


class _Waiter:
    def __init__(self, ticket: Ticket) -> None:
        self.ticket = ticket
        self.wake = asyncio.Event()


class WaitQueue:
    """FIFO admission in front of `Bookings.decide` (run on the conductor's event loop)."""

    def __init__(self, limit: int, ttft_slo: float | None,
                 completion_gap: Callable[[], float],
                 count: Callable[[str], None] = lambda _: None,
                 estimate: Callable[[Decision], float] = lambda d: d.placement.chosen.ttft_s,
                 decode_wait: Callable[[int, int], float] = lambda ahead, booking: 0.0
                 ) -> None:
        self._decode_wait = decode_wait  # (requests ahead, KV tokens booked) -> seconds
        self.limit = limit
        self._count = count  # a refusal: "rejected_total" (SLO) or "queue_full_total"
        self.ttft_slo = ttft_slo
        self._gap = completion_gap
        self._line: deque[_Waiter] = deque()
        self._admitted: deque[float] = deque(maxlen=RATE_WINDOW)
        self._last_prefill_s = 0.0
        self._gap_hint: float | None = None
        self._estimate = estimate  # a decision's TTFT from placement on

    def __len__(self) -> int:
        return len(self._line)

    def rate(self) -> float | None:
        """Waiting requests admitted per second lately; None without a recent measure."""
        t = self._admitted
        now = time.monotonic()
        if len(t) < 8 or now - t[-1] > 30.0 or now <= t[0]:
            return None
        return (len(t) - 1) / (now - t[0])  # to now: a stall lowers the rate as it lasts

    def predicted_wait(self, position: int) -> float:
        rate = self.rate()
        gap = self._gap_hint if self._gap_hint is not None else self._gap()
        return (position + 1) * max(1 / rate if rate else 0.0, gap)

    def snapshot(self) -> dict[str, Any]:
        now = time.monotonic()
        oldest = now - self._line[0].ticket.arrived if self._line else 0.0
        rate = self.rate()
        return {"length": len(self._line), "limit": self.limit,
                "oldest_wait_s": round(oldest, 3),
                "admit_rate_per_s": round(rate, 3) if rate else None,
                "predicted_wait_s": round(self.predicted_wait(len(self._line)), 3)}

    def notify(self) -> None:
        """Room may have appeared: the head tries again now."""
        if self._line:
            self._line[0].wake.set()

    async def admit(self, decide: Callable[[Ticket], Decision], ticket: Ticket,
                    front: bool = False, booking: int = 0,
                    joined: Callable[[Ticket], None] = lambda t: None) -> Decision:
        """A booked decision for `ticket`'s request, once its turn comes and room exists;
        `front` puts it back at the head (its placement failed for lack of room after all).
        `joined` is called when it joins the line behind others (the head's `decide` runs
        at once instead)."""
        if not self._line:
            decision = decide(ticket)
            self._seen(decision)
            if not decision.waiting:
                if ticket.predicted_ttft_s is None:
                    ticket.predicted_ttft_s = self._last_prefill_s
                ticket.placed_ttft_s = self._last_prefill_s
                return decision
        self._check_room(ticket, front, booking)
        me = _Waiter(ticket)
        if front:
            self._line.appendleft(me)
        else:
            self._line.append(me)
        if self._line[0] is not me:
            joined(ticket)
        try:
            while True:
                if self._line[0] is me:
                    decision = decide(ticket)
                    self._seen(decision)
                    if not decision.waiting:
                        self._admitted.append(time.monotonic())
                        ticket.placed_ttft_s = self._last_prefill_s
                        return decision
                me.wake.clear()
                if self._line[0] is not me:  # woken when it becomes the head (notify)
                    await me.wake.wait()
                    continue
                try:
                    await asyncio.wait_for(me.wake.wait(), POLL_S)
                except TimeoutError:
                    pass
        finally:
            ticket.waited_s = time.monotonic() - ticket.arrived
            self._line.remove(me)
            self.notify()  # the next in line may fit too

    def _seen(self, decision: Decision) -> None:
        self._last_prefill_s = self._estimate(decision)
        if decision.waiting and decision.retry_after_s is not None:
            self._gap_hint = decision.retry_after_s

    def _check_room(self, ticket: Ticket, front: bool, booking: int) -> None:
        """503 when the queue is full; 429 when the predicted TTFT breaks the SLO."""
        position = 0 if front else len(self._line)
        wait = max(self.predicted_wait(position), self._decode_wait(position, booking))
        if ticket.requeued == 0:
            ticket.position, ticket.predicted_wait_s = position, wait
            ticket.predicted_ttft_s = wait + self._last_prefill_s
        retry = max(1, math.ceil(wait))
        if not front and len(self._line) >= self.limit:
            self._count("queue_full_total")
            raise ServingError(ErrorCode.QUEUE_FULL, f"the conductor's wait queue is full "
                               f"({self.limit} requests; predicted wait {wait:.1f} s)",
                               retry_after=retry)
        slo = self.ttft_slo
        if slo is not None and not front and wait + self._last_prefill_s > slo:
            self._count("rejected_total")
            raise ServingError(ErrorCode.SLO, f"cannot meet the SLO: predicted TTFT "
                               f"{wait + self._last_prefill_s:.3f} s (a {wait:.3f} s wait at "
                               f"position {position + 1} in the queue + "
                               f"{self._last_prefill_s:.3f} s prefill) > SLO {slo:g} s",
                               retry_after=retry)


async def unless_gone(request: Request, work: Awaitable[T]) -> T | None:
    """`work`'s result, or None (`work` cancelled) when the client disconnects first — so a
    request waiting in the queue for a client that left gives its place up. `work` runs in
    the caller's task; one watcher task cancels it when the client goes."""
    me = asyncio.current_task()
    left = False

    async def gone() -> None:
        nonlocal left
        while (await request.receive())["type"] != "http.disconnect":
            pass
        left = True
        if me is not None:
            me.cancel()

    watch = asyncio.ensure_future(gone())
    try:
        return await work
    except asyncio.CancelledError:
        if not left:
            raise
        return None
    finally:
        watch.cancel()
        if left and me is not None and hasattr(me, "uncancel"):
            me.uncancel()  # the cancel was ours, and is spent
