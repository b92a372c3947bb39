"""Figures of a simulated run: TTFT and TBT percentiles, prefix-hit ratio (overall and over
time), 429s, effective request capacity under TTFT/TBT thresholds, scheduling latency."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from mooncake_cli.sim.events import SimRecord


def percentile(sorted_vals: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile of already sorted values (None when empty)."""
    if not sorted_vals:
        return None
    return sorted_vals[min(len(sorted_vals) - 1, max(0, math.ceil(q * len(sorted_vals)) - 1))]


def spread(vals: Sequence[float], digits: int = 4) -> dict[str, float | None]:
    """mean, p50, p90 and p99 of `vals`."""
    s = sorted(vals)

    def r(x: float | None) -> float | None:
        return None if x is None else round(x, digits)

    return {"mean": r(sum(s) / len(s)) if s else None, "p50": r(percentile(s, 0.5)),
            "p90": r(percentile(s, 0.9)), "p99": r(percentile(s, 0.99))}


def capacity(recs: Sequence[SimRecord], ttft_limit: float,
             tbt_limits: Sequence[float]) -> dict[str, int]:
    """Requests served within `ttft_limit` and each TBT limit (keys: TBT limit in ms)."""
    out = {}
    for limit in tbt_limits:
        ok = 0
        for r in recs:
            ttft, tbt = r.ttft, r.tbt()
            if ttft is not None and ttft <= ttft_limit and (tbt is None or tbt <= limit):
                ok += 1
        out[f"{limit * 1e3:g}ms"] = ok
    return out


def hit_over_time(recs: Sequence[SimRecord], bin_s: float) -> list[dict[str, float]]:
    """Prefix-hit ratio of the requests arriving in each `bin_s`-second window."""
    bins: dict[int, list[int]] = {}
    for r in recs:
        if r.rejected:
            continue
        b = bins.setdefault(int(r.arrival // bin_s), [0, 0])
        b[0] += r.hit_tokens
        b[1] += r.req.input_tokens
    return [{"t": k * bin_s, "hit_ratio": round(v[0] / v[1], 4)} for k, v in sorted(bins.items())
            if v[1]]


def summarize(recs: Sequence[SimRecord], ttft_limit: float, tbt_limits: Sequence[float],
              with_tbt: bool, latency: Sequence[float] = ()) -> dict[str, Any]:
    """The figures of one run (one policy or one baseline)."""
    served = [r for r in recs if not r.rejected]
    ttft = [t for t in (r.ttft for r in served) if t is not None]
    tbt = [t for t in (r.tbt() for r in served) if t is not None] if with_tbt else []
    hit = sum(r.hit_tokens for r in served)
    total = sum(r.req.input_tokens for r in served)
    span = max((r.arrival for r in recs), default=0.0) or 1.0
    out: dict[str, Any] = {
        "requests": len(recs), "served": len(served), "rejected_429": len(recs) - len(served),
        "ttft_s": spread(ttft), "tbt_s": spread(tbt) if with_tbt else None,
        "prefix_hit_ratio": round(hit / total, 4) if total else 0.0,
        "fetched_tokens": sum(r.fetched_tokens for r in served),
        "capacity": capacity(recs, ttft_limit, tbt_limits) if with_tbt else None,
        "hit_over_time": hit_over_time(recs, max(span / 30, 1.0)),
    }
    if latency:
        lat = sorted(latency)
        out["schedule_us"] = {"p50": round((percentile(lat, 0.5) or 0) * 1e6, 1),
                              "p99": round((percentile(lat, 0.99) or 0) * 1e6, 1)}
    return out


def ttft_values(recs: Sequence[SimRecord]) -> list[float]:
    return sorted(t for t in (r.ttft for r in recs) if t is not None)


def tbt_values(recs: Sequence[SimRecord]) -> list[float]:
    return sorted(t for t in (r.tbt() for r in recs if not r.rejected) if t is not None)
