"""The pruned scheduler decides as the straightforward computation does (every candidate
scored, bench/scheduler_reference.py): at 10,000 instances on seeded requests, and on small
clusters with their prefix levels forced wide, through queues that drain, instances that die
or leave, bookings released and ties. The orders it searches are checked against sorting."""

from __future__ import annotations

import dataclasses
import random

import pytest

from mooncake_cli.bench import scheduler_reference as reference
from mooncake_cli.scheduler import candidates, policy_ours
from mooncake_cli.scheduler.costmodel import FittedCostModel, paper
from mooncake_cli.scheduler.online_cost import OnlineCostModel
from mooncake_cli.scheduler.policy_ours import PipelinePolicy
from mooncake_cli.scheduler.scheduler import Scheduler, make_policy
from mooncake_cli.scheduler.state import Cluster, Request

HOT = -1  # the block most instances hold (a shared system prompt)


def conversations(rng: random.Random, count: int) -> list[list[int]]:
    """Block keys of `count` conversations, each a chain of turns that extend its prefix."""
    out, key = [], 0
    for _ in range(count):
        turns = rng.randint(1, 4)
        blocks = [HOT] if rng.random() < 0.9 else []
        chain = []
        for _ in range(turns):
            n = rng.randint(1, 6)
            blocks = blocks + list(range(key, key + n))
            key += n
            chain.append(list(blocks))
        out.extend(chain)
    return out


