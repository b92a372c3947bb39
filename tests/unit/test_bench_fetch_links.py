"""The fetch-or-recompute figure's replay (bench/fetch_links.py): with a slow link between two
racks, knowing each pair's bandwidth beats fetching on the one constant and never fetching."""

from __future__ import annotations

import pytest

from mooncake_cli.bench.fetch_links import racks, run
from mooncake_cli.interfaces import ConfigError


def test_bandwidth_aware_beats_always_fetch_and_always_recompute() -> None:
    report = run(limit=1500, slow_gbit=8.0)
    rows = report["rows"]
    aware, fetch, recompute = (rows[m] for m in ("bandwidth-aware", "always-fetch",
                                                 "always-recompute"))
    assert aware["requests"] == fetch["requests"] == recompute["requests"] == 1500
    assert aware["mean_ttft_s"] < recompute["mean_ttft_s"] < fetch["mean_ttft_s"]
    assert aware["fetched"] > 0 and aware["fetched_across"] == 0  # fetches within a rack
    assert fetch["fetched_across"] > 0  # the constant says the slow link pays too
    assert recompute["fetched"] == 0


def test_racks_and_bad_input() -> None:
    links = racks(["a", "b", "c", "d"], 100.0, 1.0)
    assert links.get("a", "b") == pytest.approx(100.0)
    assert links.get("a", "c") == pytest.approx(1.0)
    assert links.get("d", "b") == pytest.approx(1.0)
    with pytest.raises(ConfigError):
        run(slow_gbit=0)
