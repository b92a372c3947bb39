"""Fetch or recompute on measured links: the conductor's per-pair bandwidth (conductor/links.py)
and the choice it drives (estimate.work, candidates.best_candidate), pure and deterministic."""

from __future__ import annotations

import random

import pytest

from mooncake_cli.api.roles import PrefillAnswer
from mooncake_cli.api.schema import validate
from mooncake_cli.conductor.instances import Instances
from mooncake_cli.conductor.live import Conductor
from mooncake_cli.conductor.live_metrics import ConductorMetrics
from mooncake_cli.conductor.served import ServedModel
from mooncake_cli.kvkeys import KVNamespace
from mooncake_cli.scheduler import candidates
from mooncake_cli.scheduler.costmodel import AnalyticCostModel
from mooncake_cli.scheduler.estimate import work
from mooncake_cli.scheduler.links import Links
from mooncake_cli.scheduler.scheduler import Scheduler, make_policy
from mooncake_cli.scheduler.state import Cluster, Request
from tests.unit.test_scheduler_scale import cluster, replay

GBIT = 1e9 / 8  # bytes/s


def test_a_pair_keeps_a_weighted_average_of_its_rates() -> None:
    links = Links(alpha=0.5)
    assert not links and links.get("a", "b") is None
    links.observe("a", "b", 1000, 1.0)  # the first rate is taken as it is
    assert links and links.get("a", "b") == 1000.0
    links.observe("a", "b", 3000, 1.0)
    assert links.get("a", "b") == 2000.0
    assert links.get("b", "a") is None  # each direction its own
    for bad in ((0, 1.0), (100, 0.0), (100, float("nan")), (100, float("inf"))):
        links.observe("a", "c", *bad)
    links.observe("a", "a", 100, 1.0)
    assert links.from_source("a") == {"b": 2000.0}
    assert links.to_dict() == [{"source": "a", "dest": "b", "bandwidth": 2000.0,
                                "fetches": 2}]
    links.forget("b")
    assert not links and links.to_dict() == []


def small_cluster() -> tuple[Cluster, Request]:
    """A 12-block prompt whose first 8 blocks `holder` holds; `near` and `far` hold none."""
    c = Cluster(AnalyticCostModel(bandwidth=10 * GBIT, kv_bytes_per_token=32 << 10))
    for name in ("far", "holder", "near"):
        c.add(name, "prefill")
    keys = list(range(12))
    c.index.store("holder", keys[:8])
    return c, Request("r", 12 * 512, 16, keys)


def test_recompute_over_a_slow_link_and_fetch_over_a_fast_one() -> None:
    c, req = small_cluster()
    slow, fast = work(c, req, 0, 8, 1.0, 0.1 * GBIT), work(c, req, 0, 8, 1.0, 10 * GBIT)
    assert slow.fetch_blocks == 0 and fast.fetch_blocks == 8
    assert slow.weighed is not None and fast.weighed is not None
    assert slow.weighed.recompute_s == fast.weighed.recompute_s == slow.prefill_s
    assert slow.weighed.fetch_s > slow.weighed.recompute_s  # why it recomputes
    assert fast.weighed.fetch_s == pytest.approx(fast.transfer_s + fast.prefill_s)
    assert fast.weighed.fetch_s < fast.weighed.recompute_s
    assert slow.weighed.measured and work(c, req, 0, 8, 1.0).weighed.measured is False  # type: ignore[union-attr]
    assert work(c, req, 0, 8, None).weighed is None  # no fetch weighed without a threshold


