"""`mooncake bench store-policy`: eviction policies on a trace's KV-block accesses, replayed
through the real store master, next to Belady's bound and the infinite-cache ceiling."""

from __future__ import annotations

from typing import Any

import typer
from rich import box
from rich.console import Console
from rich.table import Table

from mooncake_cli.commands import bench_plot
from mooncake_cli.output import Out, ProgressBars
from mooncake_cli.sim.trace import DEFAULT_TRACE, load_trace
from mooncake_cli.store.eviction.compare import compare, parse_policies, parse_shares


def _human(rep: dict[str, Any]) -> Any:
    def draw(con: Console) -> None:
        rows = rep["capacities"]
        t = Table(title=f"bench store-policy: {rep['requests']} requests, {rep['blocks']} block "
                        f"accesses, {rep['distinct_blocks']} distinct blocks",
                  title_justify="left", box=box.SIMPLE_HEAD, caption_justify="left",
                  caption="prefix-hit ratio: per request, the leading blocks found, over all "
                          "block accesses; xN: over LRU's. belady: the optimal per-block hit "
                          "ratio at that capacity, a bound on any policy's prefix-hit ratio")
        t.add_column("policy", no_wrap=True)
        for row in rows:
            t.add_column(f"{row['share']:.0%} ({row['capacity']} blocks)", justify="right",
                         no_wrap=True)
        for name in rows[0]["policies"]:
            cells = []
            for row in rows:
                r = row["policies"][name]
                x = r["vs_lru"]
                cells.append(f"{r['prefix_hit_ratio']:.3f}" +
                             (f" x{x:.2f}" if x is not None and name != "lru" else ""))
            t.add_row(name, *cells)
        t.add_row("belady (bound)", *(f"{r['belady']['block_hit_ratio']:.3f}" for r in rows))
        t.add_row("infinite cache", *(f"{rep['ceiling']['prefix_hit_ratio']:.3f}" for _ in rows))
        con.print(t)
    return draw


def store_policy(
    ctx: typer.Context,
    trace_file: str = typer.Option(DEFAULT_TRACE, "--trace", metavar="FILE", help="Mooncake-"
                                   "format JSONL trace (hash_ids of 512-token blocks; .gz read "
                                   "as gzip), or 'conversation': the FAST'25 conversation "
                                   "trace shipped with mooncake-cli."),
    policy: str = typer.Option(None, "--policy", help="all (default: lru, lfu, adaptive, arc, "
                               "prefix) or comma-separated policy names, plugins' included."),
    capacity: str = typer.Option(None, "--capacity", help="Capacities as shares of the "
                                 "trace's distinct blocks [default: 1%,5%,20%]."),
    limit: int = typer.Option(None, "--limit", help="Only the first N requests."),
    plot: str = bench_plot.option("the prefix-hit ratio against capacity per policy, with "
                                  "Belady's bound and the ceiling"),
) -> None:
    """Replay a trace's block accesses through the store master under each eviction policy
    and print the prefix-hit ratio per policy and capacity, next to Belady's optimal bound
    (from the future accesses) and the infinite-cache ceiling."""
    out: Out = ctx.obj
    names = parse_policies(policy)
    shares = parse_shares(capacity)
    bench_plot.check(plot)
    requests = [r.hash_ids for r in load_trace(trace_file, limit=limit)]
    if out.json:
        rep = compare(requests, names, shares)
    else:
        bars = ProgressBars(out.err)
        with bars.bar:
            rep = compare(requests, names, shares, bars)
    bench_plot.draw(out, "store-policy", rep, plot)
    out.emit(rep, _human(rep))
