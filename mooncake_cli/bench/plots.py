"""Chart kinds for `mooncake bench ... --plot FILE.png`: matplotlib (the optional `plot` extra) on
the non-interactive Agg backend.

Each chart kind draws plain data onto one Axes, so a benchmark's figure (bench/plot_figures.py)
is a few of them side by side, built from the result the benchmark already printed; nothing is
measured here. `figure` and `save` wrap the pyplot calls every figure needs.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

from mooncake_cli.config import human_size
from mooncake_cli.interfaces import ConfigError

PLOT_EXTRA = "pip install 'mooncake-cli[plot]'"
Series = dict[str, list[tuple[float, float]]]  # label -> (x, y) points

# One colour per side, the same in every chart: ours, the peer, the references.
COLOURS = {"ours": "C0", "upstream": "C1", "up": "C1", "transformers": "C1", "socket": "grey",
           "memcpy": "grey", "nixl-raw": "C2", "tcp": "C4", "on": "C0", "off": "C1"}


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend, or a ConfigError naming the extra to install."""
    plt: Any = None
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot

        plt = matplotlib.pyplot
    except ImportError:
        pass
    if plt is None:  # raised outside the handler: this line, not a generic missing-module one
        raise ConfigError(f"--plot needs matplotlib: {PLOT_EXTRA}")
    return plt


def check_path(path: str) -> None:
    """Fail before a long run, not after it: matplotlib missing, not a .png, or no writable
    directory for it (created if missing)."""
    pyplot()
    if not path.lower().endswith(".png"):
        raise ConfigError(f"--plot {path}: give a file name ending in .png")
    parent = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(parent, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"--plot {path}: cannot create {parent}: {e.strerror}") from None
    if not os.access(parent, os.W_OK):
        raise ConfigError(f"--plot {path}: {parent} is not writable")


def figure(panels: int, title: str, columns: int = 3) -> tuple[Any, list[Any]]:
    """A Figure with exactly `panels` Axes, `columns` to a row, under `title`."""
    plt = pyplot()
    cols = max(1, min(panels, columns))
    rows = math.ceil(panels / cols)
    fig, grid = plt.subplots(rows, cols, figsize=(6.0 * cols, 4.5 * rows), squeeze=False)
    axes = [ax for row in grid for ax in row]
    for spare in axes[panels:]:
        fig.delaxes(spare)
    fig.suptitle(title)
    return fig, axes[:panels]


def save(fig: Any, path: str) -> None:
    """Write `fig` as a PNG and release pyplot's hold on it (the Figure stays inspectable)."""
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110, format="png")
    except OSError as e:
        raise ConfigError(f"--plot {path}: {e.strerror}") from None
    finally:
        pyplot().close(fig)


def _plain_log(axis: Any) -> None:
    """Log-scale ticks labelled as plain numbers (0.5, 20): at 1, 2, 5 x 10^k over up to three
    decades, at the powers of ten over more."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    lo, hi = sorted(axis.get_view_interval())
    wide = lo <= 0 or hi / lo > 1e3
    axis.set_major_locator(LogLocator(subs=(1.0,) if wide else (1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def _finish(ax: Any, title: str, xlabel: str, ylabel: str) -> None:
    ax.set_title(title, fontsize="medium")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    labels = ax.get_legend_handles_labels()[1]
    if labels:  # many series: two columns of smaller type, so the legend hides less
        ax.legend(fontsize="small" if len(labels) <= 6 else "x-small",
                  ncol=1 if len(labels) <= 6 else 2)


def _styles(labels: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Colour by side (a label's first word), dashes by what follows it (e.g. a batch size)."""
    rests = list(dict.fromkeys(label.partition(" ")[2] for label in labels))
    out: dict[str, dict[str, Any]] = {}
    for label in labels:
        side, _, rest = label.partition(" ")
        out[label] = {"color": COLOURS[side]} if side in COLOURS else {}
        out[label]["linestyle"] = ("-", "--", ":", "-.")[rests.index(rest) % 4]
        out[label]["marker"] = ("o", "s", "^", "D")[rests.index(rest) % 4]
    return out


def by_size(ax: Any, series: Series, ylabel: str, title: str, xlabel: str = "block size",
            log_y: bool = False) -> None:
    """A measure against a byte size (log x, labelled 4KiB, 1MiB, ...), one line per series."""
    sizes: set[float] = set()
    styles = _styles(list(series))
    for label, pts in series.items():
        pts = sorted(pts)
        sizes.update(x for x, _ in pts)
        ax.plot([x for x, _ in pts], [y for _, y in pts], label=label, **styles[label])
    ax.set_xscale("log", base=2)
    ticks = sorted(sizes)
    ax.set_xticks(ticks, [human_size(x).replace(" ", "") for x in ticks])
    ax.minorticks_off()
    if log_y:
        ax.set_yscale("log")
        _plain_log(ax.yaxis)
    _finish(ax, title, xlabel, ylabel)


