"""Latency figures from a Prometheus histogram's cumulative buckets, without guessing inside a
bucket: the share of observations at or below a bucket bound is exact, so SLO attainment is
counted at the largest bound not above the SLO (a lower bound when the SLO is between bounds),
and a percentile is given as the smallest bound it lies under."""

from __future__ import annotations

import math
from dataclasses import dataclass

from mooncake_cli.top.scrape import Samples, total


@dataclass
class LatencySlo:
    """One latency (TTFT or TBT) of answered requests: how many, their mean, the bucket bound
    their 99th percentile lies under and, with an SLO, the share within `bound_s`."""

    slo_s: float | None
    count: float
    mean_s: float | None
    p99_under_s: float | None
    bound_s: float | None = None  # the largest bucket bound <= slo_s
    attained_ratio: float | None = None  # observations <= bound_s, of all


def buckets(samples: Samples, name: str) -> list[tuple[float, float]]:
    """(upper bound, cumulative count) of histogram `name`'s buckets, by bound."""
    out = []
    for labels, value in samples.get(name + "_bucket", []):
        try:
            out.append((float(labels.get("le", "")), value))
        except ValueError:
            continue
    return sorted(out)


def latency_slo(samples: Samples, name: str, slo_s: float | None) -> LatencySlo:
    count = total(samples, name + "_count") or 0.0
    seconds = total(samples, name + "_sum") or 0.0
    bounds = buckets(samples, name)
    p99 = next((b for b, n in bounds if n >= 0.99 * count), None) if count else None
    out = LatencySlo(slo_s, count, seconds / count if count else None,
                     p99 if p99 is None or math.isfinite(p99) else None)
    if slo_s is not None:
        under = [(b, n) for b, n in bounds if b <= slo_s]
        if under:
            out.bound_s = under[-1][0]
            out.attained_ratio = under[-1][1] / count if count else None
    return out
