"""The wait queue's line, on a real WaitQueue in an event loop: first come first served, and
only the head polls for room (the rest sleep until they are the head)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from mooncake_cli.conductor import waitqueue
from mooncake_cli.conductor.waitqueue import Ticket, WaitQueue
from mooncake_cli.scheduler.estimate import Candidate, Placement
from mooncake_cli.scheduler.scheduler import Decision
from tests.conftest import async_wait_for

pytestmark = pytest.mark.timeout(30)


def decision(waiting: bool) -> Decision:
    chosen = Candidate("p0", 0.0, 0, 0, None, 0.0, 0.01, 0.01)
    return Decision("r", 0.0, Placement("test", chosen), "d0", None, not waiting,
                    retry_after_s=0.01 if waiting else None, waiting=waiting)


def test_only_the_head_polls_and_the_line_is_served_in_order(
        monkeypatch: pytest.MonkeyPatch) -> None:
    timed: list[Any] = []
    real_wait_for = asyncio.wait_for

    async def counted(aw: Any, timeout: float) -> Any:
        timed.append(timeout)
        return await real_wait_for(aw, timeout)

    monkeypatch.setattr(waitqueue.asyncio, "wait_for", counted)

    async def main() -> list[int]:
        q = WaitQueue(limit=1000, ttft_slo=None, completion_gap=lambda: 0.01)
        room = [False]
        served: list[int] = []

        async def one(i: int) -> None:
            await q.admit(lambda t: decision(not room[0]), Ticket())
            served.append(i)

        first = asyncio.ensure_future(one(0))  # finds no room: the line starts with it
        await async_wait_for(lambda: len(q) == 1, 20, what="the head in line")
        rest = [asyncio.ensure_future(one(i)) for i in range(1, 200)]
        # each of the 199 has taken its place (and, were it polling, timed a wait); the head
        # has polled ten times meanwhile
        await async_wait_for(lambda: len(q) == 200 and len(timed) >= 10, 20,
                             what="200 in line and ten timed waits")
        assert not served
        polls = len(timed)
        room[0] = True
        q.notify()
        await asyncio.gather(first, *rest)
        assert polls <= 30, f"{polls} timed waits for 200 in line: the whole line is polling"
        return served

    assert asyncio.run(main()) == list(range(200))
