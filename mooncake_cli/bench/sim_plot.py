"""PNG charts of a simulated run (matplotlib, an optional dependency)."""

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


def write_plots(report: dict[str, Any], ttfts: dict[str, list[float]], out_dir: str) -> list[str]:
    """ttft_cdf.png (every policy and baseline) and hit_ratio.png (policies and baselines over
    time) in `out_dir`; returns the paths written."""
    plt = require_matplotlib()
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    fig, ax = plt.subplots(figsize=(8, 5))
    for name, vals in ttfts.items():
        if vals:
            ys = [(i + 1) / len(vals) for i in range(len(vals))]
            ax.step(vals, ys, where="post", label=name)
    ax.set_xscale("log")
    ax.set_xlabel("TTFT (s)")
    ax.set_ylabel("fraction of requests")
    ax.set_title(f"TTFT CDF: {report['requests']} requests, {report['model']}")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    paths.append(os.path.join(out_dir, "ttft_cdf.png"))
    fig.savefig(paths[-1], dpi=120, bbox_inches="tight")
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(8, 5))
    for name, row in {**report["policies"], **report["baselines"]}.items():
        pts = row["hit_over_time"]
        ax.plot([p["t"] for p in pts], [p["hit_ratio"] for p in pts], label=name)
    ax.axhline(report["ceiling_hit_ratio"], color="black", linestyle="--",
               label="infinite cache (whole trace)")
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("prefix-hit ratio (input tokens)")
    ax.set_title("Prefix-hit ratio over time")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    paths.append(os.path.join(out_dir, "hit_ratio.png"))
    fig.savefig(paths[-1], dpi=120, bbox_inches="tight")
    plt.close(fig)
    return paths