def cluster(prefill: int, decode: int, seed: int, model: object = None,
            kv_cap: int | None = None) -> tuple[Cluster, list[list[int]], random.Random]:
    rng = random.Random(seed)
    c = Cluster(model or paper())  # type: ignore[arg-type]
    names = [f"p{i:05d}" for i in range(prefill)]
    for name in names:
        c.add(name, "prefill")
    for i in range(decode):
        c.add(f"d{i:05d}", "decode", kv_capacity_tokens=kv_cap)
    prompts = conversations(rng, max(40, prefill // 3))
    for keys in prompts:  # each on one or two instances; the hot block spreads with them
        for name in rng.sample(names, rng.choice((1, 1, 2))):
            c.index.store(name, keys)
    for inst in c.prefill:  # a third idle, ties among the busy
        inst.busy_until = rng.choice((0.0, 0.0, rng.choice((1.0, 2.0)), rng.uniform(0, 5)))
    for inst in c.decode:
        inst.batch = rng.choice((0, 0, rng.randint(1, 8)))
        inst.context_tokens = inst.batch * rng.choice((512, 1024))
    return c, prompts, rng


def request(rng: random.Random, prompts: list[list[int]], i: int) -> Request:
    keys = list(rng.choice(prompts))
    if rng.random() < 0.3:  # a new turn: its own blocks after the known prefix
        keys += [10**9 + 100 * i + j for j in range(rng.randint(1, 3))]
    elif rng.random() < 0.15:  # a new prompt, up to 16 blocks: nothing held
        keys = [2 * 10**9 + 100 * i + j for j in range(rng.randint(1, 16))]
    tokens = len(keys) * 512 - rng.randint(0, 511)
    return Request(f"r{i}", tokens, rng.randint(1, 600), keys)


def replay(sched: Scheduler, prompts: list[list[int]], rng: random.Random, count: int,
           churn: bool = False, explain: bool = True) -> tuple[int, int]:
    """Decide `count` requests, each checked against the reference, then booked and its
    blocks stored; time moves on. Returns how many prefill choices fetched a prefix, and how
    many were pipelines."""
    c, now, fetched, piped, booked = sched.cluster, 0.0, 0, 0, []
    for i in range(count):
        req = request(rng, prompts, i)
        d = sched.schedule(req, now)
        assert d.placement.chosen == reference.chosen(sched, req, now), (i, req)
        assert d.decode == reference.decode(sched, req), (i, req)
        if isinstance(sched.policy, PipelinePolicy):  # its pipeline, chosen or not
            match = c.index.prefix_match(req.block_keys, policy_ours.SMALL)
            mine = sched.policy._pipeline(req, c, now, match)
            if mine is not None and mine.fetch_from == "":
                mine = dataclasses.replace(mine, fetch_from=match.source())
            prefix = c.index.prefix_lengths(req.block_keys)
            assert mine == reference.pipelined(sched.policy, req, c, now, prefix), (i, req)
        if explain:  # scoring every instance, as --explain does, chooses the same
            assert d.placement.chosen == sched.schedule(req, now, True).placement.chosen
        fetched += d.placement.chosen.fetch_blocks > 0
        piped += bool(d.placement.chosen.stages)
        sched.commit(d, req, now)
        c.index.store(d.prefill, req.block_keys)
        booked.append((d.decode, sched.decode_booking(req)))
        if churn and i % 7 == 3:  # a booking ends, an instance dies or comes back or leaves
            name, tokens = booked.pop(rng.randrange(len(booked)))
            if name is not None:
                sched.release(name, tokens)
            victim = rng.choice(c.prefill)
            victim.alive = not victim.alive if i % 21 != 3 else victim.alive
            if i % 35 == 3 and len(c.prefill) > 3:
                c.remove(c.prefill[-1].name)
        now += rng.choice((0.0, 0.0, 0.05, 0.5))
    return fetched, piped


def test_10k_instances_decide_as_the_reference() -> None:
    c, prompts, rng = cluster(10_000, 10_000, seed=1)
    assert len(c.index.holders(HOT)) > 5000  # the hot block is on most instances
    sched = Scheduler(c, make_policy("kvcache-centric"))
    replay(sched, prompts, rng, 25, explain=False)
    sched = Scheduler(c, make_policy("kvcache-pipeline"))
    replay(sched, prompts, rng, 10, explain=False)


@pytest.mark.parametrize("policy", ["kvcache-centric", "cache-aware", "kvcache-pipeline"])
@pytest.mark.parametrize("seed", [2, 3, 4])
def test_wide_levels_decide_as_the_reference(monkeypatch: pytest.MonkeyPatch, policy: str,
                                             seed: int) -> None:
    monkeypatch.setattr(candidates, "SMALL", 1)  # every level held twice or more is walked
    monkeypatch.setattr(policy_ours, "SMALL", 1)
    c, prompts, rng = cluster(60, 8, seed, kv_cap=6000)
    sched = Scheduler(c, make_policy(policy))
    fetched, piped = replay(sched, prompts, rng, 300, churn=True)
    # the fetch path ran, except for cache-aware, which computes what an instance lacks
    assert (fetched > 0) == (policy != "cache-aware")
    assert (policy == "kvcache-pipeline") == (piped > 0)


@pytest.mark.parametrize("seed", [5, 6])
def test_live_conductor_decides_as_the_reference(seed: int) -> None:
    """grow_decode with the online cost model: equal decode step times, ties broken on the
    tokens held or booked."""
    model = OnlineCostModel(block_tokens=512, kv_bytes_per_token=1024, bandwidth=1e10)
    c, prompts, rng = cluster(30, 6, seed, model, kv_cap=20_000)
    sched = Scheduler(c, make_policy("kvcache-centric"), grow_decode=True)
    replay(sched, prompts, rng, 200, churn=True)


@pytest.mark.parametrize("grow", [False, True])
def test_batch_dependent_step_time_decides_as_the_reference(grow: bool) -> None:
    """A fitted cost model: a decode step costs per request and per token, so the instance
    holding the fewest tokens need not step fastest."""
    model = FittedCostModel("fitted", 512, 1024, 1e10, c0=0.01, c_quad=1e-9, c_lin=1e-4,
                            d0=0.01, d_batch=0.004, d_ctx=2e-7)
    c, prompts, rng = cluster(30, 12, 8, model, kv_cap=30_000)
    for inst in c.decode:  # few tokens but many requests on some, the reverse on others
        inst.batch = rng.choice((0, 12, 24))
        inst.context_tokens = rng.choice((0, 4000, 12000))
    sched = Scheduler(c, make_policy("kvcache-centric"), grow_decode=grow)
    replay(sched, prompts, rng, 150, churn=True)


def test_orders_match_sorting() -> None:
    c, _, rng = cluster(50, 30, seed=7)
    now = 0.0
    for step in range(400):
        inst = rng.choice(c.prefill + c.decode)
        field = rng.choice(("busy_until", "batch", "context_tokens", "booked_requests",
                            "booked_tokens", "alive"))
        value = {"busy_until": rng.choice((0.0, 1.0, rng.uniform(0, 4))),
                 "alive": rng.random() < 0.8}.get(field, rng.choice((0, 0, rng.randint(1, 9))))
        setattr(inst, field, value)
        now = now + rng.uniform(0, 0.2) if step % 50 else rng.uniform(0, 3)  # back in time too
        live_p = [i for i in c.prefill if i.alive]
        want = sorted(live_p, key=lambda i: (max(i.busy_until, now), i.name))
        assert [i.name for i in c.queues.walk(now)] == [i.name for i in want]
        assert c.queues.idle(now) == [i.name for i in want if i.busy_until <= now]
        live_d = [i for i in c.decode if i.alive]
        want = sorted(live_d, key=lambda i: (i.held_tokens(), i.name))
        assert [i.name for i in c.decoders.walk()] == [i.name for i in want]
    c.remove("p00001")
    c.remove("d00001")
    assert "p00001" not in c.queues.idle(now) + [i.name for i in c.queues.walk(now)]
    assert "d00001" not in [i.name for i in c.decoders.walk()]
