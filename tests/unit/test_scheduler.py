"""Scheduler policies on hand-built cluster states: each policy's choice, fetch versus
recompute, SLO admission (429 with a retry-after), decode pick and the explanation record."""

from __future__ import annotations

import dataclasses
import random

import pytest

from mooncake_cli.interfaces import ConfigError
from mooncake_cli.scheduler.costmodel import paper, transfer_time
from mooncake_cli.scheduler.online_cost import OnlineCostModel
from mooncake_cli.scheduler.policy_ours import PipelinePolicy, pipeline_time
from mooncake_cli.scheduler.scheduler import POLICIES, Scheduler, Slo, make_policy
from mooncake_cli.scheduler.state import Cluster, Request

BLOCK = 512


def cluster(prefill: int = 3, decode: int = 1, bandwidth: float | None = None) -> Cluster:
    model = paper() if bandwidth is None else dataclasses.replace(paper(), bandwidth=bandwidth)
    c = Cluster(model)
    for i in range(prefill):
        c.add(f"p{i}", "prefill", cache_blocks=1000)
    for i in range(decode):
        c.add(f"d{i}", "decode")
    return c


def request(blocks: int, rid: str = "r", base: int = 0) -> Request:
    return Request(rid, blocks * BLOCK, 100, tuple(range(base, base + blocks)))


def test_random_is_seeded_and_round_robin_cycles() -> None:
    c = cluster(prefill=4)
    policies = [make_policy("random", seed) for seed in (1, 1, 2)]
    picks = [[p.place(request(4), c, 0.0).chosen.instance for _ in range(20)]
             for p in policies]
    assert picks[0] == picks[1] != picks[2]
    assert set(picks[0]) <= {"p0", "p1", "p2", "p3"} and len(set(picks[0])) > 1
    rr = make_policy("round-robin")
    assert [rr.place(request(4), c, 0.0).chosen.instance for _ in range(5)] == \
        ["p0", "p1", "p2", "p3", "p0"]


def test_least_load_picks_least_queue_blind_to_cache() -> None:
    c = cluster()
    c.index.store("p0", range(8))  # p0 holds the whole prompt but is the busiest
    c.by_name["p0"].busy_until = 5.0
    c.by_name["p1"].busy_until = 2.0
    c.by_name["p2"].busy_until = 3.0
    chosen = make_policy("least-load").place(request(8), c, 1.0).chosen
    assert chosen.instance == "p1" and chosen.queue_s == pytest.approx(1.0)
    c.by_name["p1"].busy_until = 0.0  # all but p0 idle at t=4: a seeded random tie-break
    c.by_name["p2"].busy_until = 0.0
    idle = {i.name for i in c.prefill if i.busy_until <= 4.0}
    assert "p0" not in idle and len(idle) > 1
    picks = [make_policy("least-load", seed).place(request(8), c, 4.0).chosen.instance
             for seed in range(20)]
    assert set(picks) == idle  # only tied instances, each of them sometimes
    assert picks == [make_policy("least-load", seed).place(request(8), c, 4.0)
                     .chosen.instance for seed in range(20)]  # reproducible per seed


def test_cache_aware_weighs_local_prefix_against_queue() -> None:
    c = cluster()
    req = request(40)
    c.index.store("p2", range(30))
    m = c.model
    save = m.prefill_time(req.input_tokens) - m.prefill_time(req.input_tokens, 30 * BLOCK)
    c.by_name["p2"].busy_until = save * 0.5  # queue shorter than what the prefix saves
    chosen = make_policy("cache-aware").place(req, c, 0.0).chosen
    assert (chosen.instance, chosen.local_blocks, chosen.fetch_from) == ("p2", 30, None)
    c.by_name["p2"].busy_until = save * 2  # now the prefix is not worth the wait
    chosen = make_policy("cache-aware").place(req, c, 0.0).chosen
    assert chosen.instance == "p0" and chosen.local_blocks == 0


def test_kvcache_centric_fetches_when_faster_than_recompute() -> None:
    c = cluster()
    req = request(40)
    c.index.store("p2", range(30))
    c.by_name["p2"].busy_until = 100.0  # the holder is swamped
    chosen = make_policy("kvcache-centric").place(req, c, 0.0).chosen
    assert chosen.instance == "p0" and chosen.fetch_from == "p2" and chosen.fetch_blocks == 30
    assert chosen.transfer_s == pytest.approx(30 * BLOCK * 320 * 1024 / 100e9)
    assert chosen.prefill_s == pytest.approx(c.model.prefill_time(40 * BLOCK, 30 * BLOCK))
    assert chosen.ttft_s == pytest.approx(chosen.transfer_s + chosen.prefill_s)
    # cache-aware (local only) recomputes everything on the idle instance instead
    local = make_policy("cache-aware").place(req, c, 0.0).chosen
    assert local.fetch_from is None and local.ttft_s > chosen.ttft_s


