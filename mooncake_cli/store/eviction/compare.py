"""Eviction policies side by side on one trace: each replayed through a real master
(replay.py) at capacities given as shares of the trace's distinct blocks, next to Belady's
bound and the infinite-cache ceiling (bounds.py)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from mooncake_cli.interfaces import ConfigError
from mooncake_cli.store.eviction import make_policy, policy_names
from mooncake_cli.store.eviction.bounds import belady, ceiling
from mooncake_cli.store.eviction.replay import replay

DEFAULT_POLICIES = ("lru", "lfu", "adaptive", "arc", "prefix")
DEFAULT_SHARES = (0.01, 0.05, 0.20)

Progress = Callable[[str, int, int], None]  # (label, requests done, requests)


def parse_policies(text: str | None) -> list[str]:
    """`all` / None: the built-ins; else comma-separated names make_policy knows."""
    if not text or text == "all":
        return list(DEFAULT_POLICIES)
    names = [n.strip() for n in text.split(",") if n.strip()]
    for n in names:
        make_policy(n)  # ConfigError naming the known ones
    if not names:
        raise ConfigError(f"--policy takes names from: all, {', '.join(policy_names())}")
    return names


def parse_shares(text: str | None) -> list[float]:
    """'1%,5%,20%' (or 0.01,0.05,0.2) as fractions in (0, 1]."""
    if not text:
        return list(DEFAULT_SHARES)
    out = []
    for part in text.split(","):
        p = part.strip()
        try:
            v = float(p[:-1]) / 100 if p.endswith("%") else float(p)
        except ValueError:
            raise ConfigError(f"--capacity: {p!r} is not a share like 5% or 0.05") from None
        if not 0 < v <= 1:
            raise ConfigError(f"--capacity: {p!r} must be above 0 and at most 100%")
        out.append(v)
    return out


def _step(progress: Progress | None, label: str) -> Callable[[int, int], None] | None:
    if progress is None:
        return None
    return lambda done, total: progress(label, done, total)


def compare(requests: Sequence[Sequence[int]], policies: Sequence[str],
            shares: Sequence[float], progress: Progress | None = None) -> dict[str, Any]:
    """The report: per capacity, each policy's outcome, Belady's and the ceiling's, with
    ratios of each policy's prefix-hit ratio to LRU's and to Belady's bound."""
    distinct = len({h for ids in requests for h in ids})
    top = ceiling(requests)
    rows = []
    for share in shares:
        cap = max(1, int(share * distinct))
        bound = belady(requests, cap)
        results = {}
        for name in policies:
            out = replay(requests, name, cap, _step(progress, f"{name} @ {share:.0%}"))
            results[name] = out.to_dict()
        lru = results.get("lru", {}).get("prefix_hit_ratio")
        for r in results.values():
            r["vs_lru"] = r["prefix_hit_ratio"] / lru if lru else None
            r["vs_belady"] = (r["prefix_hit_ratio"] / bound.block_hit_ratio
                              if bound.block_hit_ratio else None)
        rows.append({"share": share, "capacity": cap, "policies": results,
                     "belady": bound.to_dict()})
    return {"requests": len(requests), "blocks": top.blocks, "distinct_blocks": distinct,
            "ceiling": top.to_dict(), "capacities": rows}
