"""`kvcache-pipeline`: our policy, Algorithm 1 plus pipelined prefill on idle instances."""

from __future__ import annotations

import dataclasses

from mooncake_cli.interfaces import ConfigError
from mooncake_cli.scheduler.candidates import SMALL, best_candidate, first_at
from mooncake_cli.scheduler.costmodel import CostModel, transfer_time
from mooncake_cli.scheduler.estimate import Candidate, Placement
from mooncake_cli.scheduler.policies import KVCacheCentricPolicy
from mooncake_cli.scheduler.prefix_match import PrefixMatch
from mooncake_cli.scheduler.state import Cluster, InstanceState, Request


def pipeline_time(model: CostModel, n: int, p: int, stages: int, chunk: int) -> float:
    """Seconds to prefill tokens p..n split into `chunk`-token chunks through `stages`
    instances, each running an equal share of the layers (chunked pipeline parallelism).

    Per chunk every stage takes the same time and later chunks take longer (attention grows
    with position), so this proportionate flow shop ends after the sum of the chunk times of
    one stage plus `stages - 1` times the longest (the last) chunk. Hand-offs lie on the same
    path: the lead hands every token on, and the last chunk crosses `stages - 1` of them
    (the cost model's `handoff_s_per_token`, which the live conductor learns)."""
    if n <= p:
        return 0.0
    last_start = max(p, n - chunk)
    total = model.prefill_time(n, p) / stages
    handoff = model.handoff_s_per_token * ((n - p) + (stages - 1) * (n - last_start)) \
        if stages > 1 else 0.0
    return total + (stages - 1) * model.prefill_time(n, last_start) / stages + handoff


def best_stages(cluster: Cluster, req: Request, lead: str, have: int, best: int, src: str,
                others: list[str], most: int, chunk: int) -> Candidate | None:
    """The fastest pipeline of 2..`most` stages led by `lead` (holding `have` prefix blocks;
    `src` holds the longest, `best`) with the first of `others` as the other stages."""
    model = cluster.model
    got = cluster.cached_tokens(req.input_tokens, best)
    local_tok = cluster.cached_tokens(req.input_tokens, have)
    top: Candidate | None = None
    for k in range(2, most + 1):
        # the lead lacks (got - local) tokens of all layers; each other stage its slice
        xfer = (transfer_time(model, got - local_tok) / k
                + transfer_time(model, got) * (k - 1) / k)
        pre = pipeline_time(model, req.input_tokens, got, k, chunk)
        cand = Candidate(lead, 0.0, have, best if src != lead else 0,
                         src if src != lead else None, xfer, pre, xfer + pre,
                         tuple(others[:k - 1]), chunk)
        if top is None or cand.ttft_s < top.ttft_s:
            top = cand
    return top


class PipelinePolicy(KVCacheCentricPolicy):
    """Ours: Algorithm 1 (`kvcache-centric`), and when instances sit idle, a prefill may be
    spread over several of them as a pipeline of layer stages fed with chunks of the prompt
    (the paper's chunked pipeline parallelism, chosen per request by the scheduler).

    For every k from 2 to the number of idle instances (at most `max_stages`), the estimate
    is: transfer of the reusable prefix (its layer slice to each stage, from the instance
    holding it) + `pipeline_time`. The lead stage is the idle instance holding the longest
    prefix; it gathers the KV and stores the blocks. The request goes to the pipeline when its
    TTFT beats the best single instance of Algorithm 1 by more than `min_gain` (a fraction);
    otherwise it goes where Algorithm 1 says. Only idle instances are used, so no queued
    request is delayed by the pipeline at the time of the decision; `reserve` idle instances
    are always left free for the requests that follow.

    Defaults (2 stages, 2048-token chunks, 30% gain) were chosen on the paper setup: more
    stages or a lower bar make the pipelines hold idle instances that the short requests
    arriving next would have used, and the mean TTFT rises again."""

    name = "kvcache-pipeline"

    def __init__(self, seed: int = 0, threshold: float = 1.0, max_stages: int = 2,
                 chunk_tokens: int = 2048, min_gain: float = 0.3, reserve: int = 0) -> None:
        if max_stages < 1 or chunk_tokens < 1 or not 0 <= min_gain < 1 or reserve < 0:
            raise ConfigError(f"kvcache-pipeline needs max_stages >= 1 (got {max_stages}), "
                              f"chunk_tokens >= 1 ({chunk_tokens}), 0 <= min_gain < 1 "
                              f"({min_gain}) and reserve >= 0 ({reserve})")
        super().__init__(seed, threshold)
        self.max_stages, self.chunk, self.min_gain = max_stages, chunk_tokens, min_gain
        self.reserve = reserve

    def place(self, req: Request, cluster: Cluster, now: float,
              explain: bool = False) -> Placement:
        match = cluster.index.prefix_match(req.block_keys, SMALL)
        if explain:
            cands = self.candidates(req, cluster, now, explain, match.lengths())
            best = min(cands, key=lambda c: (c.ttft_s, c.instance))
        else:  # Algorithm 1's choice, scoring only instances that can win
            cands, best = [], best_candidate(cluster, req, now, self.threshold)
        piped = self._pipeline(req, cluster, now, match)
        single = None
        if piped is not None:
            chosen = piped.ttft_s < best.ttft_s * (1 - self.min_gain)
            if piped.fetch_from == "" and (chosen or explain):  # named only when needed
                piped = dataclasses.replace(piped, fetch_from=match.source())
            if chosen:
                single, best = best, piped
            if explain or chosen:
                cands.append(piped)
        return Placement(self.name, best, tuple(cands) if explain else (), single)

    def _idle(self, cluster: Cluster, now: float,
              match: PrefixMatch) -> tuple[InstanceState | None, list[InstanceState]]:
        """The idle instance holding the longest prefix (lowest name on ties; None if no
        holder is idle), and the first idle instances in registration order, enough for the
        stages and the reserve."""
        holder: InstanceState | None = None
        top = 0
        for name, blocks in match.deep.items():
            inst = cluster.by_name.get(name)
            if inst is not None and inst.alive and inst.busy_until <= now and (
                    blocks > top or (blocks == top and holder is not None and
                                     name < holder.name)):
                holder, top = inst, blocks
        if holder is None:  # the wide levels, deepest first
            idle = cluster.queues.idle(now)
            for d in reversed(match.wide_depths()[1:]):
                first = first_at(idle, match, d)
                if first is not None:
                    holder = cluster.by_name[first]
                    break
        want = self.max_stages + self.reserve + 1
        return holder, [cluster.by_name[n] for n in cluster.queues.idle_first_added(now, want)]

    def _pipeline(self, req: Request, cluster: Cluster, now: float,
                  match: PrefixMatch) -> Candidate | None:
        """The best pipelined candidate; its `fetch_from` is "" when it fetches from the
        lowest-named holder of the longest prefix, named by the caller if it is chosen."""
        if req.input_tokens <= self.chunk or self.max_stages < 2:
            return None
        holder, idle = self._idle(cluster, now, match)
        most = min(self.max_stages, len(idle) - self.reserve)
        if most < 2:
            return None
        lead = holder or idle[0]
        have = match.depth(lead.name)
        best = match.longest()
        src = lead.name if best == have else ""
        others = [i.name for i in idle if i is not lead]
        return best_stages(cluster, req, lead.name, have, best, src, others, most, self.chunk)
