"""The reference the pruned scheduler is checked against: the same decision computed the
straightforward way, as it was before the pruning -- every holder of a prefix scored, every
idle instance looked at, every decode instance scanned (`mooncake bench scheduler --check`,
the tests)."""

from __future__ import annotations

from mooncake_cli.interfaces import ConfigError
from mooncake_cli.scheduler.estimate import Candidate, least_queued, local
from mooncake_cli.scheduler.policies import CacheAwarePolicy, KVCacheCentricPolicy
from mooncake_cli.scheduler.policy_ours import PipelinePolicy, best_stages
from mooncake_cli.scheduler.scheduler import Scheduler
from mooncake_cli.scheduler.state import Cluster, Request

COVERED = ("kvcache-centric", "cache-aware", "kvcache-pipeline")


def _best(cands: list[Candidate]) -> Candidate:
    return min(cands, key=lambda c: (c.ttft_s, c.instance))


def chosen(sched: Scheduler, req: Request, now: float) -> Candidate:
    """The prefill choice: the lowest (TTFT, name) over every live holder of a prefix,
    scored each, plus the least queued live instance holding none and each one with a
    bandwidth measured from the prefix's holder (Cluster.links); for kvcache-pipeline,
    a pipeline over idle instances when it beats that by the policy's margin."""
    policy, cluster = sched.policy, sched.cluster
    prefix = cluster.index.prefix_lengths(req.block_keys)
    if isinstance(policy, KVCacheCentricPolicy):
        best = _best(policy.candidates(req, cluster, now, False, prefix))
        if isinstance(policy, PipelinePolicy):
            piped = pipelined(policy, req, cluster, now, prefix)
            if piped is not None and piped.ttft_s < best.ttft_s * (1 - policy.min_gain):
                best = piped
        return best
    if isinstance(policy, CacheAwarePolicy):
        insts = cluster.live_prefill()
        cands = [local(cluster, i, req, now, prefix[i.name]) for i in insts
                 if i.name in prefix]
        other = least_queued(insts, now, prefix)
        if other is not None:
            cands.append(local(cluster, other, req, now, 0))
        return _best(cands)
    raise ConfigError(f"the reference covers {', '.join(COVERED)}, not {policy.name}")


def pipelined(policy: PipelinePolicy, req: Request, cluster: Cluster, now: float,
              prefix: dict[str, int]) -> Candidate | None:
    """kvcache-pipeline's pipelined candidate, every holder and instance looked at."""
    if req.input_tokens <= policy.chunk or policy.max_stages < 2:
        return None
    holder = None
    for name, blocks in prefix.items():
        inst = cluster.by_name.get(name)
        if inst is not None and inst.alive and inst.busy_until <= now and (
                holder is None or blocks > prefix[holder.name]
                or (blocks == prefix[holder.name] and name < holder.name)):
            holder = inst
    want = policy.max_stages + policy.reserve + 1
    idle = [i for i in cluster.prefill if i.alive and i.busy_until <= now][:want]
    most = min(policy.max_stages, len(idle) - policy.reserve)
    if most < 2:
        return None
    lead = holder or idle[0]
    have = prefix.get(lead.name, 0)
    src, best = lead.name, have
    for name, blocks in prefix.items():
        if blocks > best or (blocks == best and blocks > have and name < src):
            src, best = name, blocks
    others = [i.name for i in idle if i is not lead]
    return best_stages(cluster, req, lead.name, have, best, src, others, most, policy.chunk)


def decode(sched: Scheduler, req: Request) -> str | None:
    """The decode instance: the lowest (step time, held tokens, name) over every live decode
    instance with room."""
    cluster = sched.cluster
    need = sched.decode_booking(req)
    grown = round(req.input_tokens + sched.expected_output(req))
    keys = []
    for inst in cluster.live_decode():
        held = inst.held_tokens()
        if inst.kv_capacity_tokens is not None and held + need > inst.kv_capacity_tokens:
            continue
        t = cluster.model.decode_step_time(inst.load() + 1, held + grown)
        keys.append((t, held, inst.name))
    return min(keys)[2] if keys else None


def decide(sched: Scheduler, req: Request, now: float) -> tuple[str, str | None]:
    """(prefill, decode) of the reference computation."""
    return chosen(sched, req, now).instance, decode(sched, req)
