"""PNG charts of a trace replay, simulated or live (matplotlib, an optional dependency)."""

from __future__ import annotations

import os
from typing import Any

from mooncake_cli.interfaces import ConfigError


def require_matplotlib() -> Any:
    """The pyplot module on the non-interactive backend, or a ConfigError saying how to get it."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("--plot needs matplotlib, an optional dependency: "
                          "pip install matplotlib") from None
    return plt


def _cdf(plt: Any, values: dict[str, list[float]], what: str, title: str, path: str) -> None:
    fig, ax = plt.subplots(figsize=(8, 5))
    for name, vals in values.items():
        vals = sorted(vals)
        if vals:
            ys = [(i + 1) / len(vals) for i in range(len(vals))]
            ax.step(vals, ys, where="post", label=name)
    ax.set_xscale("log")
    ax.set_xlabel(f"{what} (s)")
    ax.set_ylabel("fraction of requests")
    ax.set_title(f"{what} CDF: {title}")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def write_plots(title: str, samples: dict[str, dict[str, list[float]]],
                rows: dict[str, dict[str, Any]], ceiling: float | None, out_dir: str,
                time_label: str) -> list[str]:
    """ttft_cdf.png and tbt_cdf.png (one curve per row of `samples["ttft"]` / ["tbt"]) and
    hit_ratio.png (each row's `hit_over_time`, with the infinite-cache `ceiling` when known) in
    `out_dir`; returns the paths written."""
    plt = require_matplotlib()
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for key, what in (("ttft", "TTFT"), ("tbt", "TBT")):
        if any(samples.get(key, {}).values()):
            paths.append(os.path.join(out_dir, f"{key}_cdf.png"))
            _cdf(plt, samples[key], what, title, paths[-1])
    fig, ax = plt.subplots(figsize=(8, 5))
    for name, row in rows.items():
        pts = row.get("hit_over_time") or []
        ax.plot([p["t"] for p in pts], [p["hit_ratio"] for p in pts], label=name)
    if ceiling is not None:
        ax.axhline(ceiling, color="black", linestyle="--", label="infinite cache (whole trace)")
    ax.set_xlabel(time_label)
    ax.set_ylabel("prefix-hit ratio (input tokens)")
    ax.set_title(f"Prefix-hit ratio over time: {title}")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    paths.append(os.path.join(out_dir, "hit_ratio.png"))
    fig.savefig(paths[-1], dpi=120, bbox_inches="tight")
    plt.close(fig)
    return paths