def test_kvcache_centric_recomputes_when_fetch_is_slower() -> None:
    c = cluster(bandwidth=1e6)  # 1 MB/s: moving 30 blocks of KV takes hours
    req = request(40)
    c.index.store("p2", range(30))
    c.by_name["p2"].busy_until = 100.0
    chosen = make_policy("kvcache-centric").place(req, c, 0.0).chosen
    assert chosen.fetch_from is None and chosen.transfer_s == 0.0
    assert chosen.prefill_s == pytest.approx(c.model.prefill_time(40 * BLOCK))


def test_kvcache_centric_threshold_keeps_a_close_local_prefix() -> None:
    c = cluster(prefill=2)
    req = request(40)
    c.index.store("p0", range(20))
    c.index.store("p1", range(22))
    c.by_name["p1"].busy_until = 100.0
    eager = POLICIES["kvcache-centric"](threshold=1.0).place(req, c, 0.0).chosen
    assert eager.instance == "p0" and eager.fetch_from == "p1" and eager.fetch_blocks == 22
    lazy = POLICIES["kvcache-centric"](threshold=1.5).place(req, c, 0.0).chosen
    assert lazy.instance == "p0" and lazy.fetch_from is None and lazy.local_blocks == 20


@pytest.mark.parametrize("name", ["cache-aware", "kvcache-centric", "kvcache-pipeline"])
def test_fast_path_matches_full_explanation(name: str) -> None:
    rng = random.Random(3)
    for trial in range(30):
        c = cluster(prefill=12)
        for i in range(12):
            c.by_name[f"p{i}"].busy_until = rng.choice([0.0, 0.0, rng.uniform(0, 20)])
            c.index.store(f"p{i}", range(rng.randrange(0, 60)))
        req = request(rng.randrange(1, 120), str(trial))
        fast = make_policy(name).place(req, c, 1.0)
        full = make_policy(name).place(req, c, 1.0, explain=True)
        assert fast.chosen == full.chosen
        assert full.chosen.ttft_s == min(x.ttft_s for x in full.candidates)
        assert {x.instance for x in full.candidates} >= {f"p{i}" for i in range(12)}


def test_explanation_record_lists_every_candidate() -> None:
    c = cluster(prefill=4)
    c.index.store("p3", range(10))
    sched = Scheduler(c, make_policy("kvcache-centric"))
    rec = sched.schedule(request(12), 0.0, explain=True).explain()
    assert rec["admitted"] and rec["policy"] == "kvcache-centric" and rec["decode"] == "d0"
    assert [x["instance"] for x in rec["candidates"]] == ["p0", "p1", "p2", "p3"]
    for x in rec["candidates"]:
        assert x["ttft_s"] == pytest.approx(x["queue_s"] + x["transfer_s"] + x["prefill_s"],
                                            abs=1e-5)
    assert rec["prefill"]["instance"] == "p3" and rec["prefill"]["local_blocks"] == 10


def test_ttft_slo_rejects_with_retry_after() -> None:
    c = cluster(prefill=2)
    for inst in c.prefill:
        inst.busy_until = 50.0
    sched = Scheduler(c, make_policy("least-load"), Slo(ttft_s=10.0))
    d = sched.schedule(request(4), 0.0)
    assert not d.admitted and "TTFT" in d.reason
    assert d.retry_after_s == pytest.approx(d.placement.chosen.ttft_s - 10.0, abs=1e-3)
    sched.commit(d, request(4), 0.0)  # a rejection books nothing
    assert c.by_name["p0"].queued == 0 and c.by_name["d0"].batch == 0
    assert sched.schedule(request(4), 45.0).admitted  # the queue has drained by then


def test_tbt_slo_and_decode_pick() -> None:
    c = cluster(prefill=1, decode=2)
    c.by_name["d0"].batch, c.by_name["d0"].context_tokens = 50, 2_000_000
    sched = Scheduler(c, make_policy("least-load"), Slo(tbt_s=0.05))
    d = sched.schedule(request(4), 0.0)
    assert d.admitted and d.decode == "d1"  # the idle decode instance steps faster
    c.by_name["d1"].batch, c.by_name["d1"].context_tokens = 50, 2_000_000
    d = sched.schedule(request(4), 0.0)
    assert not d.admitted and "TBT" in d.reason and d.retry_after_s and d.retry_after_s > 0
    c2 = cluster(prefill=1, decode=1)
    c2.by_name["d0"].kv_capacity_tokens = 1000
    d = Scheduler(c2, make_policy("random")).schedule(request(4), 0.0)
    assert not d.admitted and "KV room" in d.reason


