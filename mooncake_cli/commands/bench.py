"""`mooncake bench`: measure each layer against its peer or physical limit."""

from __future__ import annotations

from typing import Any

import typer
from rich import box
from rich.console import Console
from rich.markup import escape  # '[upstream]' in a hint is text
from rich.table import Table

from mooncake_cli.bench.session import Report, check_mode, run
from mooncake_cli.bench.transfer import BenchTransferConfig, serve
from mooncake_cli.commands import bench_plot
from mooncake_cli.commands import common as c
from mooncake_cli.config import human_size, load
from mooncake_cli.interfaces import ConfigError
from mooncake_cli.output import Out, ProgressBars
from mooncake_cli.registry import Registry

app = typer.Typer(no_args_is_help=True, help="Benchmarks, reported side by side with ratios.")


def _fmt(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _num(x: float | None) -> str:
    """Short counts: 950, 12.3k, 264k, 1.2M."""
    if x is None:
        return "-"
    for floor, div, unit in ((1e6, 1e6, "M"), (1e4, 1e3, "k")):
        if x >= floor:
            v = x / div
            return f"{v:.1f}{unit}" if v < 100 else f"{v:.0f}{unit}"
    return f"{x:.0f}"


def _human(reports: list[Report]) -> Any:
    def draw(con: Console) -> None:
        rows = []
        for rep in reports:
            w = rep.workload
            what = f"{w['op']} {human_size(w['block_size'])}"
            for r in rep.results:
                ratio = "1.00" if r.name == "ours" else _fmt(rep.ratios.get(r.name))
                rows.append([what, r.name, r.transport, _fmt(r.gbps, 3),
                             _num(r.transfers_per_s), _num(r.p50_us), _num(r.p99_us),
                             {True: "yes", False: "NO", None: "-"}[r.verified], ratio])
                what = ""
        w = reports[0].workload
        t = Table(title=f"bench transfer: {w['mode']} mode, target {w['target']}, batch "
                        f"{w['batch_size']}, {w['threads']} thread(s), {w['duration']:g} s each",
                  title_justify="left", box=box.SIMPLE_HEAD,
                  caption="GB/s = 1e9 bytes/s; p50/p99: per batch (per block for references),"
                          " µs; ours÷: our GB/s over the row's", caption_justify="left")
        for col in ("workload", "row", "via", "GB/s", "xfer/s", "p50", "p99", "ok", "ours÷"):
            t.add_column(col, no_wrap=True,
                         justify="left" if col in ("workload", "row", "via") else "right")
        for row in rows:
            t.add_row(*row)
        con.print(t)
        skipped = {k: v for rep in reports for k, v in rep.skipped.items()}
        for k, v in skipped.items():
            con.print(f"[yellow]{k} skipped:[/yellow] {escape(v)}", soft_wrap=True)
    return draw


@app.command("transfer")
def transfer(
    ctx: typer.Context,
    mode: str = typer.Option(None, "--mode", help="local (default: target in a child "
                             "process), initiator (needs --target) or target."),
    transport: str = c.TRANSPORT, metadata: str = c.METADATA,
    op: str = typer.Option(None, "--op", help="write (default) or read."),
    block_size: str = typer.Option(None, "--block-size", help="Bytes per request "
                                   "[default: 64KiB]."),
    batch_size: int = typer.Option(None, "--batch-size", help="Requests per batch "
                                   "[default: 1]."),
    threads: int = typer.Option(None, "--threads", help="Threads, one outstanding batch "
                                "each [default: 1]."),
    duration: float = typer.Option(None, "--duration", help="Seconds per measurement "
                                   "[default: 5]."),
    buffer_size: str = typer.Option(None, "--buffer-size", help="Bytes registered on each "
                                    "side [default: 256MiB]."),
    target: str = typer.Option(None, "--target", help="Segment to measure (initiator mode)."),
    secret: str = c.SECRET,
    encrypt: bool = typer.Option(None, "--encrypt", help="TLS 1.3 on the tcp transport, bound "
                                 "to --secret (both sides) [default: off]."),
    compare_upstream: bool = typer.Option(None, "--compare-upstream", help="Also run the "
                                          "workload through the upstream wheel (local mode)."),
    sweep: str = typer.Option(None, "--sweep", help="Block sizes to run for both ops, e.g. "
                              "64KiB,1MiB,16MiB,64MiB (one table)."),
    plot: str = bench_plot.option("GB/s and p50 latency against block size, per op and row"),
) -> None:
    """Measure GB/s, transfers/s and latency of the transfer engine, next to upstream's wheel
    and the physical limit (a plain socket stream for tcp, memcpy for shm)."""
    out: Out = ctx.obj
    cfg = load(BenchTransferConfig, "bench_transfer", out.config_file, mode=mode,
               transport=transport, metadata=metadata, op=op, block_size=block_size,
               batch_size=batch_size, threads=threads, duration=duration,
               buffer_size=buffer_size, target=target, secret=secret, encrypt=encrypt,
               compare_upstream=compare_upstream)
    base = c.transfer_config(out)
    registry = Registry.from_env()
    if plot and cfg.mode == "target":
        raise ConfigError("--plot: --mode target serves a buffer and measures nothing")
    if cfg.mode == "target":
        def ready(info: dict[str, Any]) -> None:
            out.event(info, f"serving segment [bold]{info['segment']}[/bold] "
                            f"({human_size(info['size'])}, metadata {info['metadata']})\n"
                            f"  bench: mooncake bench transfer --mode initiator "
                            f"--target {info['segment']}\nCtrl-C to stop.")
        with c.stop_signals() as stop:
            serve(cfg, base, registry, ready, lambda: c.wait_for_signal(stop))
        return
    check_mode(cfg)
    bench_plot.check(plot)
    if out.json:
        reports = run(cfg, base, registry, sweep, out.config_file)
    else:
        bar = ProgressBars(out.err, width=26, timed=True)
        with bar.bar:
            reports = run(cfg, base, registry, sweep, out.config_file, bar.row)
    data = {"reports": [r.to_dict() for r in reports]}
    bench_plot.draw(out, "transfer", data, plot)
    out.emit(data, _human(reports))


from mooncake_cli.commands import bench_trace  # noqa: E402

app.command("trace")(bench_trace.trace)

from mooncake_cli.commands import bench_profile  # noqa: E402

app.command("profile")(bench_profile.profile)

from mooncake_cli.commands import bench_store  # noqa: E402

app.command("store")(bench_store.store)

from mooncake_cli.commands import bench_workers  # noqa: E402

app.command("workers")(bench_workers.workers)

from mooncake_cli.commands import bench_model  # noqa: E402

app.command("model")(bench_model.model)

from mooncake_cli.commands import bench_store_policy  # noqa: E402

app.command("store-policy")(bench_store_policy.store_policy)

from mooncake_cli.commands import bench_burst  # noqa: E402

app.command("burst")(bench_burst.burst)

from mooncake_cli.commands import bench_chaos  # noqa: E402

app.command("chaos")(bench_chaos.chaos)

from mooncake_cli.commands import bench_scheduler  # noqa: E402

app.command("scheduler")(bench_scheduler.scheduler)

from mooncake_cli.commands import bench_pipeline  # noqa: E402

app.command("pipeline")(bench_pipeline.pipeline)

from mooncake_cli.commands import bench_roles  # noqa: E402

app.command("prefix-reuse")(bench_roles.prefix_reuse)
app.command("conductor-cpu")(bench_roles.conductor_cpu)

from mooncake_cli.commands import bench_testbed  # noqa: E402

app.add_typer(bench_testbed.app, name="testbed")

from mooncake_cli.commands import bench_kv_wire  # noqa: E402

app.command("kv-wire")(bench_kv_wire.kv_wire)
