"""Prefetch orders: when a request must wait in the conductor's queue and the prefill instance
it would go to now fetches a longer prefix than it holds, that instance is asked at once to pull
the prefix into its own segment (`POST /v1/prefetch`, worker/prefetch.py), so that the prefill,
when its turn comes, reads it locally. When the request leaves the queue without going there --
its client left, it was refused, or it was placed on another instance -- the order is cancelled
(`POST /v1/prefetch/cancel`).

A request placed on an instance with other requests queued ahead (its `queue_s` > 0) waits on
the instance instead: its prefill request carries `prefetch: true` and the worker pulls while it
waits (reason "busy" in explain). Calls to the workers run as tasks on the conductor's event
loop and never hold up a decision; an instance that answers 404 (an engine without prefetch,
such as a vLLM role) is not asked again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from mooncake_cli.api import roles
from mooncake_cli.conductor.live_metrics import ConductorMetrics
from mooncake_cli.scheduler.estimate import Candidate
from mooncake_cli.scheduler.state import Request

log = logging.getLogger(__name__)
Post = Callable[[str, bytes], Awaitable[Any]]  # (url, body) -> an answer with .status


@dataclass
class Order:
    instance: str
    url: str
    blocks: int

    def explain(self, reason: str) -> dict[str, Any]:
        return {"instance": self.instance, "blocks": self.blocks, "reason": reason}


class Prefetches:
    """The prefetch orders of waiting requests, by request id (run on the event loop)."""

    def __init__(self, metrics: ConductorMetrics, url: Callable[[str], str], post: Post,
                 enabled: bool = True) -> None:
        self.metrics = metrics
        self.enabled = enabled
        self._url = url  # instance name -> its URL (KeyError: gone)
        self._post = post
        self._orders: dict[str, Order] = {}
        self._without: set[str] = set()  # instances that have no prefetch route
        self._tasks: set[asyncio.Task[None]] = set()

    def waiting(self, chosen: Candidate, sreq: Request,
                noted: dict[str, Any] | None = None) -> dict[str, Any] | None:
        """`sreq` waits in the queue and would go to `chosen` now: order its prefetch there
        (once per request). What explain records of its order (`noted`, the record so far,
        when there is none now)."""
        rid = sreq.id
        if rid in self._orders:
            return self._orders[rid].explain("queue")
        blocks = chosen.remote_blocks
        if not self.enabled or not blocks or sreq.tokens is None or \
                chosen.instance in self._without:
            return noted
        try:
            url = self._url(chosen.instance)
        except KeyError:
            return noted
        order = self._orders[rid] = Order(chosen.instance, url, blocks)
        self.metrics.add("prefetch_requests_total")
        body = roles.PrefetchRequest(request_id=rid, token_ids=list(sreq.tokens))
        self._spawn(self._ask(order, "/v1/prefetch", body.model_dump_json().encode()))
        return order.explain("queue")

    def placed(self, rid: str, instance: str) -> None:
        """`rid` left the queue for `instance`: an order elsewhere is cancelled."""
        order = self._orders.pop(rid, None)
        if order is not None and order.instance != instance:
            self._cancel(rid, order)

    def left(self, rid: str) -> None:
        """`rid` left the queue without a placement: its order is cancelled."""
        order = self._orders.pop(rid, None)
        if order is not None:
            self._cancel(rid, order)

    def _cancel(self, rid: str, order: Order) -> None:
        self.metrics.add("prefetch_cancelled_total")
        body = roles.RequestRef(request_id=rid).model_dump_json().encode()
        self._spawn(self._ask(order, "/v1/prefetch/cancel", body))

    def _spawn(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _ask(self, order: Order, path: str, body: bytes) -> None:
        try:
            ans = await self._post(order.url + path, body)
        except (OSError, ValueError) as e:  # the next decision finds out whether it is alive
            log.info("%s on %s failed: %s", path, order.instance, e)
            return
        if ans.status == 404:
            self._without.add(order.instance)
        elif ans.status != 200:
            log.info("%s on %s answered %d", path, order.instance, ans.status)

    async def settled(self) -> None:
        """Once every call to the workers under way has ended."""
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
