"""Decode placement counts what it has just placed: a burst decided in a row spreads over idle
decode instances, a load report measured before the bookings does not erase them, and a
released booking frees its instance again. The live conductor's parts: Bookings, Instances
(load reports as registrations carry them) and the scheduler with the online cost model."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest

from mooncake_cli.conductor.bookings import Bookings
from mooncake_cli.conductor.instances import Instances
from mooncake_cli.conductor.live_metrics import ConductorMetrics
from mooncake_cli.scheduler.costmodel import paper
from mooncake_cli.scheduler.online_cost import OnlineCostModel
from mooncake_cli.scheduler.scheduler import Scheduler, make_policy
from mooncake_cli.scheduler.state import Cluster, Request

BLOCK = 16
TOTAL_BLOCKS = 512


def idle_load() -> dict[str, int]:
    return {"running": 0, "waiting": 0, "free_blocks": TOTAL_BLOCKS,
            "total_blocks": TOTAL_BLOCKS}


def live(model: object = None) -> tuple[Bookings, Instances]:
    """A conductor's bookings over 1 prefill and 2 idle decode instances (registered, with
    the load reports they send)."""
    cluster = Cluster(model or OnlineCostModel(BLOCK, 1024, 1e10))  # type: ignore[arg-type]
    instances = Instances(cluster, ttl=60.0, block_size=BLOCK)
    instances.register({"name": "p0", "role": "prefill", "url": "http://127.0.0.1:9001"})
    for i in (0, 1):
        instances.register({"name": f"d{i}", "role": "decode",
                            "url": f"http://127.0.0.1:900{i + 2}", "load": idle_load()})
    sched = Scheduler(cluster, make_policy("kvcache-centric"), grow_decode=True)
    return Bookings(sched, instances, ConductorMetrics()), instances


def burst(bookings: Bookings, count: int, start: int = 0) -> Counter[str]:
    placed: Counter[str] = Counter()
    for i in range(start, start + count):
        d = bookings.decide(Request(f"r{i}", 100, 300, tuple(range(i * 7, i * 7 + 6))))
        assert d.admitted and d.decode is not None
        placed[d.decode] += 1
    return placed


@pytest.mark.parametrize("model", [None, dataclasses.replace(paper(), block_tokens=BLOCK)],
                         ids=["online", "paper"])
def test_a_burst_spreads_over_idle_decode_instances(model: object) -> None:
    bookings, _ = live(model)
    assert burst(bookings, 20) == {"d0": 10, "d1": 10}
    d0 = bookings.scheduler.cluster.by_name["d0"]
    assert d0.booked_requests == 10 and d0.load() == 10 and d0.batch == 0  # none reported


def test_a_load_report_keeps_later_bookings() -> None:
    """Reports measured before the requests reached the workers say both are idle; the
    bookings made since still count, and a report above them counts in full."""
    bookings, instances = live()
    assert burst(bookings, 10) == {"d0": 5, "d1": 5}
    for i in (0, 1):  # the workers have not seen those requests yet
        instances.register({"name": f"d{i}", "role": "decode",
                            "url": f"http://127.0.0.1:900{i + 2}", "load": idle_load()})
    d0, d1 = (bookings.scheduler.cluster.by_name[n] for n in ("d0", "d1"))
    assert d0.load() == d1.load() == 5 and d0.held_tokens() > 0
    assert burst(bookings, 10, start=10) == {"d0": 5, "d1": 5}
    busy = {**idle_load(), "running": 30, "free_blocks": TOTAL_BLOCKS - 200}
    instances.register({"name": "d1", "role": "decode", "url": "http://127.0.0.1:9003",
                        "load": busy})  # d1 runs more than this conductor booked there
    assert d1.load() == 30 and d1.held_tokens() == 200 * BLOCK
    assert burst(bookings, 4, start=20) == {"d0": 4}


def test_released_bookings_free_their_instance() -> None:
    bookings, _ = live()
    reqs = [Request(f"r{i}", 100, 300, (i,)) for i in range(6)]
    placed = [bookings.decide(r) for r in reqs]
    on_d0 = [(d, r) for d, r in zip(placed, reqs, strict=True) if d.decode == "d0"]
    assert len(on_d0) == 3
    for d, r in on_d0:
        bookings.unbook(d, r)
    d0 = bookings.scheduler.cluster.by_name["d0"]
    assert d0.booked_requests == 0 and d0.booked_tokens == 0
    assert burst(bookings, 3, start=10) == {"d0": 3}  # d1 still holds its three
