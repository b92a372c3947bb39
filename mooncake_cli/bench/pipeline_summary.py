"""The rows of `bench pipeline`: per (prompt length, stage count), the samples of bench/pipeline.py
reduced to means, set against the single instance's, with the checks a pipelined answer must
pass (no fallback to the lead alone, the single instance's first token)."""

from __future__ import annotations

import statistics
from typing import Any

DEFINITIONS = {
    "ttft_s": "wall time of the POST /v1/prefill call (the first token), mean of the samples",
    "ratio": "ttft_s over the 1-stage ttft_s of the same prompt length (below 1: faster)",
    "ideal_ratio": "the largest stage's share of the layers: the ratio of a pipeline whose "
                   "stages overlap perfectly and cost nothing to hand off",
    "stage_s_per_layer": "ttft_s / the layers of the largest stage (the slowest stage's "
                         "layers: 30, 15, 10 of a 30-layer model in 1, 2, 3 stages); equal "
                         "across stage counts when the pipeline scales ideally",
    "stage_us_per_layer_token": "stage_s_per_layer / the prompt's tokens, in microseconds",
    "begin_s/handoff_s/drain_s": "the lead's pipeline report: setting the stages up, writing "
                                 "and announcing its chunks, waiting for the last stage after "
                                 "its own last chunk (means)",
    "busy_cores": "CPU seconds all workers used during the call over its wall time (mean)",
    "same_first_token": "every sample's first token equals the 1-stage sample's of the same "
                        "prompt",
    "worker_warnings": "what the workers logged at WARNING or above during the calls",
}


def _mean(xs: list[float]) -> float:
    return statistics.fmean(xs) if xs else 0.0


def _row(n: int, s: int, got: list[dict[str, Any]], ranges: list[list[int]], layers: int,
         single: dict[int, int], base: float | None) -> dict[str, Any]:
    ttft = _mean([g["ttft_s"] for g in got])
    widest = max(hi - lo for lo, hi in ranges)
    fallbacks = [g["fallback"] for g in got if g["fallback"]]
    split = [g["layers"] for g in got if s > 1 and not g["fallback"] and g["layers"] != ranges]
    per_layer = ttft / widest
    return {
        "tokens": n, "stages": s, "layers": ranges, "max_stage_layers": widest,
        "ttft_s": round(ttft, 4), "ttft_samples_s": [g["ttft_s"] for g in got],
        "ratio": round(ttft / base, 4) if base else None,
        "ideal_ratio": round(widest / layers, 4),
        "stage_s_per_layer": round(per_layer, 5),
        "stage_us_per_layer_token": round(per_layer / n * 1e6, 3),
        "server_total_s": round(_mean([g["server_total_s"] or 0.0 for g in got]), 4),
        **{k: round(_mean([g[k] for g in got]), 4) for k in ("begin_s", "handoff_s",
                                                             "drain_s", "busy_cores")},
        "bytes_sent": round(_mean([g["bytes_sent"] for g in got])),
        "first_tokens": [g["first_token"] for g in got],
        "same_first_token": all(g["first_token"] == single.get(g["repeat"]) for g in got),
        "fallbacks": fallbacks,
        "worker_warnings": [w for g in got for w in g["worker_warnings"]],
        "unexpected_layers": split,  # a pipeline report's split other than the even one
    }


def summarize(samples: dict[tuple[int, int], list[dict[str, Any]]],
              ranges: dict[int, list[list[int]]], layers: int) -> dict[str, Any]:
    """{"rows": one per (tokens, stages) in run order, "ok": no fallback, every first token
    the single instance's and every split the even one, "definitions": of the row fields}."""
    rows = []
    for (n, s), got in samples.items():
        single = {g["repeat"]: g["first_token"] for g in samples.get((n, 1), [])}
        base = _mean([g["ttft_s"] for g in samples.get((n, 1), [])]) or None
        rows.append(_row(n, s, got, ranges[s], layers, single, base))
    rows.sort(key=lambda r: (r["tokens"], r["stages"]))
    ok = all(r["same_first_token"] and not r["fallbacks"] and not r["unexpected_layers"]
             for r in rows)
    return {"rows": rows, "ok": ok, "definitions": DEFINITIONS}