def test_commit_books_queue_and_decode() -> None:
    c = cluster(prefill=2)
    sched = Scheduler(c, make_policy("least-load"))
    req = request(8)
    d = sched.schedule(req, 1.0)
    sched.commit(d, req, 1.0)
    inst = c.by_name[d.prefill]
    assert inst.queued == 1 and inst.busy_until == pytest.approx(1.0 + d.placement.chosen.ttft_s)
    assert c.by_name["d0"].batch == 1 and c.by_name["d0"].context_tokens == 8 * BLOCK + 100
    assert sched.schedule(req, 1.0).prefill != d.prefill  # now the other one is less loaded


def test_pipeline_time_and_policy() -> None:
    m = paper()
    n = 64 * BLOCK
    hand = m.handoff_s_per_token
    assert hand > 0
    assert pipeline_time(m, n, 0, 1, 2048) == pytest.approx(m.prefill_time(n))  # no hand-off
    # one chunk: the stages run one after the other; the lead hands it on, then 3 stages do
    assert pipeline_time(m, n, 0, 4, n) == pytest.approx(m.prefill_time(n) + 4 * n * hand)
    assert pipeline_time(m, n, 0, 2, 2048) < 0.6 * m.prefill_time(n)
    c = cluster(prefill=4)
    long = request(64)
    sched = Scheduler(c, PipelinePolicy())
    d = sched.schedule(long, 0.0, explain=True)
    assert d.placement.chosen.stages == ("p1",) and d.placement.chosen.instance == "p0"
    single = make_policy("kvcache-centric").place(long, c, 0.0).chosen
    assert d.placement.chosen.ttft_s < 0.7 * single.ttft_s
    sched.commit(d, long, 0.0)
    assert c.by_name["p0"].busy_until == c.by_name["p1"].busy_until > 0
    assert sched.schedule(request(2, "short"), 0.0).placement.chosen.stages == ()
    for inst in c.prefill:
        inst.busy_until = 1.0
    assert sched.schedule(long, 0.0).placement.chosen.stages == ()  # nobody idle


def test_online_cost_model_learns_the_stage_hand_off() -> None:
    m = OnlineCostModel(block_tokens=BLOCK, kv_bytes_per_token=1024, bandwidth=1e9)
    prior = m.handoff_s_per_token
    before = pipeline_time(m, 4096, 0, 2, 1024)
    for _ in range(40):  # leads report 1 ms per token handed on: 50 times the prior
        m.observe_handoff(1000, 1.0)
    assert m.handoff_s_per_token == pytest.approx(1e-3, rel=1e-3) and prior < 1e-4
    assert pipeline_time(m, 4096, 0, 2, 1024) > before + 4.0  # 5120 tokens handed on
    m.observe_handoff(0, 1.0)  # nothing handed on: nothing learned
    assert m.handoff_s_per_token == pytest.approx(1e-3, rel=1e-3)


def test_online_cost_model_fits_prefill_compute_to_the_prompt_length() -> None:
    m = OnlineCostModel(block_tokens=BLOCK, kv_bytes_per_token=1024, bandwidth=1e9)

    def truth(n: int, p: int) -> float:  # attention: longer prompts cost more per token
        return 2e-3 * (n - p) + 1e-7 * (n * n - p * p)
    m.observe_prefill(1000, 0, truth(1000, 0), truth(1000, 0) + 0.05)
    m.observe_prefill(2000, 0, truth(2000, 0))
    assert m.c_lin is None  # two lengths: the per-token average still
    m.observe_prefill(4000, 1000, truth(4000, 1000))
    assert m.c_lin == pytest.approx(2e-3, rel=1e-6) and m.c_quad == pytest.approx(1e-7)
    assert m.compute_time(8000, 2000) == pytest.approx(truth(8000, 2000))
    assert m.prefill_time(8000) == pytest.approx(m.overhead_s + truth(8000, 0))
    assert OnlineCostModel(**{k: v for k, v in m.to_dict().items()}).prefill_time(5000, 100) \
        == pytest.approx(m.prefill_time(5000, 100))
    m.observe_prefill(100, 100, 1.0)  # nothing computed: nothing learned
    assert m.compute_time(8000, 2000) == pytest.approx(truth(8000, 2000))


def test_unknown_policy_and_empty_cluster() -> None:
    with pytest.raises(ConfigError, match="kvcache-centric"):
        make_policy("fastest")
    with pytest.raises(ConfigError, match="no live prefill"):
        make_policy("least-load").place(request(1), Cluster(paper()), 0.0)
    assert transfer_time(paper(), 0) == 0.0
