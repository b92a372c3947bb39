"""The scheduler: a prefill placement policy, a decode pick and SLO admission, with an
explanation record for every decision; `commit` books the chosen work on the instances."""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from mooncake_cli.interfaces import ConfigError
from mooncake_cli.scheduler import decode_choice
from mooncake_cli.scheduler.calibration import TtftCalibration
from mooncake_cli.scheduler.estimate import Placement
from mooncake_cli.scheduler.policies import (
    CacheAwarePolicy,
    KVCacheCentricPolicy,
    LeastLoadPolicy,
    Policy,
    RandomPolicy,
    RoundRobinPolicy,
)
from mooncake_cli.scheduler.policy_ours import PipelinePolicy
from mooncake_cli.scheduler.state import Cluster, InstanceState, Request

POLICIES: Mapping[str, type] = MappingProxyType({p.name: p for p in (
    RandomPolicy, RoundRobinPolicy, LeastLoadPolicy, CacheAwarePolicy, KVCacheCentricPolicy,
    PipelinePolicy)})


def make_policy(name: str, seed: int = 0, options: Mapping[str, Any] | None = None) -> Policy:
    """A policy by name, with its own `options` (keyword arguments of its class); ConfigError
    lists the known names."""
    cls = POLICIES.get(name)
    if cls is None:
        raise ConfigError(f"unknown policy '{name}': use one of {', '.join(POLICIES)}")
    policy: Policy = cls(seed=seed, **(options or {}))
    return policy


@dataclass(frozen=True)
class Slo:
    """Admission limits in seconds; None admits everything on that count."""

    ttft_s: float | None = None
    tbt_s: float | None = None

    def __post_init__(self) -> None:
        for what, v in (("TTFT", self.ttft_s), ("TBT", self.tbt_s)):
            if v is not None and not (v > 0 and math.isfinite(v)):
                raise ConfigError(f"{what} SLO must be a number of seconds > 0, not {v}")


@dataclass(frozen=True)
class Decision:
    """Where a request goes (or why not: 429 with a retry-after estimate, `too_large` when no
    live decode instance could ever hold its KV, or `waiting` when none has room for it now
    but one will), and why."""

    request: str
    time: float
    placement: Placement
    decode: str | None
    est_tbt_s: float | None
    admitted: bool
    retry_after_s: float | None = None
    reason: str = ""
    too_large: bool = False
    waiting: bool = False

    @property
    def prefill(self) -> str:
        return self.placement.chosen.instance

    def explain(self) -> dict[str, Any]:
        """The record `--explain` writes: the choice and the estimates per candidate."""
        tbt = None if self.est_tbt_s is None else round(self.est_tbt_s, 6)
        return {"request": self.request, "time": round(self.time, 6),
                "policy": self.placement.policy, "admitted": self.admitted,
                "reason": self.reason, "retry_after_s": self.retry_after_s,
                "prefill": self.placement.chosen.to_dict(), "decode": self.decode,
                "est_tbt_s": tbt,
                "candidates": [c.to_dict() for c in self.placement.candidates],
                **self._pipeline()}

    def _pipeline(self) -> dict[str, Any]:
        """A pipelined prefill's stages, chunk and both estimates (pipelined, best single)."""
        chosen, single = self.placement.chosen, self.placement.single
        if not chosen.stages:
            return {}
        return {"pipeline": {"lead": chosen.instance, "stages": list(chosen.stages),
                             "chunk_tokens": chosen.chunk_tokens,
                             "ttft_s": round(chosen.ttft_s, 6),
                             "single": single.to_dict() if single is not None else None}}


