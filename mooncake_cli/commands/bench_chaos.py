"""`mooncake bench chaos`: kill the HA store leader at random moments under load; count what
acknowledged writes lost, time the failover, and put throughput with HA on vs off."""

from __future__ import annotations

from typing import Any

import typer
from rich import box
from rich.console import Console
from rich.table import Table

from mooncake_cli.bench.chaos import BenchChaosConfig, ChaosReport, run
from mooncake_cli.commands import bench_chaos_serving as serve
from mooncake_cli.commands import bench_plot
from mooncake_cli.commands import common as c
from mooncake_cli.config import human_size, load
from mooncake_cli.heap import tune_heap
from mooncake_cli.output import Out, ProgressBars
from mooncake_cli.registry import Registry


def _human(rep: ChaosReport) -> Any:
    d = rep.to_dict()

    def draw(con: Console) -> None:
        if rep.kills:
            bad = rep.lost or rep.resurrected or rep.wrong_bytes
            con.print(f"[bold]bench chaos[/bold]: leader SIGKILLed {rep.kills} times under "
                      f"put/get/remove: {rep.acked_puts} puts and {rep.acked_removes} removes "
                      f"acknowledged, {rep.in_doubt} in doubt (raised)")
            con.print(f"  [{'red' if bad else 'green'}]lost {rep.lost}, resurrected "
                      f"{rep.resurrected}, wrong bytes {rep.wrong_bytes}[/]; gets that "
                      f"answered 'not found' for an acknowledged key: {rep.misses}")
            con.print(f"  gets work again after a kill: p50 {d['recovery_p50_s']:.2f} s, "
                      f"max {d['recovery_max_s']:.2f} s")
        if rep.throughput:
            t = Table(title="put throughput, HA on vs off (same run, client with no segment, "
                            "replicas on two store nodes)", title_justify="left",
                      box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False)
            for col in ("size", "HA", "puts/s", "GB/s", "p50 µs", "p99 µs", "on÷off"):
                t.add_column(col, justify="left" if col in ("size", "HA") else "right")
            for row in rep.throughput:
                for mode in ("off", "on"):
                    r = row[mode]
                    ratio = (f"{row['ops_ratio']:.2f}x puts/s, {row['p50_ratio']:.2f}x p50"
                             if mode == "on" else "")
                    t.add_row(human_size(row["size"]) if mode == "off" else "", mode,
                              f"{r['ops_per_s']:.0f}", f"{r['gb_per_s']:.3f}",
                              f"{r['p50_us']:.0f}", f"{r['p99_us']:.0f}", ratio)
            con.print(t)
    return draw


def chaos(
    ctx: typer.Context,
    kills: int = typer.Option(None, "--kills", help="Leader kills [default: 20; 0: only the "
                              "throughput rows]."),
    etcd: str = typer.Option(None, "--etcd", help="etcd://HOST:PORT to elect through "
                             "[default: start a local etcd]."),
    sizes: str = typer.Option(None, "--sizes", help="Value sizes of the throughput rows "
                              "[default: 4KiB,1MiB]."),
    duration: float = typer.Option(None, "--duration", help="Seconds per throughput row "
                                   "[default: 2]."),
    segment_size: str = typer.Option(None, "--segment-size", help="Memory each of the two "
                                     "store nodes contributes [default: 256MiB]."),
    seed: int = typer.Option(None, "--seed", help="Seed of the kill moments and the workload "
                             "[default: 0]."),
    plot: str = bench_plot.option("the recovery times after each kill and put throughput "
                                  "and latency against value size, HA on vs off (with "
                                  "--serving: the streams' outcomes, the added latency of "
                                  "moved streams, write-behind's cost)"),
    serving: bool = serve.SERVING, model: str = serve.MODEL, streams: int = serve.STREAMS,
    decode: int = serve.DECODE, kill_every: float = serve.KILL_EVERY,
    max_tokens: int = serve.MAX_TOKENS,
) -> None:
    """Kill the HA store leader (SIGKILL) at random moments under a put/get/remove workload:
    acknowledged puts lost, removed keys back, wrong bytes, time until gets work again; then
    put throughput and latency with HA on vs off. With --serving: decode workers killed
    under concurrent streams instead (request migration)."""
    out: Out = ctx.obj
    if serving:
        return serve.serving(out, model, streams, decode, kill_every, max_tokens, seed,
                             kills=kills, etcd=etcd, sizes=sizes, duration=duration,
                             segment_size=segment_size, plot=plot)
    serve.only_with_serving(model=model, streams=streams, decode=decode,
                            kill_every=kill_every, max_tokens=max_tokens)
    cfg = load(BenchChaosConfig, "bench_chaos", out.config_file, kills=kills, etcd=etcd,
               sizes=sizes, duration=duration, segment_size=segment_size, seed=seed)
    base = c.transfer_config(out)
    registry = Registry.from_env()
    tune_heap()  # its store clients read values in this process
    bench_plot.check(plot)
    if out.json:
        report = run(cfg, base, registry)
    else:
        bar = ProgressBars(out.err, width=26, timed=True)
        with bar.bar:
            report = run(cfg, base, registry, bar.row)
    data = report.to_dict()
    bench_plot.draw(out, "chaos", data, plot)
    out.emit(data, _human(report))
