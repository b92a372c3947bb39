"""Decoding: the decode side of a request. The answer's events are read from the decode
worker as a stream (the conductor's timeout is between two tokens, never over a whole answer);
a decode worker that fails mid-answer hands the request to another one (`migration`), up to
`max_migrations` times. A failed instance is marked dead only when it no longer answers
/health: a busy worker is not a dead one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Collection
from contextlib import aclosing
from dataclasses import dataclass, replace
from typing import Any, Protocol

from mooncake_cli.api import openai as oa
from mooncake_cli.api import roles
from mooncake_cli.api.errors import ErrorCode, ServingError
from mooncake_cli.conductor.bookings import Bookings
from mooncake_cli.conductor.instances import Instances
from mooncake_cli.conductor.live_metrics import ConductorMetrics
from mooncake_cli.conductor.migration import DecodeLost, Progress
from mooncake_cli.conductor.waitqueue import Ticket, WaitQueue
from mooncake_cli.http.jsonhttp import AsyncPeer, PeerError
from mooncake_cli.scheduler.scheduler import Decision, Scheduler
from mooncake_cli.scheduler.state import Request

log = logging.getLogger(__name__)
HEALTH_TIMEOUT = 2.0  # seconds a failed instance has to answer /health to count as alive


@dataclass
class Placed:
    decision: Decision
    prefill_url: str
    decode_url: str
    answer: roles.PrefillAnswer


class Owner(Protocol):
    """What Decoding uses of the conductor it serves."""

    metrics: ConductorMetrics
    bookings: Bookings
    scheduler: Scheduler
    queue: WaitQueue
    instances: Instances
    timeout: float

    @property
    def peer(self) -> AsyncPeer: ...

    def place(self, rid: str, ids: list[int], req: oa.Completion, ticket: Ticket,
              migrating: bool = False) -> Awaitable[Placed]: ...


class Decoding:
    def __init__(self, conductor: Owner, max_migrations: int, eos: Collection[int]) -> None:
        self.c = conductor
        self.max_migrations = max_migrations
        self.eos = tuple(eos)

    async def answer(self, placed: Placed, rid: str, ids: list[int], req: oa.Completion,
                     ticket: Ticket) -> AsyncIterator[dict[str, Any]]:
        """The answer's events; a decode worker that fails hands the request to another one
        (up to `max_migrations` times: `mooncake_cli.conductor.migration`)."""
        progress = Progress(list(ids), req.sampling, moves=ticket.migrations)
        while True:
            try:
                async with aclosing(self._stream_from(placed, progress, req, ticket)) as events:
                    async for ev in events:
                        yield ev
                return
            except DecodeLost as lost:
                alive = await self.alive(lost.name, lost.url, lost.reason)
                done = progress.complete(progress.stop_ids(self.eos))
                if done is not None:  # only the final event was lost
                    yield {"finish_reason": done, "completion_tokens": len(progress.tokens)}
                    return
                if progress.moved >= self.max_migrations:
                    self.c.metrics.add("errors_total")
                    raise ServingError(ErrorCode.UPSTREAM_FAILED, f"{lost} (moved "
                                       f"{progress.moved} times already, the limit)") from None
                move = progress.record(lost, alive)
                self.c.metrics.add("migrations_total")
                log.warning("request %s: %s; moving it after %d tokens", rid, lost,
                            len(progress.tokens))
                placed = await self._move(rid, progress, req, ticket, move)

    async def _move(self, rid: str, progress: Progress, req: oa.Completion, ticket: Ticket,
                    move: dict[str, Any]) -> Placed:
        """Place the rest of the answer: prefill of the prompt and what was streamed."""
        moved = replace(req, sampling=progress.prefill_sampling())
        ids = progress.next_prompt()
        placed = await self.c.place(f"{rid}.m{progress.moved}", ids, moved,
                                   Ticket(migration=move), migrating=True)
        cached = placed.answer.cached_tokens
        move.update(to=placed.decision.decode, prompt_tokens=len(ids), reused_tokens=cached)
        self.c.metrics.add("migration_reused_tokens_total", cached)
        self.c.metrics.add("migration_recomputed_tokens_total", len(ids) - cached)
        return placed

    async def _stream_from(self, placed: Placed, progress: Progress, req: oa.Completion,
                           ticket: Ticket) -> AsyncGenerator[dict[str, Any], None]:
        """The events of one decode worker; DecodeLost when it fails before the final one."""
        rid = placed.answer.request_id
        body = roles.GenerateRequest(request_id=rid, token_ids=progress.next_prompt(),
                                     sampling=req.sampling, resume=progress.resume(),
                                     first_token=placed.answer.first_token)
        sreq = Request(rid, len(body.token_ids), req.sampling.max_tokens, ())
        dname, durl = placed.decision.decode or "", placed.decode_url
        out = 0
        try:
            async for ev in self.c.peer.events(durl + "/v1/generate",
                                             body.model_dump_json().encode(),
                                             timeout_s=self.c.timeout):
                if ev.get("error") or ev.get("finish_reason") == "error":
                    raise DecodeLost(dname, durl, str(ev.get("error") or "an error event"))
                if out == 0 and "token" in ev:
                    self._first_token(ticket, progress)
                out += "token" in ev
                progress.saw(ev)
                yield ev
        except OSError as e:
            if progress.finished:  # the answer is whole; only its end of stream was lost
                return
            raise DecodeLost(dname, durl, str(e)) from None
        except PeerError as e:
            if e.status >= 500:
                raise DecodeLost(dname, durl, e.message) from None
            self.c.metrics.add("errors_total")
            raise ServingError(ErrorCode.UPSTREAM_FAILED,
                               f"decode worker {dname} failed: {e.message}") from None
        finally:
            self.c.bookings.release_decode(placed.decision.decode, sreq)
            self.c.scheduler.observe_output(out)
            self.c.queue.notify()

    def _first_token(self, ticket: Ticket, progress: Progress) -> None:
        """Learn from the first token of a placement: the TTFT estimate's error, or the
        latency a migration added."""
        if progress.lost_at is not None:
            self.c.metrics.migration_gap.observe(time.monotonic() - progress.lost_at)
            progress.lost_at = None
        elif ticket.placed_ttft_s is not None:
            after = time.monotonic() - ticket.arrived - ticket.waited_s
            self.c.scheduler.observe_ttft(ticket.placed_ttft_s, after)

    async def alive(self, name: str, url: str, why: str) -> bool:
        """Whether instance `name`, which failed a request, still answers /health: a busy or
        stalled worker is not a dead one. A dead one is marked so."""
        try:
            ans = await self.c.peer.call(url + "/health", timeout_s=HEALTH_TIMEOUT)
            if ans.status == 200:
                return True
        except (OSError, ValueError):
            pass
        self.c.instances.mark_dead(name, why)
        return False
