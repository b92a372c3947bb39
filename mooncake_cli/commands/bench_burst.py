"""`mooncake bench burst`: N concurrent chat requests without max_tokens, every outcome counted."""

from __future__ import annotations

from typing import Any

import typer
from rich import box
from rich.console import Console
from rich.table import Table

from mooncake_cli.commands import bench_plot
from mooncake_cli.interfaces import ConfigError
from mooncake_cli.output import Out, ProgressBars


def _fmt(v: Any, digits: int = 3) -> str:
    return "-" if v is None else f"{v:.{digits}f}" if isinstance(v, float) else str(v)


def _human(rep: dict[str, Any]) -> Any:
    def draw(con: Console) -> None:
        where = rep["url"] or f"--local {rep['local']}"
        t = Table(title=f"bench burst: {rep['requests']} concurrent chats, model "
                        f"{rep['model']} ({where}), max_tokens "
                        f"{rep['max_tokens'] or 'unset'}", title_justify="left",
                  box=box.SIMPLE_HEAD, caption_justify="left",
                  caption="TTFT: the first streamed chunk; wait: time in the conductor's queue")
        cols = ["kv blocks", "answered", "429", "503", "errors", "req/s", "tok/s",
                "tok/s ÷ first", "latency p50/p99 s", "TTFT p50/p99 s", "wait p50/max s",
                "preempted", "parked", "reloaded", "recomputed tok"]
        for c in cols:
            t.add_column(c, justify="right")
        for r in rep["runs"]:
            st, d = r["statuses"], r["decode"]
            t.add_row(_fmt(r["kv_blocks"]), str(r["answered"]), str(st.get("429", 0)),
                      str(st.get("503", 0)), str(r["errors"]), _fmt(r["requests_per_s"], 2),
                      _fmt(r["tokens_per_s"], 0), _fmt(r["tokens_per_s_of_first"], 2),
                      f"{_fmt(r['latency_p50_s'], 2)}/{_fmt(r['latency_p99_s'], 2)}",
                      f"{_fmt(r['ttft_p50_s'], 2)}/{_fmt(r['ttft_p99_s'], 2)}",
                      f"{_fmt(r['queue_wait_p50_s'], 2)}/{_fmt(r['queue_wait_max_s'], 2)}",
                      str(d["preemptions"]), str(d["parked_blocks"]),
                      str(d["reloaded_blocks"]), str(d["recomputed_tokens"]))
        con.print(t)
        for r in rep["runs"]:
            if "slo" in r:
                s = r["slo"]
                con.print(f"TTFT SLO {s['ttft_s']:g} s: {s['met']} of {s['admitted']} admitted "
                          f"met it ({_fmt(s['met_fraction'], 3)}); {s['rejected']} rejected "
                          f"(Retry-After p50 {_fmt(s['rejected_retry_after_p50_s'], 1)} s)")
            if "ttft_prediction_abs_error_p50_s" in r:
                con.print(f"predicted vs actual TTFT: |error| p50 "
                          f"{r['ttft_prediction_abs_error_p50_s']:.3f} s, p90 "
                          f"{_fmt(r['ttft_prediction_abs_error_p90_s'])} s")
            for e in r["first_errors"]:
                con.print(f"[red]error:[/red] {e}")
    return draw


def burst(
    ctx: typer.Context,
    url: str = typer.Option(None, "--url", metavar="URL",
                            help="A running conductor [default: start `conductor start "
                                 "--local` in a child process]."),
    local: str = typer.Option("1,1", "--local", metavar="P,D",
                              help="Prefill and decode workers of the local cluster."),
    model: str = typer.Option("demo", "--model", metavar="NAME|FILE|DIR",
                              help="Model of the local cluster."),
    requests: int = typer.Option(1000, "--requests", "-n", min=1,
                                 help="Requests, all sent at once."),
    max_tokens: int = typer.Option(None, "--max-tokens", min=1,
                                   help="max_tokens of each request [default: unset, as "
                                        "most clients send]."),
    ttft_slo: float = typer.Option(0.0, "--ttft-slo", min=0.0,
                                   help="TTFT SLO of the local conductor, seconds (0: none)."),
    kv_blocks: str = typer.Option("512", "--kv-blocks", metavar="N[,N...]",
                                  help="KV blocks per local worker; several sizes run the "
                                       "same burst at each (a small one to force preemption)."),
    threads: int = typer.Option(0, "--threads", min=0,
                                help="OMP threads of the local cluster (0: torch's default)."),
    api_key: str = typer.Option(None, "--api-key", envvar="OPENAI_API_KEY",
                                help="Bearer key of a conductor started with --api-key."),
    timeout: float = typer.Option(900.0, "--timeout", min=1.0,
                                  help="Seconds one request may take."),
    clients: int = typer.Option(4, "--clients", min=1,
                                help="Load-generating processes the requests are spread over."),
    warmup: int = typer.Option(8, "--warmup", min=0,
                               help="Short requests sent one by one before the burst, so the "
                                    "conductor's cost model has seen the workers."),
    plot: str = bench_plot.option("the outcomes, latency percentiles and tokens/s of each "
                                  "run"),
) -> None:
    """Concurrent chat requests without max_tokens: answered, 429, 503, throughput, latency."""
    from mooncake_cli.bench.burst import BurstConfig, run

    out: Out = ctx.obj
    try:
        sizes = tuple(int(x) for x in kv_blocks.split(",") if x.strip())
        if not sizes or min(sizes) < 1:
            raise ValueError
    except ValueError:
        raise ConfigError(f"--kv-blocks {kv_blocks!r}: use N or N,N,... (blocks >= 1)") from None
    cfg = BurstConfig(url or "", local, model, requests, max_tokens, ttft_slo, sizes, threads,
                      api_key or "", timeout, warmup, clients)
    bench_plot.check(plot)
    if out.json:
        rep = run(cfg, lambda *_: None)
    else:
        bars = ProgressBars(out.err)
        with bars.bar:
            rep = run(cfg, bars)
    bench_plot.draw(out, "burst", rep, plot)
    out.emit(rep, _human(rep))
