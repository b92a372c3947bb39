"""The live conductor: one OpenAI request -> tokens -> block keys -> a scheduled (prefill,
decode) pair -> prefill over HTTP -> tokens streamed back from the decode worker.

Scheduling runs the same `Scheduler` as the simulator, against a `Cluster` that `Instances`
keeps current. A prefill that fails is placed again (up to `retries` times); the worker is
marked dead only when it no longer answers /health (a busy worker is not a dead one). No
admissible pair answers 429 with Retry-After, and a request no decode instance could ever hold
answers 400 (context_length_exceeded). A decode worker that fails mid-answer (connection lost,
silent for `timeout` seconds between two tokens, or an error event) hands the answer to another
one (`migration`), up to `max_migrations` times; beyond, 503 (or an error event in a stream),
never a truncated answer passed off as finished. Decode answers are always read as streams, so
a long answer never runs into a timeout.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from mooncake_cli.api import openai as oa
from mooncake_cli.api import roles
from mooncake_cli.api.errors import ErrorCode, ServingError, peer_code
from mooncake_cli.api.schema import validate
from mooncake_cli.conductor import answers
from mooncake_cli.conductor.bookings import Bookings
from mooncake_cli.conductor.decoding import Decoding, Placed
from mooncake_cli.conductor.instances import Instances
from mooncake_cli.conductor.live_metrics import ConductorMetrics
from mooncake_cli.conductor.pipelines import Pipelines
from mooncake_cli.conductor.prefetch import Prefetches
from mooncake_cli.conductor.served import ServedModel
from mooncake_cli.conductor.waitqueue import Ticket, WaitQueue
from mooncake_cli.http.auth import Signer
from mooncake_cli.http.jsonhttp import AsyncPeer
from mooncake_cli.kvkeys import block_keys
from mooncake_cli.scheduler.scheduler import Decision, Scheduler
from mooncake_cli.scheduler.state import Request

log = logging.getLogger(__name__)
FREE_REPLACES = 8  # places again after a dead instance that do not count against `retries`


class Conductor:
    """The request flow; `complete` runs on the HTTP event loop, talking to the workers through
    one pooled async client (`peer`, made in that loop)."""

    def __init__(self, model: ServedModel, scheduler: Scheduler, instances: Instances,
                 metrics: ConductorMetrics, retries: int = 2, timeout: float = 300.0,
                 explain_path: str = "", auth: Signer | None = None,
                 queue_limit: int = 4096, max_migrations: int = 3,
                 prefetch: bool = True) -> None:
        self.model = model
        self.auth = auth  # signs every request to the workers with the cluster secret
        self.scheduler = scheduler
        self.instances = instances
        self.metrics = metrics
        self.retries = retries
        self.timeout = timeout  # seconds a worker may stay silent within a request
        self.bookings = Bookings(scheduler, instances, metrics, explain_path)
        self.queue = WaitQueue(queue_limit, scheduler.slo.ttft_s, scheduler.decode_retry,
                               metrics.add, lambda d: scheduler.estimated_ttft(d.placement),
                               scheduler.decode_wait)
        metrics.queue_length = lambda: len(self.queue)
        self.prefetches = Prefetches(metrics, instances.url, self._post, prefetch)
        self.bookings.prefetch = prefetch
        self._peers: dict[asyncio.AbstractEventLoop, AsyncPeer] = {}
        self.decoding = Decoding(self, max_migrations, model.eos_token_ids)
        self.pipelines = Pipelines(instances, metrics, self.decoding.alive)

    @property
    def peer(self) -> AsyncPeer:
        """The pooled client of the running event loop (a client is bound to its loop)."""
        loop = asyncio.get_running_loop()
        peer = self._peers.get(loop)
        if peer is None:
            peer = self._peers[loop] = AsyncPeer(self.auth)
        return peer

    async def _post(self, url: str, body: bytes) -> Any:
        return await self.peer.call(url, body, timeout_s=10.0)

    # -- request path ---------------------------------------------------------------------
    def tokens(self, req: oa.Completion) -> list[int]:
        if req.token_ids is not None:
            vocab = self.model.vocab_size
            if vocab is not None and any(t >= vocab for t in req.token_ids):
                raise ServingError(ErrorCode.INVALID_REQUEST, f"token ids must be below the "
                                   f"vocabulary size {vocab}", "prompt")
            return list(req.token_ids)
        ids = self.model.chat_tokens(req.messages) if req.chat else \
            list(self.model.tokenizer.encode(req.prompt or ""))
        if not ids:
            raise ServingError(ErrorCode.INVALID_REQUEST, "the prompt is empty", "prompt")
        return ids

    async def complete(self, req: oa.Completion, ticket: Ticket | None = None
                       ) -> dict[str, Any] | AsyncIterator[dict[str, Any] | str]:
        """The answer object, or (stream=true) an iterator of SSE events ending in [DONE];
        `ticket` records the request's passage through the wait queue."""
        if req.model != self.model.name:
            raise ServingError(ErrorCode.MODEL_NOT_FOUND, f"the model '{req.model}' does not "
                               f"exist; this conductor serves '{self.model.name}'", "model")
        ids = self.tokens(req)
        with self.instances.lock:
            room = self.scheduler.decode_capacity()
        req = oa.fit_output(req, len(ids), min(self.model.max_context, room or math.inf))
        if len(ids) + req.sampling.max_tokens > self.model.max_context:
            raise ServingError(ErrorCode.CONTEXT_LENGTH_EXCEEDED, f"this model's maximum "
                               f"context length is {self.model.max_context} tokens; the prompt "
                               f"has {len(ids)} and max_tokens asks for "
                               f"{req.sampling.max_tokens}", "messages" if req.chat else "prompt")
        start = time.monotonic()
        rid = ("chatcmpl-" if req.chat else "cmpl-") + uuid.uuid4().hex
        self.metrics.add("requests_total")
        ticket = ticket or Ticket(start)
        try:
            placed = await self.place(rid, ids, req, ticket)
        finally:
            if ticket.waited_s:
                self.metrics.add("queued_total")
                self.metrics.queue_wait.observe(ticket.waited_s)
        tokens = self.decoding.answer(placed, rid, ids, req, ticket)
        cached = placed.answer.cached_tokens
        if req.stream:
            return answers.sse(req, rid, tokens, start, self.metrics, len(ids), cached)
        return await answers.collect(req, rid, tokens, start, self.metrics, len(ids), cached)

    async def place(self, rid: str, ids: list[int], req: oa.Completion,
                     ticket: Ticket, migrating: bool = False) -> Placed:
        """Queue for room, prefill, and place again when an instance fails (up to `retries`
        times) or the decode side turns out to be full after all (back to the queue's head:
        the conductor then counts that instance full until it reports or frees room)."""
        keys = block_keys(ids, self.model.ns)
        sreq = Request(rid, len(ids), req.sampling.max_tokens, keys, ids)
        param = "messages" if req.chat else "prompt"
        tried: list[str] = []
        attempt, full = 0, False

        def decide(t: Ticket) -> Decision:
            d = self.bookings.decide(sreq, param, t.explain())
            if d.waiting:
                t.prefetch = self.prefetches.waiting(d.placement.chosen, sreq, t.prefetch)
            return d

        def joined(t: Ticket) -> None:  # behind others: where it would go now
            chosen = self.bookings.peek(sreq) if self.prefetches.enabled else None
            if chosen is not None:
                t.prefetch = self.prefetches.waiting(chosen, sreq, t.prefetch)

        while attempt <= self.retries:
            try:
                decision = await self.queue.admit(decide, ticket, front=full, joined=joined,
                                                  booking=self.scheduler.decode_booking(sreq))
            except BaseException:
                self.prefetches.left(rid)
                raise
            self.prefetches.placed(rid, decision.prefill)
            full = False
            if not await self.bookings.confirm(decision, sreq):  # --peers: a peer booked first
                ticket.requeued += 1
                full = True
                continue
            try:  # whatever happens, the booking does not outlive this attempt
                ans, purl, durl = await self._prefill(decision, rid, ids, req, tried,
                                                      anywhere=migrating)
            except BaseException:
                self.bookings.unbook(decision, sreq)
                raise
            self.bookings.unbook(decision, sreq, prefill_only=ans is not None and
                                 ans.status == 200)
            if ans is None:  # an instance failed or left: place the request again
                attempt += self._counts(tried)
                continue
            pname, dname = decision.prefill, decision.decode or ""
            if ans.status != 200:
                msg, code = peer_code(ans.body)
                if code is ErrorCode.DECODE_FULL:  # no room there after all: wait at the head
                    ticket.requeued += 1
                    self.bookings.saw_full(dname)
                    full = True
                    continue
                if code is ErrorCode.DECODE_UNREACHABLE:  # the decode worker died: again
                    await self.decoding.alive(dname, durl, msg)
                    self.metrics.add("rerouted_total")
                    tried.append(dname)
                    attempt += self._counts(tried)
                    continue
                attempt += 1
                raise self._prefill_refused(pname, dname, msg, code, ans.status, param)
            try:
                answer = validate(roles.PrefillAnswer, ans.body)
                self.bookings.learn(pname, keys, answer, decision, self.model.ns.block_bytes)
            except ServingError as e:  # a malformed answer
                self.bookings.release_decode(decision.decode, sreq)
                raise ServingError(ErrorCode.UPSTREAM_MALFORMED, f"prefill on {pname} "
                                   f"answered a malformed body: {e}") from None
            await self.pipelines.done(decision.request, decision.placement.chosen,
                                      answer.pipeline)
            return Placed(decision, purl, durl, answer)
        raise ServingError(ErrorCode.UPSTREAM_FAILED, f"no instance could take the request "
                           f"(tried {', '.join(tried)})")

    def _counts(self, tried: list[str]) -> int:
        """1 when the last failure uses one of the request's `retries`: an instance found dead
        (or gone) is out of the cluster now, so placing again without it is progress; only
        the first few such places are free, so that instances that die and come back cannot
        keep a request forever."""
        name = tried[-1] if tried else ""
        inst = self.instances.get(name) if name else None
        free = (inst is None or bool(inst.dead_reason)) and len(tried) <= FREE_REPLACES
        return 0 if free else 1

    def _prefill_refused(self, pname: str, dname: str, msg: str, code: ErrorCode | None,
                         status: int, param: str) -> ServingError:
        """What the client is told when the prefill instance refused or failed the request."""
        if code is ErrorCode.DECODE_TOO_LARGE:  # it can never fit there
            return ServingError(ErrorCode.CONTEXT_LENGTH_EXCEEDED, f"the request does not "
                                f"fit decode instance {dname}: {msg}", param)
        if code is ErrorCode.DECODE_FULL:  # no KV room left on the decode side: come back
            self.metrics.add("rejected_total")
            retry = max(1, math.ceil(self.scheduler.decode_retry()))
            return ServingError(ErrorCode.DECODE_FULL, f"decode instance {dname} has no KV "
                                f"room: {msg}", retry_after=retry)
        if code is not None and status < 500:  # the request itself was refused
            return ServingError(code, f"prefill on {pname} refused the request: {msg}")
        return ServingError(ErrorCode.UPSTREAM_FAILED, f"prefill on {pname} failed: {msg}")

    async def _prefill(self, decision: Decision, rid: str, ids: list[int], req: oa.Completion,
                       tried: list[str], anywhere: bool = False) -> tuple[Any, str, str]:
        """Run the prefill of `decision`: its answer, or None when the prefill instance failed
        (marked dead unless it still answers /health) or either instance left the registry
        meanwhile. `anywhere`: reuse blocks from any segment of the store."""
        pname, dname = decision.prefill, decision.decode
        if dname is None:
            raise ServingError(ErrorCode.NO_INSTANCE, "no live decode instance")
        try:
            purl = self.instances.url(pname)
        except KeyError:
            tried.append(pname)
            return None, "", ""
        try:
            durl = self.instances.url(dname)
        except KeyError:
            tried.append(dname)
            return None, purl, ""
        chosen = decision.placement.chosen
        body = roles.PrefillRequest(
            request_id=rid, token_ids=ids, decode=durl, sampling=req.sampling,
            # reuse only what the instance holds, unless the policy chose to fetch
            reuse="any" if anywhere or chosen.remote_blocks else "local",
            pipeline=self.pipelines.request(chosen), prefetch=self.prefetches.enabled)
        try:
            ans = await self.peer.call(purl + "/v1/prefill", body.model_dump_json().encode(),
                                       timeout_s=self.timeout)
            return ans, purl, durl
        except (OSError, ValueError) as e:
            await self.decoding.alive(pname, purl, f"prefill request failed: {e}")
            self.metrics.add("rerouted_total")
            tried.append(pname)
            return None, purl, durl

    async def close_peer(self) -> None:
        """Close the running loop's pooled client."""
        await self.prefetches.close()
        peer = self._peers.pop(asyncio.get_running_loop(), None)
        if peer is not None:
            await peer.close()

    def close(self) -> None:
        self.bookings.close()