@dataclass
class Scheduler:
    """Places requests on a cluster with one policy, admitting against an SLO.

    With `grow_decode` (the live conductor: decode workers allocate KV as sequences grow and
    preempt when full), a decode booking is the prompt's blocks plus one, the TBT estimate uses
    the expected output rather than max_tokens, no decode room now is `waiting` (not a 429),
    and so is a prefill instance with `prefill_depth` requests booked already. Without it (the
    simulator), a request books its whole prompt + output."""

    cluster: Cluster
    policy: Policy
    slo: Slo = field(default_factory=Slo)
    mean_output_tokens: float = 256.0  # running estimate, for decode retry-after
    grow_decode: bool = False
    prefill_depth: int = 0  # grow_decode: requests booked per prefill instance at most (0: any)
    calibration: TtftCalibration = field(default_factory=TtftCalibration)
    completions: deque[float] = field(default_factory=lambda: deque(maxlen=32))

    def observe_ttft(self, estimated_s: float, actual_s: float) -> None:
        """A request placed with TTFT estimate `estimated_s` (no queue wait) saw its first token
        `actual_s` after placement (grow_decode: SLO admission follows what clients see)."""
        if self.grow_decode:
            self.calibration.observe(estimated_s, actual_s)

    def estimated_ttft(self, placement: Placement) -> float:
        t = placement.chosen.ttft_s
        return self.calibration.apply(t) if self.grow_decode else t

    def decode_booking(self, req: Request) -> int:
        """KV tokens a request books on its decode instance: grow_decode, the prompt's blocks
        and one more — or, under an SLO, the blocks of its expected length, so that a queue
        forms before decode KV runs out and preemption stalls admissions unforeseen."""
        if not self.grow_decode:
            return req.input_tokens + req.output_tokens
        bt = max(1, self.cluster.model.block_tokens)
        if self.slo.ttft_s is not None or self.slo.tbt_s is not None:
            return -(-round(req.input_tokens + self.expected_output(req)) // bt) * bt
        return (-(-req.input_tokens // bt) + 1) * bt

    def expected_output(self, req: Request) -> float:
        return min(req.output_tokens, self.mean_output_tokens) if self.grow_decode else \
            req.output_tokens

    def pick_decode(self, req: Request) -> tuple[InstanceState | None, float | None]:
        """The decode choice (decode_choice.py) and its step time: inf when no live decode
        instance has room, (None, None) when the cluster has none (not limiting)."""
        if not self.cluster.decoders.live_count():
            return None, None
        return decode_choice.pick(self.cluster, self.decode_booking(req),
                                  round(req.input_tokens + self.expected_output(req)))

    def decode_capacity(self) -> int | None:
        """The largest KV capacity (tokens) of a live decode instance; None if unknown."""
        caps = [i.kv_capacity_tokens for i in self.cluster.live_decode()]
        known = [c for c in caps if c is not None]
        return max(known) if known and len(known) == len(caps) else None

    def decode_capacity_short(self, req: Request) -> int | None:
        """The largest KV capacity (tokens) of the live decode instances when `req` needs more
        than every one of them holds even empty; None when some instance could take it (or its
        capacity is unknown)."""
        largest = self.decode_capacity()
        return largest if largest is not None and \
            req.input_tokens + req.output_tokens > largest else None

    def schedule(self, req: Request, now: float, explain: bool = False) -> Decision:
        """Decide, without booking anything (see `commit`)."""
        placement = self.policy.place(req, self.cluster, now, explain)
        dec, tbt = self.pick_decode(req)
        ttft = self.estimated_ttft(placement)
        if self.grow_decode:
            wait = self._wait(req, now, placement, dec, tbt)
            if wait is not None:
                return wait
        over_ttft = self.slo.ttft_s is not None and ttft > self.slo.ttft_s
        over_tbt = tbt is not None and (tbt == math.inf or
                                        (self.slo.tbt_s is not None and tbt > self.slo.tbt_s))
        if not (over_ttft or over_tbt):
            return Decision(req.id, now, placement, dec.name if dec else None, tbt, True)
        largest = self.decode_capacity_short(req) if dec is None else None
        if largest is not None:
            return Decision(req.id, now, placement, None, tbt, False, None,
                            f"the request needs KV room for {req.input_tokens} + "
                            f"{req.output_tokens} tokens; the largest decode instance holds "
                            f"{largest}", too_large=True)
        retry, why = 0.0, []
        if over_ttft:
            assert self.slo.ttft_s is not None
            retry = ttft - self.slo.ttft_s  # queues drain in real time
            why.append(f"estimated TTFT {ttft:.3f} s > SLO {self.slo.ttft_s:g} s")
        if over_tbt:
            retry = max(retry, self.decode_retry())
            limit = self.slo.tbt_s
            if tbt is None or tbt == math.inf or limit is None:
                why.append("no decode instance has KV room")
            else:
                why.append(f"estimated TBT {tbt * 1e3:.1f} ms > SLO {limit * 1e3:g} ms")
        return Decision(req.id, now, placement, dec.name if dec else None, tbt, False,
                        round(max(retry, 0.001), 3), "; ".join(why))

    def _wait(self, req: Request, now: float, placement: Placement,
              dec: InstanceState | None, tbt: float | None) -> Decision | None:
        """grow_decode: the `too_large` or `waiting` decision, if it is one of those."""
        if dec is None and tbt is not None:
            largest = self.decode_capacity_short(req)
            if largest is not None:
                return Decision(req.id, now, placement, None, tbt, False, None,
                                f"the request needs KV room for {req.input_tokens} + "
                                f"{req.output_tokens} tokens; the largest decode instance "
                                f"holds {largest}", too_large=True)
            return Decision(req.id, now, placement, None, None, False,
                            round(self.decode_retry(), 3), "no decode instance has KV room "
                            "now", waiting=True)
        inst = self.cluster.by_name.get(placement.chosen.instance)
        if self.prefill_depth and inst is not None and inst.queued >= self.prefill_depth:
            gap = placement.chosen.prefill_s / max(1, len(self.cluster.live_prefill()))
            return Decision(req.id, now, placement, dec.name if dec else None, tbt, False,
                            round(gap, 4), f"prefill instance "
                            f"{inst.name} has {inst.queued} requests booked", waiting=True)
        return None

    def observe_output(self, tokens: int) -> None:
        """A request finished with `tokens` output tokens (grow_decode: the retry estimate)."""
        if self.grow_decode:
            self.mean_output_tokens += (tokens - self.mean_output_tokens) * 0.05
            self.completions.append(time.monotonic())

    def decode_wait(self, ahead: int, booking: int) -> float:
        """Seconds until decode KV has room for a request booking `booking` tokens with `ahead`
        requests before it in line: none while the live instances' free room holds all of
        them; else the remaining life of a running request (its expected output at the
        current step time) plus one completion per further request."""
        insts = self.cluster.live_decode()
        if not insts or booking <= 0 or any(i.kv_capacity_tokens is None for i in insts):
            return 0.0
        fits = sum(max(0, (i.kv_capacity_tokens or 0) - i.held_tokens()) // booking
                   for i in insts)
        excess = ahead + 1 - fits
        if excess <= 0:
            return 0.0
        busy = max(insts, key=lambda i: i.batch)
        step = self.cluster.model.decode_step_time(max(1, busy.batch), busy.context_tokens)
        return step * self.mean_output_tokens + (excess - 1) * self.decode_retry()

    def decode_retry(self) -> float:
        """Seconds until some decode request is expected to finish and free room: grow_decode,
        the measured time between recent completions (up to now) once there are a few; else
        from the cost model's step time."""
        done = self.completions
        if self.grow_decode and len(done) >= 4:
            return (time.monotonic() - done[0]) / (len(done) - 1)
        insts = [i for i in self.cluster.live_decode() if i.batch]
        if not insts:
            return 1.0
        inst = min(insts, key=lambda i: i.batch)
        step = self.cluster.model.decode_step_time(inst.batch, inst.context_tokens)
        return step * self.mean_output_tokens / inst.batch

    def commit(self, decision: Decision, req: Request, now: float) -> None:
        """Book an admitted decision: the prefill work on its queue, the KV on its decode."""
        if not decision.admitted:
            return
        chosen = decision.placement.chosen
        for name in (chosen.instance, *chosen.stages):
            inst = self.cluster.by_name[name]
            inst.busy_until = max(inst.busy_until, now) + chosen.transfer_s + chosen.prefill_s
            inst.queued += 1
        if not self.grow_decode:
            self.mean_output_tokens += (req.output_tokens - self.mean_output_tokens) * 0.01
        if decision.decode is not None:
            dec = self.cluster.by_name[decision.decode]
            if self.grow_decode:  # apart from load reports, which do not count it yet
                dec.booked_requests += 1
                dec.booked_tokens += self.decode_booking(req)
            else:
                dec.batch += 1
                dec.context_tokens += self.decode_booking(req)

    def release(self, decode: str, tokens: int) -> None:
        """Undo `commit`'s decode booking of `tokens` KV tokens on instance `decode`."""
        dec = self.cluster.by_name.get(decode)
        if dec is None:
            return
        if self.grow_decode:
            dec.booked_requests = max(0, dec.booked_requests - 1)
            dec.booked_tokens = max(0, dec.booked_tokens - tokens)
        else:
            dec.batch = max(0, dec.batch - 1)
            dec.context_tokens = max(0, dec.context_tokens - tokens)
