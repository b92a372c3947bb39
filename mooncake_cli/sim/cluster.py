"""Simulated clusters driven by the real scheduler: disaggregated (prefill instances running
one prefill at a time in arrival order, plus decode instances) and colocated (each instance
prefills and decodes, as in vLLM). Estimates come from the scheduler; the simulated instances
then run with the cache as it actually is when the work starts."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from mooncake_cli.scheduler.costmodel import CostModel, transfer_time
from mooncake_cli.scheduler.estimate import Candidate
from mooncake_cli.scheduler.links import Links
from mooncake_cli.scheduler.scheduler import Decision, Scheduler, make_policy
from mooncake_cli.scheduler.state import Cluster, InstanceState, Request
from mooncake_cli.sim.batch import BatchInstance
from mooncake_cli.sim.events import EventLoop, SimRecord
from mooncake_cli.sim.settings import SimConfig
from mooncake_cli.sim.trace import TraceRequest

Progress = Callable[[int, int], None]  # (requests scheduled, total)
Explain = Callable[[dict[str, Any]], None]


class PrefillInstance:
    """One prefill at a time, in arrival order; stores every block it computed. A pipelined
    prefill runs on its lead instance, which holds its stage instances for as long."""

    def __init__(self, state: InstanceState, cluster: Cluster, loop: EventLoop,
                 on_done: Callable[[SimRecord], None],
                 peers: dict[str, PrefillInstance], links: Links | None = None) -> None:
        """`links`: each pair's true bandwidth, which fetches take (None: the model's)."""
        self.state, self.cluster, self.loop, self.on_done = state, cluster, loop, on_done
        self.peers, self.links = peers, links
        self.queue: deque[tuple[SimRecord | None, Candidate]] = deque()
        self.waiting_est = 0.0
        self.running = False

    def enqueue(self, rec: SimRecord | None, cand: Candidate) -> None:
        """A prefill to run (or, with `rec` None, a pipeline stage to hold for)."""
        self.queue.append((rec, cand))
        self.waiting_est += cand.transfer_s + cand.prefill_s
        if not self.running:
            self._start()

    def _start(self) -> None:
        rec, cand = self.queue.popleft()
        self.waiting_est -= cand.transfer_s + cand.prefill_s
        if rec is None:
            self._run(cand.transfer_s + cand.prefill_s, None)
            return
        index, model, name = self.cluster.index, self.cluster.model, self.state.name
        keys, n = rec.req.hash_ids, rec.req.input_tokens
        local = index.prefix_len(name, keys)
        index.touch(name, keys[:local])
        blocks, xfer = local, 0.0
        if cand.fetch_from is not None:
            remote = index.prefix_len(cand.fetch_from, keys)
            if remote > local:  # the source may have evicted part of it meanwhile
                index.touch(cand.fetch_from, keys[:remote])
                got = self.cluster.cached_tokens(rec.req.input_tokens, remote)
                rec.fetched_tokens = got - self.cluster.cached_tokens(rec.req.input_tokens, local)
                bw = self.links.get(cand.fetch_from, name) if self.links else None
                xfer, blocks = transfer_time(model, rec.fetched_tokens, bw), remote
        rec.hit_tokens = self.cluster.cached_tokens(rec.req.input_tokens, blocks)
        rec.instance = name
        if cand.stages:  # the lead of a pipeline: start the stages on the same clock
            dur = cand.transfer_s + cand.prefill_s
            for stage in cand.stages:
                self.peers[stage].enqueue(None, cand)
        else:
            dur = xfer + model.prefill_time(n, rec.hit_tokens)
        self._run(dur, rec)

    def _run(self, dur: float, rec: SimRecord | None) -> None:
        now = self.loop.now
        self.running = True
        self.state.busy_until = now + dur + self.waiting_est
        self.loop.at(now + dur, self._done, rec)

    def _done(self, rec: SimRecord | None) -> None:
        self.state.queued -= 1
        self.running = False
        if rec is not None:
            self.cluster.index.store(self.state.name, rec.req.hash_ids)
            rec.first_token = rec.last = self.loop.now
            self.on_done(rec)
        if self.queue:
            self._start()


def _request(r: TraceRequest) -> Request:
    return Request(str(r.index), r.input_tokens, r.output_tokens, r.hash_ids)


class Replay:
    """Feeds a trace through a scheduler; records decisions and scheduling latency."""

    def __init__(self, scheduler: Scheduler, loop: EventLoop,
                 dispatch: Callable[[SimRecord, Decision], None],
                 progress: Progress | None, explain: Explain | None) -> None:
        self.scheduler, self.loop, self.dispatch = scheduler, loop, dispatch
        self.progress, self.explain = progress, explain
        self.latency: list[float] = []

    def run(self, reqs: list[TraceRequest]) -> list[SimRecord]:
        out = []
        sched, loop = self.scheduler, self.loop
        for i, r in enumerate(reqs):
            loop.run_until(r.arrival)
            rec = SimRecord(r, r.arrival)
            req = _request(r)
            t0 = time.perf_counter()
            decision = sched.schedule(req, loop.now, self.explain is not None)
            self.latency.append(time.perf_counter() - t0)
            if self.explain is not None:
                self.explain(decision.explain())
            if decision.admitted:
                sched.commit(decision, req, loop.now)
                rec.instance = decision.prefill
                self.dispatch(rec, decision)
            else:
                rec.rejected, rec.retry_after = True, decision.retry_after_s
            out.append(rec)
            if self.progress is not None and (i % 256 == 0 or i == len(reqs) - 1):
                self.progress(i + 1, len(reqs))
        loop.run_until(float("inf"))
        return out


def disaggregated(reqs: list[TraceRequest], policy: str, model: CostModel, cfg: SimConfig,
                  progress: Progress | None = None,
                  explain: Explain | None = None, options: Mapping[str, Any] | None = None,
                  links: Links | None = None, aware: bool = False
                  ) -> tuple[list[SimRecord], list[float]]:
    """Prefill instances under `policy` (built with its own `options`, as the live conductor's
    `ConductorConfig.policy_options()`), decode instances picked by the scheduler. Fetches
    take each pair's bandwidth in `links` (default: the model's); with `aware` the scheduler
    knows them, as measured, else it assumes the model's."""
    loop = EventLoop()
    cluster = Cluster(model)
    if aware and links is not None:
        cluster.links = links
    sched = Scheduler(cluster, make_policy(policy, cfg.seed, options), cfg.slo())
    decoders: dict[str, BatchInstance] = {}
    for j in range(cfg.decode):
        state = cluster.add(f"d{j:04d}", "decode")
        decoders[state.name] = BatchInstance(state, model, loop)
    dec_of: dict[int, str] = {}

    def first_token(rec: SimRecord) -> None:
        dec = dec_of.pop(rec.req.index, None)
        if dec is not None:
            decoders[dec].join(rec)

    prefills: dict[str, PrefillInstance] = {}
    for j in range(cfg.prefill):
        state = cluster.add(f"p{j:04d}", "prefill", cfg.cache_blocks(model))
        prefills[state.name] = PrefillInstance(state, cluster, loop, first_token, prefills,
                                               links)

    def dispatch(rec: SimRecord, decision: Decision) -> None:
        if decision.decode is not None:
            dec_of[rec.req.index] = decision.decode
        prefills[decision.prefill].enqueue(rec, decision.placement.chosen)

    replay = Replay(sched, loop, dispatch, progress, explain)
    return replay.run(reqs), replay.latency


def colocated(reqs: list[TraceRequest], model: CostModel, cfg: SimConfig, prefix_cache: bool,
              chunk_tokens: int, progress: Progress | None = None) -> list[SimRecord]:
    """`cfg.colocated_instances()` instances that each prefill and decode, routed by
    least-load (cache-aware when they keep a local prefix cache)."""
    loop = EventLoop()
    cluster = Cluster(model)
    policy = "cache-aware" if prefix_cache else "least-load"
    sched = Scheduler(cluster, make_policy(policy, cfg.seed), cfg.slo(decode=False))
    insts: dict[str, BatchInstance] = {}
    for j in range(cfg.colocated_instances()):
        state = cluster.add(f"c{j:04d}", "prefill", cfg.cache_blocks(model) if prefix_cache
                            else 0)
        insts[state.name] = BatchInstance(state, model, loop,
                                          cluster.index if prefix_cache else None,
                                          chunk_tokens, booked=False)

    def dispatch(rec: SimRecord, decision: Decision) -> None:
        insts[decision.prefill].enqueue(rec)

    return Replay(sched, loop, dispatch, progress, None).run(reqs)