def test_the_scheduler_uses_each_pairs_measured_bandwidth() -> None:
    c, req = small_cluster()
    c.by_name["holder"].busy_until = 100.0  # its queue rules it out
    c.links.observe("holder", "far", int(0.1 * GBIT), 1.0)  # 100 Mbit
    c.links.observe("holder", "near", int(10 * GBIT), 1.0)  # 10 Gbit
    sched = Scheduler(c, make_policy("kvcache-centric"))
    d = sched.schedule(req, 0.0, explain=True)
    by = {cand.instance: cand for cand in d.placement.candidates}
    assert by["near"].fetch_blocks == 8 and by["near"].fetch_from == "holder"
    assert by["far"].fetch_blocks == 0 and by["far"].fetch_from is None
    assert d.prefill == "near" and sched.schedule(req, 0.0).placement.chosen == d.placement.chosen
    record = d.explain()
    assert record["prefill"]["fetch_or_recompute"] == {
        "fetch_s": pytest.approx(by["near"].ttft_s, abs=1e-6),
        "recompute_s": pytest.approx(by["far"].ttft_s, abs=1e-6), "bandwidth": 10 * GBIT,
        "measured": True, "choice": "fetch"}
    far = next(x for x in record["candidates"] if x["instance"] == "far")
    assert far["fetch_or_recompute"]["choice"] == "recompute"
    c.by_name["near"].busy_until = 100.0  # only the far one is left: it recomputes
    d = sched.schedule(req, 0.0)
    assert d.prefill == "far" and d.placement.chosen.fetch_blocks == 0
    assert d.placement.chosen.weighed is not None
    assert d.placement.chosen.weighed.bandwidth == 0.1 * GBIT


def test_unmeasured_pairs_use_the_cost_models_bandwidth() -> None:
    c, req = small_cluster()
    c.by_name["holder"].busy_until = 100.0
    c.links.observe("holder", "near", int(0.1 * GBIT), 1.0)  # only near measured: slow
    d = Scheduler(c, make_policy("kvcache-centric")).schedule(req, 0.0)
    assert d.prefill == "far" and d.placement.chosen.fetch_blocks == 8  # the prior: 10 Gbit
    assert d.placement.chosen.weighed is not None
    assert d.placement.chosen.weighed.measured is False


@pytest.mark.parametrize("policy", ["kvcache-centric", "kvcache-pipeline"])
@pytest.mark.parametrize("seed", [7, 8])
def test_measured_links_decide_as_the_reference(monkeypatch: pytest.MonkeyPatch, policy: str,
                                                seed: int) -> None:
    """Instances with measured links from the prefix's holders, slow and fast, mixed with
    unmeasured ones: the pruned choice is the choice of scoring every instance."""
    monkeypatch.setattr(candidates, "SMALL", 1)
    c, prompts, rng = cluster(40, 6, seed, kv_cap=6000)
    pick = random.Random(seed)
    names = [i.name for i in c.prefill]
    for _ in range(400):
        src, dst = pick.sample(names, 2)
        c.links.observe(src, dst, 1 << 30, pick.choice((0.001, 0.01, 0.1, 1.0, 100.0)))
    sched = Scheduler(c, make_policy(policy))
    fetched, _ = replay(sched, prompts, rng, 200, churn=True)
    assert fetched > 0


def test_a_prefill_answer_measures_the_link_it_fetched_over() -> None:
    """What the worker's engine read (`fetched`, per segment) counts for the pair the
    conductor chose: the holder and the instance that fetched."""
    c, req = small_cluster()
    c.by_name["holder"].busy_until = 100.0
    ns = KVNamespace("tiny", "float32", 512, 2, 2, 8)
    conductor = Conductor(ServedModel("tiny", None, ns, 1 << 16),
                          Scheduler(c, make_policy("kvcache-centric")),
                          Instances(c, 30.0, 512), ConductorMetrics())
    try:
        decision = conductor.scheduler.schedule(req, 0.0)
        assert decision.placement.chosen.fetch_from == "holder"
        answer = {"request_id": "r", "first_token": 1, "prompt_tokens": req.input_tokens,
                  "cached_tokens": 8 * 512, "fetched": [
                      {"segment": "seg-a", "bytes": 3_000_000, "seconds": 0.2},
                      {"segment": "seg-b", "bytes": 1_000_000, "seconds": 0.2}]}
        conductor.bookings.learn(decision.prefill, [str(k) for k in req.block_keys],
                                 validate(PrefillAnswer, answer), decision)
        assert c.links.get("holder", decision.prefill) == 10_000_000.0
        local = c.links.to_dict()
        c.by_name["holder"].busy_until = 0.0  # now it runs there: nothing fetched
        decision = conductor.scheduler.schedule(req, 0.0)
        assert decision.prefill == "holder" and decision.placement.chosen.fetch_from is None
        conductor.bookings.learn("holder", [str(k) for k in req.block_keys],
                                 validate(PrefillAnswer, answer), decision)
        assert c.links.to_dict() == local
    finally:
        conductor.close()
