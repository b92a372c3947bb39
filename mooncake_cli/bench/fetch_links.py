"""Fetch or recompute on a trace replay where some prefixes live across a slow link.

The simulator (the paper's cost model, disaggregated prefill) with the prefill instances on two
racks: within a rack, links of the cost model's bandwidth; between the racks, a slow link. Every
fetch takes its pair's true bandwidth. Three ways to place the same trace:

- `bandwidth-aware`: kvcache-centric, the scheduler knowing each pair's bandwidth, as the live
  conductor does once it has measured them (conductor/links.py);
- `always-fetch`: kvcache-centric on the cost model's one bandwidth for every pair (what it
  did before it measured links): a longer prefix is fetched whenever that bandwidth says it
  pays, across the slow link too;
- `always-recompute`: cache-aware, which never fetches: each instance reuses only its own
  prefix.

`python -m mooncake_cli.bench.fetch_links [--slow-gbit 8] [--limit N]` prints the report.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from mooncake_cli.interfaces import ConfigError
from mooncake_cli.scheduler.costmodel import paper
from mooncake_cli.scheduler.links import Links
from mooncake_cli.sim.cluster import disaggregated
from mooncake_cli.sim.events import SimRecord
from mooncake_cli.sim.settings import SimConfig
from mooncake_cli.sim.trace import load_trace

MODES = ("bandwidth-aware", "always-fetch", "always-recompute")


def racks(names: list[str], fast: float, slow: float) -> Links:
    """The first half of `names` on one rack, the rest on the other: `fast` bytes/s between
    two instances of a rack, `slow` between racks."""
    links = Links()
    half = set(names[:len(names) // 2])
    for a in names:
        for b in names:
            if a != b:
                links.observe(a, b, 1 << 30, (1 << 30) / (fast if (a in half) == (b in half)
                                                          else slow))
    return links


def _row(recs: list[SimRecord], slow_pairs: set[tuple[str, str]],
         sources: dict[str, str]) -> dict[str, Any]:
    ttfts = sorted(r.ttft for r in recs if r.ttft is not None)
    fetched = [r for r in recs if r.fetched_tokens]
    across = sum((sources.get(str(r.req.index), ""), r.instance) in slow_pairs
                 for r in fetched)
    return {"mean_ttft_s": round(sum(ttfts) / len(ttfts), 4) if ttfts else None,
            "p90_ttft_s": round(ttfts[int(0.9 * (len(ttfts) - 1))], 4) if ttfts else None,
            "requests": len(ttfts), "fetched": len(fetched), "fetched_across": across}


def run(trace: str = "conversation", slow_gbit: float = 8.0, prefill: int = 16,
        limit: int = 0, time_scale: float = 2.0) -> dict[str, Any]:
    """Mean and p90 TTFT of each mode over the same requests, and how many fetched (across the
    slow link)."""
    if not slow_gbit > 0 or prefill < 2:
        raise ConfigError("the slow link needs a rate > 0 and the racks >= 2 instances")
    model = paper()
    cfg = SimConfig(prefill=prefill, decode=0, colocated=-1, limit=limit,
                    time_scale=time_scale)
    reqs = load_trace(trace, cfg.time_scale, cfg.limit or None)
    names = [f"p{j:04d}" for j in range(prefill)]
    slow = slow_gbit * 1e9 / 8
    links = racks(names, model.bandwidth, slow)
    half = len(names) // 2
    slow_pairs = {(a, b) for i, a in enumerate(names) for j, b in enumerate(names)
                  if (i < half) != (j < half)}
    rows = {}
    for mode in MODES:
        sources: dict[str, str] = {}

        def note(record: dict[str, Any], sources: dict[str, str] = sources) -> None:
            chosen = record["prefill"]
            if chosen["fetch_from"]:
                sources[record["request"]] = chosen["fetch_from"]

        policy = "cache-aware" if mode == "always-recompute" else "kvcache-centric"
        recs, _ = disaggregated(reqs, policy, model, cfg, explain=note, links=links,
                                aware=mode == "bandwidth-aware")
        rows[mode] = _row(recs, slow_pairs, sources)
    return {"trace": trace, "requests": len(reqs), "model": model.name, "prefill": prefill,
            "fast_gbyte_per_s": model.bandwidth / 1e9, "slow_gbit": slow_gbit, "rows": rows}


if __name__ == "__main__":
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--trace", default="conversation")
    args.add_argument("--slow-gbit", type=float, default=8.0)
    args.add_argument("--prefill", type=int, default=16)
    args.add_argument("--limit", type=int, default=0)
    a = args.parse_args()
    print(json.dumps(run(a.trace, a.slow_gbit, a.prefill, a.limit)))
