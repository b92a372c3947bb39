"""`mooncake bench store`: put/get/batch throughput and exists/get latency of the store."""

from __future__ import annotations

from typing import Any

import typer
from rich import box
from rich.console import Console
from rich.markup import escape  # '[upstream]' in a hint is text
from rich.table import Table

from mooncake_cli.bench.store import BenchStoreConfig, Report, run
from mooncake_cli.commands import bench_plot
from mooncake_cli.commands import common as c
from mooncake_cli.config import human_size, load
from mooncake_cli.heap import tune_heap
from mooncake_cli.output import Out, ProgressBars
from mooncake_cli.registry import Registry


def _fmt(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _num(x: float | None) -> str:
    """Short numbers: 41.2, 950, 12.3k, 264k."""
    if x is None:
        return "-"
    if x >= 1e4:
        return f"{x / 1e3:.1f}k" if x < 1e5 else f"{x / 1e3:.0f}k"
    return f"{x:.1f}" if x < 100 else f"{x:.0f}"


def _human(reports: list[Report], cfg: BenchStoreConfig) -> Any:
    def draw(con: Console) -> None:
        t = Table(title=f"bench store: {cfg.mode} mode ("
                        + ("replica in this client" if cfg.mode == "local" else
                           "replica on another client process")
                        + f"), {cfg.duration:g} s per row"
                        + (f" and side in {cfg.rounds} turns" if cfg.compare_upstream
                           and cfg.rounds > 1 else ""),
                  title_justify="left", box=box.SIMPLE_HEAD, caption_justify="left",
                  padding=(0, 1), pad_edge=False,
                  caption="GB/s = 1e9 value bytes/s; ops/s = keys/s; p50/p99 per call (µs); "
                          "ours÷: our GB/s (ops/s for exists) over upstream's; p50÷: our "
                          "p50 over upstream's (up); every row's bytes were read back and matched")
        for col in ("row", "side", "via", "GB/s", "ops/s", "p50", "p99", "ours÷", "p50÷"):
            t.add_column(col, no_wrap=True,
                         justify="left" if col in ("row", "side", "via") else "right")
        for rep in reports:
            r = rep.row
            what = f"{r.op} {human_size(r.size).replace(' ', '')}" + (
                f" x{r.batch}" if r.op != "exists" else "")
            for res in rep.results:
                ours = res.name == "ours"
                t.add_row(what, "ours" if ours else "up", res.transport,
                          "-" if r.op == "exists" else _fmt(res.gbps, 3),
                          _num(res.transfers_per_s), _num(res.p50_us), _num(res.p99_us),
                          _fmt(rep.ratio) if ours else "", _fmt(rep.p50_ratio) if ours else "")
                what = ""
        con.print(t)
        for k, v in {k: v for rep in reports for k, v in rep.skipped.items()}.items():
            con.print(f"[yellow]{k} skipped:[/yellow] {escape(v)}", soft_wrap=True)
    return draw


def store(
    ctx: typer.Context,
    mode: str = typer.Option(None, "--mode", help="local (default: one client holds the "
                             "replicas) or remote (a second client process holds them)."),
    master: str = typer.Option(None, "--master", help="HOST:PORT of a running master "
                               "[default: start one in a child process]."),
    sizes: str = typer.Option(None, "--sizes", help="Value sizes [default: "
                              "4KiB,128KiB,1MiB,4MiB]."),
    batches: str = typer.Option(None, "--batches", help="Keys per call [default: 1,16]."),
    duration: float = typer.Option(None, "--duration", help="Timed seconds per row "
                                   "[default: 2]."),
    iterations: int = typer.Option(None, "--iterations", help="Calls per row at most "
                                   "[default: 0, no limit]."),
    segment_size: str = typer.Option(None, "--segment-size", help="Memory the holding "
                                     "client contributes [default: 1GiB]."),
    compare_upstream: bool = typer.Option(None, "--compare-upstream", help="Run each row "
                                          "through upstream's mooncake_master and "
                                          "MooncakeDistributedStore (tcp) too."),
    tensor_sizes: str = typer.Option(None, "--tensor-sizes", help="bf16 tensor sizes of the "
                                     "put_tensor/get_tensor rows (batches 1 and 4; our side "
                                     "through the compat API) [default: 16MiB; '': none]."),
    rounds: int = typer.Option(None, "--rounds", help="With --compare-upstream: ours and "
                               "upstream's take turns this many times per row, each for "
                               "duration/rounds; ours÷ and p50÷ are the medians of the turns' "
                               "ratios, p50/p99 the medians of the turns' (robust to a noisy "
                               "host) [default: 3]."),
    plot: str = bench_plot.option("GB/s against value size per operation, ours beside "
                                  "upstream's with --compare-upstream"),
) -> None:
    """Measure put/get/batch GB/s and ops/s per value size, and exists / 4 KiB get latency;
    every row is read back and compared byte for byte."""
    out: Out = ctx.obj
    cfg = load(BenchStoreConfig, "bench_store", out.config_file, mode=mode, master=master,
               sizes=sizes, batches=batches, duration=duration, iterations=iterations,
               segment_size=segment_size, compare_upstream=compare_upstream,
               tensor_sizes=tensor_sizes, rounds=rounds)
    base = c.transfer_config(out)
    registry = Registry.from_env()
    tune_heap()  # its store clients read values in this process
    bench_plot.check(plot)
    if out.json:
        reports = run(cfg, base, registry, out.config_file)
    else:
        bar = ProgressBars(out.err, width=26, timed=True)
        with bar.bar:
            reports = run(cfg, base, registry, out.config_file, bar.row)
    data = {"mode": cfg.mode, "duration": cfg.duration,
            "reports": [r.to_dict() for r in reports]}
    bench_plot.draw(out, "store", data, plot)
    out.emit(data, _human(reports, cfg))
