"""Figures of the serving benchmarks (trace, burst, model, workers, profile, chaos --serving),
each built from the dict the command prints with --json and returned unsaved (bench/plots.py
draws the panels)."""

from __future__ import annotations

from typing import Any

from mooncake_cli.bench import plots
from mooncake_cli.bench.plots import Series


def trace(data: dict[str, Any], samples: dict[str, dict[str, list[float]]] | None = None) -> Any:
    """TTFT p50/p90/p99 by policy; the TTFT and TBT distributions when the run's per-request
    `samples` ({"ttft": {row: [s]}, "tbt": ...}) are given; the prefix-hit ratio over time."""
    live = "runs" in data
    rows = data["runs"] if live else {**data["policies"], **data["baselines"]}
    cdfs = [(key, what) for key, what in (("ttft", "TTFT"), ("tbt", "TBT"))
            if any((samples or {}).get(key, {}).values())]
    over = {name: [(p["t"], p["hit_ratio"]) for p in r.get("hit_over_time") or []]
            for name, r in rows.items()}
    fig, axes = plots.figure(1 + len(cdfs) + 1, f"bench trace ({'live' if live else 'simulated'})"
                             f": {data['requests']} requests, "
                             f"{data['target'] if live else data['model']}", columns=2)
    names = list(rows)
    ttft = {q: [rows[n]["ttft_s"][q] for n in names] for q in ("p50", "p90", "p99")}
    spread = [v for vs in ttft.values() for v in vs if v]
    plots.bars(axes[0], names, ttft, "TTFT (s)", "TTFT by policy",  # log: seconds to minutes
               log_y=bool(spread) and max(spread) > 20 * min(spread))
    for ax, (key, what) in zip(axes[1:1 + len(cdfs)], cdfs, strict=True):
        assert samples is not None
        plots.cdf(ax, samples[key], f"{what} (s)", f"{what} distribution")
    ceiling = None if live else (data["ceiling_hit_ratio"], "infinite cache (whole trace)")
    plots.over_time(axes[-1], over, "prefix-hit ratio (input tokens)", "prefix-hit ratio over "
                    "time", "time since the replay started (s)" if live else "simulated time (s)",
                    level=ceiling)
    return fig


def burst(data: dict[str, Any]) -> Any:
    """Per run (one per --kv-blocks size): outcomes stacked (answered, 429, 503, errors), the
    latency, TTFT and queue-wait percentiles, and generated tokens/s."""
    runs = data["runs"]
    groups = [f"{r['kv_blocks']} KV blocks" if r["kv_blocks"] else "burst" for r in runs]
    fig, axes = plots.figure(3, f"bench burst: {data['requests']} concurrent chats, "
                             f"{data['model']}, max_tokens {data['max_tokens'] or 'unset'}")
    plots.bars(axes[0], groups, {"answered": [r["answered"] for r in runs],
                                 **{s: [r["statuses"].get(s, 0) for r in runs]
                                    for s in ("429", "503")},
                                 "errors": [r["errors"] for r in runs]},
               "requests", "outcomes", stacked=True)
    figures = {"latency p50": "latency_p50_s", "latency p99": "latency_p99_s",
               "TTFT p50": "ttft_p50_s", "TTFT p99": "ttft_p99_s",
               "queue wait p50": "queue_wait_p50_s", "queue wait max": "queue_wait_max_s"}
    plots.bars(axes[1], groups, {label: [r[key] for r in runs] for label, key in figures.items()},
               "seconds", "latency of answered requests")
    plots.bars(axes[2], groups, {"tokens/s": [r["tokens_per_s"] for r in runs]},
               "generated tokens/s", "throughput")
    return fig


def model(data: dict[str, Any]) -> Any:
    """Decode tokens/s (1 stream, N together, N asking different counts) and TTFT: ours beside
    transformers on the same weights, with the memory-bandwidth limit of one stream."""
    o, t = data["ours"], data["transformers"]
    n, (lo, hi) = data["concurrency"], (min(data["mixed_tokens"]), max(data["mixed_tokens"]))
    keys = ("single_tok_s", "batch_tok_s", "mixed_tok_s")
    fig, axes = plots.figure(2, f"bench model: {data['model']}, {data['dtype']}, "
                             f"{data['threads']} thread(s)")
    plots.bars(axes[0], ["1 stream", f"{n} together", f"{n} asking {lo}-{hi}"],
               {"ours": [o[k] for k in keys], "transformers": [t[k] for k in keys]},
               "decode tokens/s", f"decode ({data['tokens']} tokens each)",
               level=(data["bandwidth_limit_tok_s"], "bandwidth limit, 1 stream"))
    plots.bars(axes[1], [f"{data['prompt_tokens']}-token prompt"],
               {"ours": [o["ttft_s"]], "transformers": [t["ttft_s"]]}, "seconds", "TTFT")
    return fig


