"""`mooncake bench scheduler`: decision time p50/p99 and index memory per block, by cluster size."""

from __future__ import annotations

from typing import Any

import typer
from rich import box
from rich.console import Console
from rich.table import Table

from mooncake_cli.bench.scheduler_scale import Decide, ScaleConfig, parse_sizes, run
from mooncake_cli.commands import bench_plot
from mooncake_cli.interfaces import ConfigError
from mooncake_cli.output import Out, ProgressBars
from mooncake_cli.sim.trace import DEFAULT_TRACE


def _human(rep: dict[str, Any]) -> Any:
    def draw(con: Console) -> None:
        t = Table(title=f"bench scheduler: {rep['policy']}, {rep['model']}",
                  title_justify="left", box=box.SIMPLE_HEAD, caption_justify="left",
                  caption="N: prefill and decode instances each; µs per decision, booked "
                          "before the next: wall clock, and the thread's CPU time; B/block: "
                          "index bytes per (instance, block) entry")
        cols = ["N", "p50", "p99", "max", "cpu p50", "cpu p99", "B/block"]
        check = any("checked" in r for r in rep["rows"])
        if check:
            cols.append("as reference")
        for c in cols:
            t.add_column(c, justify="right", no_wrap=True)
        for r in rep["rows"]:
            row = [str(r["instances"]), f"{r['p50_us']:.0f}", f"{r['p99_us']:.0f}",
                   f"{r['max_us']:.0f}", f"{r['cpu_p50_us']:.0f}", f"{r['cpu_p99_us']:.0f}",
                   f"{r['bytes_per_entry']:.0f}"]
            if check:
                row.append(f"{r['agree_with_reference']}/{r['checked']}")
            t.add_row(*row)
        con.print(t)
        for r in rep["rows"]:
            con.print(f"N={r['instances']}: {r['decisions']} decisions timed; index of "
                      f"{rep['trace_requests']} trace requests: {r['index_entries']} entries, "
                      f"{r['distinct_keys']} keys ({r['bytes_per_key']:.0f} B each), widest "
                      f"key on {r['most_holders']} instances")
    return draw


def scheduler(
    ctx: typer.Context,
    trace_file: str = typer.Option(DEFAULT_TRACE, "--trace", metavar="FILE", help="Mooncake-"
                                   "format JSONL trace whose blocks fill the index (hash_ids; "
                                   ".gz read as gzip), or 'conversation': the FAST'25 "
                                   "conversation trace shipped with mooncake-cli."),
    instances: str = typer.Option("1000,10000", "--instances", help="Cluster sizes: N "
                                  "prefill + N decode instances each, comma-separated."),
    requests: int = typer.Option(2000, "--requests", help="Timed decisions per size (drawn "
                                 "from the trace, seeded)."),
    warmup: int = typer.Option(100, "--warmup", help="Decisions made before timing starts."),
    policy: str = typer.Option("kvcache-centric", "--policy", help="Prefill policy: random, "
                               "round-robin, least-load, cache-aware, kvcache-centric or "
                               "kvcache-pipeline."),
    seed: int = typer.Option(0, "--seed", help="Seed of the block spread, queues and draw."),
    check: bool = typer.Option(False, "--check", help="Also decide each request by the "
                               "reference (every candidate scored, untimed) and count "
                               "agreements."),
    plot: str = bench_plot.option("decision time p50/p99 and index bytes per block by "
                                  "cluster size"),
) -> None:
    """Time one scheduling decision (p50/p99) at each cluster size, with a trace's blocks in
    the prefix index, and report the index's memory per block."""
    out: Out = ctx.obj
    cfg = ScaleConfig(trace_file, parse_sizes(instances), requests, warmup, policy, seed)
    bench_plot.check(plot)
    reference: Decide | None = None
    if check:
        from mooncake_cli.bench import scheduler_reference

        if policy not in scheduler_reference.COVERED:
            raise ConfigError(f"--check covers {', '.join(scheduler_reference.COVERED)}, "
                              f"not {policy}")
        reference = scheduler_reference.decide
    if out.json:
        report = run(cfg, None, reference)
    else:
        bars = ProgressBars(out.err)
        with bars.bar:
            report = run(cfg, bars, reference)
    bench_plot.draw(out, "scheduler", report, plot)
    out.emit(report, _human(report))
