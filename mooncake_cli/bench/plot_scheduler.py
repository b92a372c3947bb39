"""The figure of `mooncake bench scheduler --plot`, from the dict its --json prints: the time of
one decision by cluster size (p50 and p99, wall clock and CPU, against the 1 ms goal) and the
prefix index's bytes per block."""

from __future__ import annotations

from typing import Any

from mooncake_cli.bench import plots


def scheduler(data: dict[str, Any]) -> Any:
    rows = data["rows"]
    groups = [f"{r['instances']:,} + {r['instances']:,}" for r in rows]
    fig, axes = plots.figure(2, f"bench scheduler: {data['policy']}, {data['model']}", 2)
    plots.bars(axes[0], groups, {label: [r[key] for r in rows] for label, key in (
        ("p50", "p50_us"), ("p99", "p99_us"), ("cpu p50", "cpu_p50_us"),
        ("cpu p99", "cpu_p99_us"))}, "µs per decision", "decision time (prefill + decode)",
        level=(1000.0, "1 ms"))
    plots.bars(axes[1], groups, {"per (instance, block) entry": [r["bytes_per_entry"]
                                                                 for r in rows],
                                 "per distinct block": [r["bytes_per_key"] for r in rows]},
               "bytes", "prefix index memory")
    for ax in axes:
        ax.set_xlabel("prefill + decode instances")
    return fig