def workers(data: dict[str, Any]) -> Any:
    """TTFT with none of the prompt cached against most of it in the store, and decode tokens/s
    one request at a time against all together: medians as bars, each measurement a dot."""
    p, b = data["prefix_reuse"], data["batching"]
    share = p["cached_blocks"] / p["blocks"]
    fig, axes = plots.figure(2, f"bench workers: {p['model'].split(':')[0]} "
                             f"({p['parameters'] / 1e6:.1f}M parameters)")
    groups = ["none cached", f"{share:.0%} of blocks cached"]
    plots.bars(axes[0], groups, {"TTFT": [p["median_cold_s"], p["median_cached_s"]]}, "seconds",
               f"prefix reuse: {p['prompt_tokens']}-token prompt",
               samples={"TTFT": [p["ttft_cold_s"], p["ttft_cached_s"]]})
    plots.bars(axes[1], ["one at a time", f"{b['requests']} together"],
               {"tokens/s": [b["tokens_per_s_alone"], b["tokens_per_s_together"]]},
               "generated tokens/s", f"continuous batching: {b['max_tokens']} tokens each",
               samples={"tokens/s": [b["tokens_per_s_alone_rounds"],
                                     b["tokens_per_s_together_rounds"]]})
    return fig


def profile(data: dict[str, Any]) -> Any:
    """Measured against predicted time for every prefill and decode point: the fitted points,
    and the held-out points between them that the fit never saw."""
    from mooncake_cli.scheduler.costmodel import profile_model

    doc = data["profile"]
    cost = profile_model(doc, data.get("output") or "profile")
    fig, axes = plots.figure(2, f"bench profile: {doc['model'].split(' ')[0]} on {doc['device']}")
    for ax, kind, unit in ((axes[0], "prefill", "prefill"), (axes[1], "decode", "decode step")):
        series: Series = {}
        for label, points in (("fitted", doc[kind]), ("held-out", doc["held_out"][kind])):
            for s in points:
                pred = (cost.prefill_time(s["input_tokens"], s["cached_tokens"]) if kind ==
                        "prefill" else cost.decode_step_time(s["batch"], s["context_tokens"]))
                series.setdefault(label, []).append((s["seconds"] * 1e3, pred * 1e3))
        err = (doc["fit_error"].get(kind) or {}).get("mean")
        plots.measured_vs_predicted(ax, series, f"{unit}" + (
            f": held-out error {err:.0%} mean" if err is not None else ""))
    return fig


def chaos_serving(data: dict[str, Any]) -> Any:
    """`bench chaos --serving`: the streams' outcomes, the added latency of each moved stream
    (its distribution), and decode tokens/s with write-behind on and off."""
    ch, wb, cfg = data["chaos"], data["write_behind"], data["config"]
    fig, axes = plots.figure(3, f"bench chaos --serving: {ch['streams']} greedy streams, "
                             f"{cfg['decode']} decode workers, {len(ch['kills'])} SIGKILLed, "
                             f"{ch['migrations']} migrations ({data['model']})")
    plots.bars(axes[0], ["streams"], {"identical": [ch["identical"]],
                                      "other text": [ch["differs"]],
                                      "failed": [ch["errors"]]},
               "streams", "outcomes against the clean run", stacked=True)
    plots.cdf(axes[1], {"moved streams": ch["added_latency"].get("samples_s") or []},
              "added latency (s): largest token gap minus the clean run's",
              "added latency of a migrated stream")
    plots.bars(axes[2], ["decode tokens/s", "tokens per CPU s"],
               {"write-behind off": [wb["off"]["decode_tokens_per_s"],
                                     wb["off"]["tokens_per_cpu_s"]],
                "write-behind on": [wb["on"]["decode_tokens_per_s"],
                                    wb["on"]["tokens_per_cpu_s"]]},
               "tokens", f"write-behind's cost: ratio {wb['ratio'] or 0:.2f}, CPU ratio "
               f"{wb['cpu_ratio'] or 0:.2f}")
    return fig
