"""The reference the pruned scheduler is checked against: the same decision computed the
straightforward way, every candidate scored (`mooncake bench scheduler --check`, the tests)."""

from __future__ import annotations

from mooncake_cli.conductor.estimate import least_queued, local
from mooncake_cli.conductor.policies import CacheAwarePolicy, KVCacheCentricPolicy
from mooncake_cli.conductor.policy_ours import PipelinePolicy
from mooncake_cli.conductor.scheduler import Scheduler
from mooncake_cli.conductor.state import Request
from mooncake_cli.interfaces import ConfigError

COVERED = ("kvcache-centric", "cache-aware")


def prefill(sched: Scheduler, req: Request, now: float) -> str:
    """The prefill instance: the lowest (TTFT, name) over every live holder of a prefix,
    scored each, plus the least queued live instance holding none."""
    policy, cluster = sched.policy, sched.cluster
    if isinstance(policy, KVCacheCentricPolicy) and not isinstance(policy, PipelinePolicy):
        cands = policy.candidates(req, cluster, now, False)
    elif isinstance(policy, CacheAwarePolicy):
        insts = cluster.live_prefill()
        prefix = cluster.index.prefix_lengths(req.block_keys)
        cands = [local(cluster, i, req, now, prefix[i.name]) for i in insts
                 if i.name in prefix]
        other = least_queued(insts, now, prefix)
        if other is not None:
            cands.append(local(cluster, other, req, now, 0))
    else:
        raise ConfigError(f"the reference covers {' and '.join(COVERED)}, not {policy.name}")
    return min(cands, key=lambda c: (c.ttft_s, c.instance)).instance


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
    return prefill(sched, req, now), decode(sched, req)
