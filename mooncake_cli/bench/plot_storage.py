"""Figures of the data-path benchmarks (transfer, store, chaos, store-policy), each built from
the dict the command prints with --json and returned unsaved (bench/plots.py draws the panels)."""

from __future__ import annotations

from typing import Any

from mooncake_cli.bench import plots
from mooncake_cli.bench.plots import Series


def transfer(data: dict[str, Any]) -> Any:
    """Per op: GB/s against block size, then p50 latency against block size; one line per row
    (ours, upstream's wheel, the socket/memcpy reference, ...)."""
    reports = data["reports"]
    w = reports[0]["workload"]
    ops = list(dict.fromkeys(r["workload"]["op"] for r in reports))
    gbps: dict[str, Series] = {op: {} for op in ops}
    p50: dict[str, Series] = {op: {} for op in ops}
    for rep in reports:
        op = rep["workload"]["op"]
        for r in rep["results"]:
            gbps[op].setdefault(r["name"], []).append((r["block_size"], r["gbps"]))
            if r["p50_us"] is not None:
                p50[op].setdefault(r["name"], []).append((r["block_size"], r["p50_us"]))
    fig, axes = plots.figure(2 * len(ops), f"bench transfer: {w['transport']} ({w['mode']} "
                             f"mode), batch {w['batch_size']}, {w['threads']} thread(s)",
                             columns=len(ops))
    for i, op in enumerate(ops):
        plots.by_size(axes[i], gbps[op], "GB/s (1e9 bytes/s)", f"{op}: throughput")
        plots.by_size(axes[len(ops) + i], p50[op], "µs", f"{op}: p50 latency per batch "
                      "(per block for references)", log_y=True)
    return fig


def store(data: dict[str, Any]) -> Any:
    """One panel per operation that moves bytes (put, get, tensor puts/gets): GB/s against value
    size, one line per side and batch size."""
    per_op: dict[str, Series] = {}
    for rep in data["reports"]:
        row = rep["row"]
        if row["op"] == "exists":
            continue
        for r in rep["results"]:
            label = f"{r['name']} x{row['batch']}"
            per_op.setdefault(row["op"], {}).setdefault(label, []).append((row["size"], r["gbps"]))
    fig, axes = plots.figure(len(per_op), f"bench store: {data['mode']} mode, "
                             f"{data['duration']:g} s per row", columns=2)
    for ax, (op, series) in zip(axes, per_op.items(), strict=True):
        plots.by_size(ax, series, "GB/s (1e9 value bytes/s)", f"{op}", xlabel="value size")
    return fig


def chaos(data: dict[str, Any]) -> Any:
    """The distribution of recovery times after each leader kill (when any), then put
    throughput and latency against value size with HA off and on (when measured)."""
    kills, rows = data["kills"], data["throughput"]
    fig, axes = plots.figure(bool(kills) + 2 * bool(rows), "bench chaos: HA store leader "
                             f"SIGKILLed {kills} times; lost {data['lost']}, resurrected "
                             f"{data['resurrected']}, wrong bytes {data['wrong_bytes']}")
    if kills:
        plots.cdf(axes[0], {"gets work again": data["recovery_s"]}, "seconds after the kill",
                  f"recovery after {kills} kill(s)", log_x=False)
    if rows:
        ops: Series = {}
        lat: Series = {}
        for row in rows:
            for mode in ("off", "on"):
                r = row[mode]
                ops.setdefault(mode, []).append((row["size"], r["ops_per_s"]))
                for q in ("p50", "p99"):
                    lat.setdefault(f"{mode} {q}", []).append((row["size"], r[f"{q}_us"]))
        plots.by_size(axes[-2], ops, "puts/s", "put throughput, HA on vs off",
                      xlabel="value size")
        plots.by_size(axes[-1], lat, "µs", "put latency, HA on vs off", xlabel="value size",
                      log_y=True)
    return fig


def store_policy(data: dict[str, Any]) -> Any:
    """Prefix-hit ratio against capacity, one line per eviction policy, with Belady's bound and
    the infinite-cache ceiling."""
    rows = data["capacities"]
    shares = [r["share"] for r in rows]
    series = {name: [(r["share"], r["policies"][name]["prefix_hit_ratio"]) for r in rows]
              for name in rows[0]["policies"]}
    fig, (ax,) = plots.figure(1, f"bench store-policy: {data['requests']} requests, "
                              f"{data['distinct_blocks']} distinct blocks")
    plots.by_share(ax, shares, series, "prefix-hit ratio", "eviction policies",
                   "capacity (share of the trace's distinct blocks)",
                   bound=([r["belady"]["block_hit_ratio"] for r in rows], "belady (bound)"),
                   level=(data["ceiling"]["prefix_hit_ratio"], "infinite cache"))
    return fig