def cdf(ax: Any, samples: Mapping[str, Sequence[float]], xlabel: str, title: str,
        log_x: bool = True) -> None:
    """Empirical distribution of each series' samples: the share of samples <= x."""
    for label, values in samples.items():
        vals = sorted(v for v in values if v is not None and v > 0)
        if vals:
            ax.step(vals, [(i + 1) / len(vals) for i in range(len(vals))], where="post",
                    label=label, marker="." if len(vals) < 20 else None)
    if log_x:
        ax.set_xscale("log")
        _plain_log(ax.xaxis)
    else:
        ax.set_xlim(left=0)
    ax.set_ylim(0, 1.02)
    _finish(ax, title, xlabel, "share of samples")


def over_time(ax: Any, series: Series, ylabel: str, title: str, xlabel: str,
              level: tuple[float, str] | None = None) -> None:
    """Each series against time, with an optional horizontal `level` (value, label)."""
    for label, pts in series.items():
        ax.plot([t for t, _ in pts], [v for _, v in pts], label=label)
    if level is not None:
        ax.axhline(level[0], color="black", linestyle="--", label=level[1])
    _finish(ax, title, xlabel, ylabel)


def by_share(ax: Any, shares: list[float], series: Series, ylabel: str, title: str,
             xlabel: str, bound: tuple[list[float], str] | None = None,
             level: tuple[float, str] | None = None) -> None:
    """A ratio against capacity shares (log x, labelled in %), one line per series, with an
    optional `bound` line (values, label) and horizontal `level` (value, label)."""
    xs = [s * 100 for s in shares]
    for label, pts in series.items():
        ax.plot([x * 100 for x, _ in pts], [y for _, y in pts], marker="o", label=label)
    if bound is not None:
        ax.plot(xs, bound[0], "k--", marker="^", label=bound[1])
    if level is not None:
        ax.axhline(level[0], color="grey", linestyle=":", label=level[1])
    ax.set_xscale("log")
    ax.set_xticks(xs, [f"{x:g}%" for x in xs])
    ax.minorticks_off()
    _finish(ax, title, xlabel, ylabel)


def bars(ax: Any, groups: list[str], series: dict[str, list[float | None]], ylabel: str,
         title: str, samples: dict[str, list[list[float]]] | None = None,
         stacked: bool = False, level: tuple[float, str] | None = None,
         log_y: bool = False) -> None:
    """Grouped (or stacked) bars: one bar per series in each group (None: no bar), with each
    series' individual `samples` per group as dots over its bar, and an optional `level`."""
    n = len(series)
    width = 0.8 if stacked else 0.8 / max(n, 1)
    bottom = [0.0] * len(groups)
    for i, (label, values) in enumerate(series.items()):
        heights = [math.nan if v is None else v for v in values]
        offset = 0.0 if stacked else (i - (n - 1) / 2) * width
        xs = [g + offset for g in range(len(groups))]
        ax.bar(xs, heights, width, label=label, bottom=bottom if stacked else None,
               color=COLOURS.get(label.split(" ")[0]) if not stacked else None)
        if stacked:
            bottom = [b + (0.0 if math.isnan(h) else h)
                      for b, h in zip(bottom, heights, strict=True)]
        for x, dots in zip(xs, (samples or {}).get(label) or [[]] * len(xs), strict=True):
            if dots:
                ax.plot([x] * len(dots), dots, "k.", markersize=5)
    if level is not None:
        ax.axhline(level[0], color="black", linestyle="--", label=level[1])
    ax.set_xticks(range(len(groups)), groups)
    if len(groups) > 4:
        ax.tick_params(axis="x", labelrotation=30)
        for label in ax.get_xticklabels():
            label.set_horizontalalignment("right")
    if log_y:
        ax.set_yscale("log")
        _plain_log(ax.yaxis)
    _finish(ax, title, "", ylabel)


def measured_vs_predicted(ax: Any, series: Series, title: str, unit: str = "ms") -> None:
    """Points (measured, predicted) per series on log axes, with the line of perfect fit."""
    every = [v for pts in series.values() for p in pts for v in p if v > 0]
    for label, pts in series.items():
        ax.plot([m for m, _ in pts], [p for _, p in pts], "o", label=label,
                fillstyle="none" if "held-out" in label else "full")
    if every:
        lo, hi = min(every) / 1.5, max(every) * 1.5
        ax.plot([lo, hi], [lo, hi], color="grey", linestyle=":", label="predicted = measured")
    ax.set_xscale("log")
    ax.set_yscale("log")
    _plain_log(ax.xaxis)
    _plain_log(ax.yaxis)
    _finish(ax, title, f"measured ({unit})", f"predicted ({unit})")
