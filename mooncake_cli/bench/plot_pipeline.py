"""The figure of `bench pipeline`, built from the dict it prints with --json: TTFT and the stage
time per layer (per token) by prompt length, one bar per stage count, each sample a dot."""

from __future__ import annotations

from typing import Any

from mooncake_cli.bench import plots


def pipeline(data: dict[str, Any]) -> Any:
    rows = {(r["tokens"], r["stages"]): r for r in data["rows"]}
    lengths = sorted({n for n, _ in rows})
    counts = sorted({s for _, s in rows})
    groups = [f"{n} tokens" for n in lengths]
    label = {s: f"{s} stage{'s' if s > 1 else ''}" for s in counts}

    def each(r: dict[str, Any], x: float, per_layer: bool) -> float:
        """TTFT `x` of row `r`, or its stage time per layer per token in µs."""
        return x / r["max_stage_layers"] / r["tokens"] * 1e6 if per_layer else x

    def bars(per_layer: bool) -> tuple[dict[str, Any], dict[str, list[list[float]]]]:
        means: dict[str, Any] = {label[s]: [] for s in counts}
        dots: dict[str, list[list[float]]] = {label[s]: [] for s in counts}
        for s in counts:
            for n in lengths:
                r = rows.get((n, s))
                means[label[s]].append(None if r is None else each(r, r["ttft_s"], per_layer))
                dots[label[s]].append([] if r is None else
                                      [each(r, x, per_layer) for x in r["ttft_samples_s"]])
        return means, dots

    fig, axes = plots.figure(2, f"bench pipeline: {data['model'].split(':')[0]}, "
                             f"{data['threads']} thread(s) per instance, "
                             f"{data['host']['cores']} cores")
    means, dots = bars(False)
    plots.bars(axes[0], groups, means, "seconds", "TTFT", samples=dots)
    means, dots = bars(True)
    plots.bars(axes[1], groups, means, "µs per layer per token",
               "stage time per layer (TTFT / the largest stage's layers)", samples=dots)
    return fig
