"""`bench trace --simulate`: run every asked policy (and the colocated baselines) over one
trace with the same cost model, and gather the figures into one report."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from collections.abc import Callable
from typing import IO, Any

from mooncake_cli.interfaces import ConfigError
from mooncake_cli.scheduler.costmodel import CostModel, load_profile, paper
from mooncake_cli.sim.cluster import colocated, disaggregated
from mooncake_cli.sim.metrics import summarize, tbt_values, ttft_values
from mooncake_cli.sim.settings import BASELINES, SimConfig
from mooncake_cli.sim.trace import (
    TRACE_BLOCK_TOKENS,
    TraceRequest,
    load_trace,
    prefix_ceiling,
)

# progress(label, done, total)
SimProgress = Callable[[str, int, int], None]
RATIOS = (("random", "kvcache-centric"), ("least-load", "kvcache-centric"),
          ("cache-aware", "kvcache-centric"), ("kvcache-centric", "kvcache-pipeline"))


def cost_model(cfg: SimConfig, profile: str | None) -> CostModel:
    """The paper's model, or one fitted to a profile; trace blocks are 512 tokens either way."""
    if profile:
        if cfg.preset == "paper":
            raise ConfigError("--profile replaces the paper's cost model: use --preset none "
                              "with --profile")
        return dataclasses.replace(load_profile(profile), block_tokens=TRACE_BLOCK_TOKENS)
    return paper()


def _ratio(rows: dict[str, Any], a: str, b: str) -> float | None:
    if a not in rows or b not in rows:
        return None
    ma, mb = rows[a]["ttft_s"]["mean"], rows[b]["ttft_s"]["mean"]
    return round(ma / mb, 3) if ma is not None and mb else None


def simulate(cfg: SimConfig, trace: str, profile: str | None = None,
             progress: SimProgress | None = None, explain: str | None = None
             ) -> tuple[dict[str, Any], dict[str, dict[str, list[float]]]]:
    """The report, and the sorted TTFTs and TBTs of every row (`{"ttft": {row: [...]},
    "tbt": {...}}`, for plots). With `explain`, every
    decision is written to that file as a JSON line (opened once the inputs are valid)."""
    t0 = time.perf_counter()
    model = cost_model(cfg, profile)
    reqs = load_trace(trace, cfg.time_scale, cfg.limit or None)
    with contextlib.ExitStack() as stack:
        sink = stack.enter_context(open(explain, "w", encoding="utf-8")) if explain else None
        return _run(cfg, trace, model, reqs, progress, sink, t0)


def _run(cfg: SimConfig, trace: str, model: CostModel, reqs: list[TraceRequest],
         progress: SimProgress | None, explain: IO[str] | None, t0: float
         ) -> tuple[dict[str, Any], dict[str, dict[str, list[float]]]]:
    tbt = cfg.decode > 0
    limits = cfg.tbt_limits()
    rows: dict[str, Any] = {}
    ttfts: dict[str, list[float]] = {}
    tbts: dict[str, list[float]] = {}

    def bar(label: str) -> Callable[[int, int], None] | None:
        if progress is None:
            return None
        return lambda done, total: progress(label, done, total)

    for name in cfg.policies():
        sink = None
        if explain is not None:
            def sink(rec: dict[str, Any]) -> None:
                explain.write(json.dumps(rec) + "\n")
        recs, latency = disaggregated(reqs, name, model, cfg, bar(name), sink)
        rows[name] = summarize(recs, cfg.ttft_threshold, limits, tbt, latency)
        ttfts[name] = ttft_values(recs)
        if tbt:
            tbts[name] = tbt_values(recs)
    baselines: dict[str, Any] = {}
    if cfg.colocated != -1:
        for name in BASELINES:
            recs = colocated(reqs, model, cfg, "prefix" in name,
                             cfg.chunk_tokens if "chunked" in name else 0, bar(name))
            baselines[name] = summarize(recs, cfg.ttft_threshold, limits, True)
            ttfts[name] = ttft_values(recs)
            tbts[name] = tbt_values(recs)
    report = {
        "trace": trace, "requests": len(reqs), "model": model.name,
        "setup": dataclasses.asdict(cfg) | {"colocated_instances": cfg.colocated_instances(),
                                             "cache_blocks": cfg.cache_blocks(model),
                                             "kv_bytes_per_token": model.kv_bytes_per_token,
                                             "bandwidth_bytes_per_s": model.bandwidth},
        "ceiling_hit_ratio": round(prefix_ceiling(reqs), 4),
        "policies": rows, "baselines": baselines,
        "ratios": {f"{a}/{b}": r for a, b in RATIOS if (r := _ratio(rows, a, b)) is not None},
        "wall_s": round(time.perf_counter() - t0, 2),
    }
    return report, {"ttft": ttfts, "tbt": tbts}
