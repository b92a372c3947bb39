"""ClusterSnapshot: one scrape of a cluster turned into the figures `mooncake top` shows, as
plain data (`to_dict()` is its --json form).

The four figures every dashboard shows: the prefix-cache hit ratio (the conductor's), the cache
size (blocks the conductor's index holds, KV bytes in use on the workers, bytes used in the
store), evictions (the index's, the workers' prefix blocks found evicted, the store's) and the
bytes moved between nodes (the conductor's count by path, plus the store's replica copies).
Rates per second come from the difference to the previous snapshot.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from mooncake_cli.top.histogram import LatencySlo, latency_slo
from mooncake_cli.top.scrape import Samples, Scrape, total

C, W, S = "mooncake_conductor_", "mooncake_worker_", "mooncake_store_"


@dataclass
class InstanceRow:
    """One instance: the conductor's view of its load, and its own /metrics where reachable."""

    name: str
    role: str
    url: str
    alive: bool
    dead_reason: str | None
    running: float
    waiting: float
    kv_used_blocks: float | None
    kv_total_blocks: float | None
    kv_used_ratio: float | None
    cached_blocks: float | None  # what the conductor's index says it holds
    preempted: float | None  # decode sequences preempted now
    preemptions: float | None  # since the worker started
    hit_ratio: float | None  # the worker's own prefix-cache hit ratio (None: no prompts yet)
    step_s: float | None  # its recent forward step time
    metrics_error: str | None  # why its /metrics gave nothing (None: read)


@dataclass
class Figures:
    """The four figures, cluster-wide; a part no endpoint reported is None."""

    prefix_hit_ratio: float | None
    cache_size: dict[str, float | None]
    evictions: dict[str, float | None]
    bytes_moved: dict[str, Any]  # total, by_path, rate_per_s


@dataclass
class Link:
    """KV bytes moved along one link since its sender started (`rate_per_s`: since the last
    snapshot)."""

    source: str
    target: str
    bytes: float
    rate_per_s: float | None = None


@dataclass
class Slo:
    """Admission (requests refused for the SLO, 429, or a full queue, 503) and latency
    attainment of answered requests."""

    requests: float
    rejected: float
    queue_full: float
    errors: float
    admitted_ratio: float | None
    ttft: LatencySlo
    tbt: LatencySlo


@dataclass
class ClusterSnapshot:
    conductor: str
    at: float
    policy: str
    queue: dict[str, Any]
    instances: list[InstanceRow]
    figures: Figures
    links: list[Link]
    preemptions: dict[str, float]  # total (since start), now
    slo: Slo
    stores: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return _finite(dataclasses.asdict(self))


