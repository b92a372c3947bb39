"""The relay decision: a relay exactly when its pipelined two-hop estimate beats the direct
link by the margin, for transfers large enough."""

from __future__ import annotations

import pytest

from mooncake_cli.transfer.relay_plan import MIN_RELAY, Link, choose, two_hop_seconds

MiB = 1 << 20
GBIT, MBIT100 = 125e6, 12.5e6  # bytes per second


def test_a_slow_direct_link_goes_through_the_fast_relay() -> None:
    plan = choose(64 * MiB, Link(MBIT100, 1e-4),
                  {"b": (Link(GBIT, 1e-4), Link(GBIT, 1e-4))}, 4 * MiB)
    assert plan.via == "b"
    assert plan.relay_s["b"] < plan.direct_s / 5
    assert plan.why.startswith("through b: ")


def test_a_fast_direct_link_goes_direct() -> None:
    plan = choose(64 * MiB, Link(10 * GBIT, 1e-4),
                  {"b": (Link(GBIT, 1e-4), Link(GBIT, 1e-4))}, 4 * MiB)
    assert plan.via is None and plan.why.startswith("direct: ")


def test_the_slower_hop_sets_the_pace_and_the_best_relay_wins() -> None:
    hops = {"b": (Link(GBIT), Link(MBIT100)), "c": (Link(GBIT), Link(GBIT / 2))}
    plan = choose(64 * MiB, Link(MBIT100 * 2), hops, 4 * MiB)
    assert plan.via == "c"
    assert plan.relay_s["b"] > plan.direct_s  # b's second hop is slower than direct


def test_within_the_margin_stays_direct() -> None:
    size, chunk = 64 * MiB, 4 * MiB
    two = two_hop_seconds(size, Link(GBIT), Link(GBIT), chunk)
    assert two == pytest.approx(size / GBIT + chunk / GBIT)
    barely = Link(size / (two * 1.05))  # direct 5 % slower than the relay: under the margin
    assert choose(size, barely, {"b": (Link(GBIT), Link(GBIT))}, chunk).via is None
    clearly = Link(size / (two * 1.2))
    assert choose(size, clearly, {"b": (Link(GBIT), Link(GBIT))}, chunk).via == "b"


def test_small_transfers_and_no_relays_go_direct() -> None:
    hops = {"b": (Link(GBIT), Link(GBIT))}
    assert choose(MIN_RELAY - 1, Link(MBIT100), hops, 4 * MiB).via is None
    assert choose(64 * MiB, Link(MBIT100), {}, 4 * MiB).why == "no relay offered"
    # an unmeasured direct link (None) with a relay that works: the relay
    assert choose(MiB, None, hops, 4 * MiB).via == "b"


def test_per_chunk_round_trips_count_against_the_relay() -> None:
    size, chunk = 64 * MiB, 64 << 10  # 1024 chunks, each a 2 ms control round trip
    hops = {"b": (Link(GBIT, 2e-3), Link(GBIT, 2e-3))}
    plan = choose(size, Link(GBIT / 2, 2e-3), hops, chunk)
    assert plan.relay_s["b"] > 1024 * 2e-3 and plan.via is None
