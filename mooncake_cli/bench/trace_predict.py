"""The simulator's prediction for a live replay: the requests the live cluster served (each
synthesised prompt's length, its whole-block keys and its arrival time) through the simulated
cluster of the same shape, under the policies the live runs used, with the cost model the live
kvcache-centric run's conductor learned (`learned_model`, copied before its cluster closes).
That conductor never pipelines, so its hand-off per token is still the prior: `sim_model`
takes the hand-off the kvcache-pipeline run's conductor learned, when it pipelined any prefill.

The gain of kvcache-pipeline is `1 - mean TTFT(kvcache-pipeline) / mean TTFT(kvcache-centric)`,
simulated and live alike; `gains` puts the two side by side.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from mooncake_cli.bench.trace_live import ReplayConfig, synthesise
from mooncake_cli.conductor.seqhash import seq_hashes
from mooncake_cli.config.conductor import PIPELINE
from mooncake_cli.scheduler.online_cost import OnlineCostModel
from mooncake_cli.sim.cluster import disaggregated
from mooncake_cli.sim.metrics import summarize
from mooncake_cli.sim.settings import SimConfig
from mooncake_cli.sim.trace import TraceRequest

CENTRIC = "kvcache-centric"


def learned_model(model: object) -> dict[str, Any] | None:
    """The fields of a live conductor's learned cost model (its
    `conductor.conductor.scheduler.cluster.model`); None when it is not an OnlineCostModel
    (a profile's)."""
    if not isinstance(model, OnlineCostModel):
        return None
    return model.to_dict()


def sim_model(learned: Mapping[str, Mapping[str, Any] | None],
              runs: Mapping[str, Mapping[str, Any]]) -> dict[str, Any] | None:
    """The cost model to simulate with: kvcache-centric's learned fields, its hand-off taken
    from the kvcache-pipeline run when that ran pipelines ("handoff_from" says whose); None
    without a learned kvcache-centric model."""
    centric = learned.get(CENTRIC)
    if centric is None:
        return None
    out = dict(centric) | {"handoff_from": CENTRIC}
    piped = learned.get(PIPELINE)
    if piped is not None and runs.get(PIPELINE, {}).get("pipelined", 0) > 0:
        out |= {"handoff_s_per_token": piped["handoff_s_per_token"], "handoff_from": PIPELINE}
    return out


def sim_requests(reqs: Sequence[TraceRequest], cfg: ReplayConfig,
                 block_size: int) -> list[TraceRequest]:
    """`reqs` as the live workers see them: the synthesised prompt's length, one key per whole
    `block_size`-token block (chained, so two prompts share a key exactly when they share every
    block up to it; a partial last block is never reused live, and has no key), the output
    length the replay asks for, the same arrival time."""
    out = []
    for r in reqs:
        prompt = synthesise(r, cfg)
        out.append(TraceRequest(r.index, r.arrival, len(prompt),
                                min(max(1, r.output_tokens), cfg.max_output),
                                tuple(seq_hashes(prompt, block_size))))
    return out


def predict(reqs: Sequence[TraceRequest], cfg: ReplayConfig, learned: Mapping[str, Any],
            policies: Sequence[str], prefill: int, decode: int,
            options: Mapping[str, Any], cache_tokens: int, seed: int = 0) -> dict[str, Any]:
    """Simulate `policies` over `reqs` (as `sim_requests` makes them) on `prefill` + `decode`
    instances, each prefill instance caching `cache_tokens` tokens; kvcache-pipeline gets
    `options` (`ConductorConfig.policy_options()`). Each row: the simulator's figures plus
    the number of prefills it ran as pipelines."""
    t0 = time.perf_counter()
    model = OnlineCostModel(**{k: v for k, v in learned.items() if k != "handoff_from"})
    sim = sim_requests(reqs, cfg, model.block_tokens)
    scfg = SimConfig(preset="none", policy=",".join(policies), prefill=prefill, decode=decode,
                     colocated=-1, cache_tokens=cache_tokens, seed=seed)
    rows: dict[str, Any] = {}
    for name in scfg.policies():
        piped = [0]

        def count(rec: dict[str, Any], piped: list[int] = piped) -> None:
            piped[0] += "pipeline" in rec

        recs, _ = disaggregated(sim, name, model, scfg, None, count,
                                options if name == PIPELINE else None)
        row = summarize(recs, cfg.ttft_threshold, cfg.tbt_thresholds, True)
        rows[name] = {k: row[k] for k in ("requests", "served", "ttft_s", "tbt_s",
                                          "prefix_hit_ratio")} | {"pipelined": piped[0]}
    return {"cost_model": dict(learned), "cache_tokens": cache_tokens, "policies": rows,
            "wall_s": round(time.perf_counter() - t0, 3)}


def gain(runs: Mapping[str, Any]) -> float | None:
    """1 - mean TTFT of kvcache-pipeline / that of kvcache-centric (None without both)."""
    if PIPELINE not in runs or CENTRIC not in runs:
        return None
    a, b = runs[PIPELINE]["ttft_s"]["mean"], runs[CENTRIC]["ttft_s"]["mean"]
    return round(1 - a / b, 4) if a is not None and b else None


def gains(live: Mapping[str, Any], predicted: Mapping[str, Any]) -> dict[str, float | None]:
    """The predicted and the live gain of kvcache-pipeline, and live - predicted in points."""
    want, got = gain(predicted["policies"]), gain(live)
    diff = None if want is None or got is None else round((got - want) * 100, 2)
    return {"predicted": want, "live": got, "difference_points": diff}
