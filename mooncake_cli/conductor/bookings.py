"""Bookings: the live conductor's side of the scheduler — decide (admit or 429) and book a
request on its instances, release the booking when its prefill or decode ends, and learn from
each prefill answer (cache index, metrics, the online cost model). Every call holds the
instance registry's lock, so decisions see one consistent cluster.
"""

from __future__ import annotations

import json
import math
import threading
import time
from typing import TYPE_CHECKING, Any

from mooncake_cli.api.errors import ErrorCode, ServingError
from mooncake_cli.api.roles import PrefillAnswer
from mooncake_cli.conductor.event_routing import EventRouting
from mooncake_cli.conductor.instances import Instances
from mooncake_cli.conductor.live_metrics import ConductorMetrics
from mooncake_cli.interfaces import ConfigError
from mooncake_cli.scheduler.estimate import Candidate
from mooncake_cli.scheduler.online_cost import OnlineCostModel
from mooncake_cli.scheduler.scheduler import Decision, Scheduler
from mooncake_cli.scheduler.state import Request

if TYPE_CHECKING:
    from mooncake_cli.conductor.peers import Peers


class Bookings:
    def __init__(self, scheduler: Scheduler, instances: Instances, metrics: ConductorMetrics,
                 explain_path: str = "") -> None:
        self.scheduler = scheduler
        self.instances = instances
        self.metrics = metrics
        self._explain = open(explain_path, "a", encoding="utf-8") if explain_path else None
        self._explain_lock = threading.Lock()
        self._queued: dict[str, dict[str, float]] = {}  # prefill instance -> rid -> estimate
        self._decode_booked: dict[str, int] = {}  # rid -> KV tokens booked on its decode
        self.peers: Peers | None = None  # with --peers: bookings and learning are shared
        self.events: EventRouting | None = None  # workers whose KV events say what they hold
        self.prefetch = False  # prefill instances pull a waiting request's prefix

    def decide(self, sreq: Request, param: str = "prompt",
               queue: dict[str, Any] | None = None) -> Decision:
        """Admit and book `sreq`; or a `waiting` decision, not booked (no room for it now); or
        raise 429 (SLO), 400 (no decode instance could ever hold it; `param` names the prompt)
        or 503 (no live prefill instance)."""
        if self.peers is not None and not self.peers.ready:
            raise ServingError(ErrorCode.NO_INSTANCE, "this conductor is still catching up "
                               "with the other conductors' bookings", retry_after=1)
        with self.instances.lock:
            held = {} if self.events is None else \
                self.events.sync(self.scheduler.cluster.index, sreq.tokens, sreq.block_keys)
            now = time.monotonic()
            try:
                decision = self.scheduler.schedule(sreq, now,
                                                   explain=self._explain is not None)
            except ConfigError as e:  # no live prefill instance
                self.metrics.add("errors_total")
                raise ServingError(ErrorCode.NO_INSTANCE, str(e), retry_after=1) from None
            if not decision.waiting:  # a waiting request is logged once, when it is placed
                self._log(decision, queue, held)
            if decision.too_large:
                raise ServingError(ErrorCode.CONTEXT_LENGTH_EXCEEDED, f"the request does not "
                                   f"fit this cluster: {decision.reason}; shorten the prompt "
                                   "or max_tokens", param)
            if decision.waiting:  # not booked: the caller queues it
                return decision
            if not decision.admitted:
                self.metrics.add("rejected_total")
                retry = decision.retry_after_s or 1.0
                raise ServingError(ErrorCode.SLO, f"cannot meet the SLO: {decision.reason}",
                                   retry_after=max(1, math.ceil(retry)))
            self.scheduler.commit(decision, sreq, now)
            if decision.decode is not None:
                self._decode_booked[sreq.id] = self.scheduler.decode_booking(sreq)
                if self.peers is not None:
                    self.peers.booked(sreq.id, decision.decode, self._decode_booked[sreq.id])
            chosen = decision.placement.chosen
            for name in (chosen.instance, *chosen.stages):
                self._queued.setdefault(name, {})[sreq.id] = chosen.prefill_s
            return decision

    def peek(self, sreq: Request) -> Candidate | None:
        """Where `sreq` would go now, nothing booked or logged (None: nowhere live)."""
        with self.instances.lock:
            if self.events is not None:
                self.events.sync(self.scheduler.cluster.index, sreq.tokens, sreq.block_keys)
            try:
                decision = self.scheduler.schedule(sreq, time.monotonic())
            except ConfigError:
                return None
            return None if decision.too_large else decision.placement.chosen

    def unbook(self, decision: Decision, sreq: Request, prefill_only: bool = False) -> None:
        """The prefill part of a booking is over (done or failed); unless `prefill_only`, the
        decode part too."""
        with self.instances.lock:
            now = time.monotonic()
            for name in (decision.prefill, *decision.placement.chosen.stages):
                self._queued.get(name, {}).pop(sreq.id, None)
                inst = self.scheduler.cluster.by_name.get(name)
                if inst is not None:
                    inst.queued = max(0, inst.queued - 1)
                    inst.busy_until = now + sum(self._queued.get(name, {}).values())
            if not prefill_only:
                self.release_decode(decision.decode, sreq)

    async def confirm(self, decision: Decision, sreq: Request) -> bool:
        """With --peers: whether `decision`'s decode booking holds in etcd's order of every
        conductor's bookings (`mooncake_cli.conductor.peer_order`); when it does not, the
        booking is undone (the caller queues the request again). True without peers."""
        if self.peers is None or decision.decode is None:
            return True
        try:
            held = await self.peers.holds(sreq.id)
        except BaseException:
            self.unbook(decision, sreq)
            raise
        if not held:
            self.unbook(decision, sreq)
        return held

    def release_decode(self, name: str | None, sreq: Request) -> None:
        with self.instances.lock:
            booked = self._decode_booked.pop(sreq.id, None)
            if self.peers is not None and booked is not None:
                self.peers.released(sreq.id)
            if name and booked is not None:
                self.scheduler.release(name, booked)

    def saw_full(self, name: str) -> None:
        """Decode instance `name` refused a reservation for lack of room: count it full until
        its next load report (or a booking released there) says otherwise."""
        with self.instances.lock:
            dec = self.scheduler.cluster.by_name.get(name)
            if dec is not None and dec.kv_capacity_tokens is not None:
                dec.context_tokens = max(dec.context_tokens, dec.kv_capacity_tokens)

    def learn(self, pname: str, keys: list[str], answer: PrefillAnswer,
              decision: Decision, block_bytes: int = 0) -> None:
        prompt, cached = answer.prompt_tokens, answer.cached_tokens
        self.metrics.add("prompt_tokens_total", prompt)
        self.metrics.add("prefetched_blocks_total", answer.prefetched)
        self.metrics.add("prefix_hit_tokens_total", cached)
        fetched = decision.placement.chosen.fetch_blocks
        if fetched:
            self.metrics.add("blocks_fetched_total", fetched)
            self.metrics.moved("fetch", fetched * block_bytes)
        source = decision.placement.chosen.fetch_from
        if source and answer.fetched:  # the link's measured speed (conductor/links.py)
            with self.instances.lock:
                self.scheduler.cluster.links.observe(
                    source, pname, sum(f.bytes for f in answer.fetched),
                    sum(f.seconds for f in answer.fetched))
        if decision.decode is not None:  # the prompt's KV goes from prefill to decode
            self.metrics.moved("stream", -(-prompt // max(1, self.instances.block_size))
                               * block_bytes)
        copied = answer.replicated_keys  # fetched blocks that gained a replica there
        self.metrics.add("blocks_replicated_total", len(copied))
        stored = answer.stored_keys + copied
        if self.events is not None and self.events.follows(pname):
            stored = []  # its KV events say what it holds (conductor/event_routing.py)
        with self.instances.lock:  # what the instance holds now: what it had, what it stored
            index = self.scheduler.cluster.index
            index.touch(pname, keys[:decision.placement.chosen.local_blocks])
            evicted = index.store(pname, stored)
        if self.peers is not None:  # one record for the other conductors' indexes
            self.peers.learned(pname, keys[:decision.placement.chosen.local_blocks],
                               stored, evicted)
        if evicted:
            self.metrics.add("evicted_blocks_total", len(evicted))
        model = self.scheduler.cluster.model
        if isinstance(model, OnlineCostModel):
            t, piped = answer.timing, answer.pipeline
            if piped is not None and piped.stages and piped.layers:
                # the lead's share of the layers stands for one instance's in proportion
                layers = piped.layers[-1][1] - piped.layers[0][0]
                share = piped.layers[0][1] - piped.layers[0][0]
                model.observe_handoff(prompt - cached, piped.handoff)
                model.observe_prefill(prompt, cached, piped.compute * layers / max(1, share))
            else:
                model.observe_prefill(prompt, cached, t.compute, max(t.total - t.queue, 0.0))

    def _log(self, decision: Decision, queue: dict[str, Any] | None = None,
             held: dict[str, int] | None = None) -> None:
        if self._explain is not None:
            record = decision.explain()
            if queue is not None:
                record["queue"] = queue
            prefetch = self._prefetch(decision, queue)
            if prefetch is not None:
                record["prefetch"] = prefetch
            if held:  # per worker followed: the leading blocks its KV events say it holds
                record["kv_events"] = held
            with self._explain_lock:
                self._explain.write(json.dumps(record) + "\n")
                self._explain.flush()

    def _prefetch(self, decision: Decision, queue: dict[str, Any] | None
                  ) -> dict[str, Any] | None:
        """The prefetch of `decision`'s prefix: ordered while it waited in the queue, or done
        by its instance while it waits there behind others (conductor/prefetch.py)."""
        if queue is not None and "prefetch" in queue:
            return dict(queue.pop("prefetch"))
        chosen = decision.placement.chosen
        if self.prefetch and chosen.queue_s > 0 and chosen.remote_blocks:
            return {"instance": chosen.instance, "blocks": chosen.remote_blocks,
                    "reason": "busy"}
        return None

    def close(self) -> None:
        if self._explain is not None:
            self._explain.close()