def _finite(v: Any) -> Any:
    """JSON has no NaN or infinity: those become null."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_finite(x) for x in v]
    return v


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _sum(values: list[float | None]) -> float | None:
    found = [v for v in values if v is not None]
    return sum(found) if found else None


def _instance(raw: dict[str, Any], conductor: Samples, mine: Samples | None,
              error: str | None) -> InstanceRow:
    load = raw.get("load") if isinstance(raw.get("load"), dict) else {}
    assert isinstance(load, dict)
    name, role = str(raw.get("name")), str(raw.get("role"))
    free, blocks = _num(load.get("free_blocks")), _num(load.get("total_blocks"))
    used = blocks - free if free is not None and blocks is not None else None
    preempted = _num(load.get("preempted"))
    preemptions = _num(load.get("preemptions"))
    return InstanceRow(
        name, role, str(raw.get("url", "")), bool(raw.get("alive")), raw.get("dead_reason"),
        _num(load.get("running")) or 0.0, _num(load.get("waiting")) or 0.0, used, blocks,
        used / blocks if used is not None and blocks else None,
        total(conductor, C + "cached_blocks", name=name),
        preempted if preempted is not None else total(mine, W + "preempted"),
        preemptions if preemptions is not None else total(mine, W + "preemptions_total"),
        total(mine, W + "prefix_hit_ratio") if total(mine, W + "prompt_tokens_total") else None,
        _num(load.get("recent_step_s")), error)


def _links(scrape: Scrape, rows: list[InstanceRow]) -> list[Link]:
    out = []
    for row in rows:
        got = scrape.instances.get(row.name)
        mine = got.samples if got is not None else None
        if mine is None:
            continue
        pairs = [("store", row.name, "loaded"), (row.name, "decode", "sent"),
                 (row.name, "store", "stored")] if row.role == "prefill" else \
            [("prefill", row.name, "loaded"), (row.name, "store", "stored")]
        for src, dst, what in pairs:
            out.append(Link(src, dst, total(mine, f"{W}kv_bytes_{what}_total") or 0.0))
    for store in scrape.stores:
        copied = total(store.samples, S + "copied_bytes_total", kind="replica")
        if copied is not None:
            out.append(Link("store node", "store node", copied))
    return out


def _rates(links: list[Link], at: float, previous: ClusterSnapshot | None) -> None:
    if previous is None or at <= previous.at:
        return
    before = {(p.source, p.target): p.bytes for p in previous.links}
    for link in links:
        b = before.get((link.source, link.target))
        if b is not None:
            link.rate_per_s = max(0.0, link.bytes - b) / (at - previous.at)


def _figures(scrape: Scrape, rows: list[InstanceRow], previous: ClusterSnapshot | None
             ) -> Figures:
    c, mine = scrape.conductor, [e.samples for e in scrape.instances.values()]
    stores = [e.samples for e in scrape.stores]
    paths = {lab.get("path", ""): v for lab, v in c.get(C + "kv_bytes_moved_total", [])}
    replica = _sum([total(s, S + "copied_bytes_total", kind="replica") for s in stores])
    if replica is not None:
        paths["store_replica"] = replica
    moved = sum(paths.values())
    rate = None
    if previous is not None and scrape.at > previous.at:
        rate = max(0.0, moved - previous.figures.bytes_moved["total"]) / \
            (scrape.at - previous.at)
    cache = {"indexed_blocks": _sum([r.cached_blocks for r in rows]),
             "kv_used_bytes": _sum([total(m, W + "kv_used_bytes") for m in mine]),
             "kv_capacity_bytes": _sum([total(m, W + "kv_capacity_bytes") for m in mine]),
             "store_bytes_used": _sum([total(s, S + "bytes_used") for s in stores]),
             "store_capacity_bytes": _sum([total(s, S + "capacity_bytes") for s in stores])}
    evictions = {"index": total(c, C + "evicted_blocks_total"),
                 "workers": _sum([total(m, W + "prefix_evictions_total") for m in mine]),
                 "store": _sum([total(s, S + "evictions_total") for s in stores])}
    return Figures(total(c, C + "prefix_hit_ratio"), cache, evictions,
                   {"total": moved, "by_path": paths, "rate_per_s": rate})


def _slo(c: Samples, ttft_slo: float | None, tbt_slo: float | None) -> Slo:
    requests = total(c, C + "requests_total") or 0.0
    rejected = total(c, C + "rejected_total") or 0.0
    full = total(c, C + "queue_full_total") or 0.0
    return Slo(requests, rejected, full, total(c, C + "errors_total") or 0.0,
               1 - (rejected + full) / requests if requests else None,
               latency_slo(c, C + "ttft_seconds", ttft_slo),
               latency_slo(c, C + "tbt_seconds", tbt_slo))


def _store(endpoint: Any) -> dict[str, Any]:
    s = endpoint.samples
    return {"url": endpoint.url, "error": endpoint.error,
            "hit_ratio": total(s, S + "hit_ratio"), "objects": total(s, S + "objects"),
            "bytes_used": total(s, S + "bytes_used"),
            "capacity_bytes": total(s, S + "capacity_bytes"),
            "evictions": total(s, S + "evictions_total")}


def build(scrape: Scrape, previous: ClusterSnapshot | None = None,
          ttft_slo: float | None = None, tbt_slo: float | None = None) -> ClusterSnapshot:
    """The snapshot of `scrape`; `previous` (the last one) gives the rates, the SLOs (seconds)
    the attainment of answered requests."""
    listing = scrape.listing
    rows = []
    for raw in listing.get("instances", []):
        if isinstance(raw, dict):
            got = scrape.instances.get(str(raw.get("name")))
            rows.append(_instance(raw, scrape.conductor, got.samples if got else None,
                                  got.error if got else None))
    links = _links(scrape, rows)
    _rates(links, scrape.at, previous)
    queue = listing.get("queue") if isinstance(listing.get("queue"), dict) else {}
    preempt = {"total": sum(r.preemptions or 0.0 for r in rows),
               "now": sum(r.preempted or 0.0 for r in rows)}
    return ClusterSnapshot(scrape.conductor_url, scrape.at, str(listing.get("policy", "")),
                           dict(queue or {}), rows, _figures(scrape, rows, previous), links,
                           preempt, _slo(scrape.conductor, ttft_slo, tbt_slo),
                           [_store(e) for e in scrape.stores])
