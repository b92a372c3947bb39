"""`mooncake top`: a live terminal view of a cluster, read from its conductor."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

import typer

from mooncake_cli.interfaces import ConfigError, MooncakeError
from mooncake_cli.output import Out
from mooncake_cli.signals import StopFlag, stop_signals

if TYPE_CHECKING:  # the scrapers load when the command runs, not with every command
    from mooncake_cli.top.snapshot import ClusterSnapshot

    Snapshotter = Callable[[ClusterSnapshot | None], ClusterSnapshot]  # previous -> new

QUIT_KEYS = ("q", "Q")
STORE_METRICS = typer.Option(None, "--store-metrics", metavar="URL",
                             help="Also read a store master's metrics port (`store master "
                                  "--metrics-port`); repeatable.")


def top(
    ctx: typer.Context,
    conductor: str = typer.Option(..., "--conductor", metavar="URL",
                                  envvar="MOONCAKE_CONDUCTOR", show_envvar=True,
                                  help="The conductor, http://HOST:PORT."),
    interval: float = typer.Option(2.0, "--interval", metavar="SECONDS",
                                   help="Seconds between refreshes."),
    once: bool = typer.Option(False, "--once",
                              help="Print one snapshot and exit (with --json: one JSON "
                                   "object)."),
    api_key: str = typer.Option(None, "--api-key", envvar="OPENAI_API_KEY",
                                help="Bearer key of a conductor started with --api-key (it "
                                     "guards the instance list)."),
    store_metrics: list[str] = STORE_METRICS,
    ttft_slo: float = typer.Option(None, "--ttft-slo", metavar="SECONDS",
                                   help="Show the share of answered requests within this "
                                        "TTFT."),
    tbt_slo: float = typer.Option(None, "--tbt-slo", metavar="SECONDS",
                                  help="Show the share of token gaps within this TBT."),
    timeout: float = typer.Option(3.0, "--timeout", metavar="SECONDS",
                                  help="Seconds each endpoint gets to answer."),
) -> None:
    """Watch a cluster: instances with their load, queue and KV use; the prefix-cache hit
    ratio, cache size, evictions and bytes moved; bytes per link; preemptions; SLO
    attainment. Refreshes in place; q quits. --once --json prints one JSON snapshot; --json
    alone prints one per refresh."""
    from mooncake_cli.top.scrape import Sources, gather
    from mooncake_cli.top.snapshot import build

    out: Out = ctx.obj
    for name, v in (("--interval", interval), ("--timeout", timeout),
                    ("--ttft-slo", ttft_slo), ("--tbt-slo", tbt_slo)):
        if v is not None and not v > 0:
            raise ConfigError(f"{name} must be a positive number of seconds, got {v}")
    src = Sources(conductor, api_key or "", tuple(store_metrics or ()), timeout)

    def snapshot(previous: ClusterSnapshot | None) -> ClusterSnapshot:
        return build(gather(src), previous, ttft_slo, tbt_slo)

    if once:
        snap = snapshot(None)
        from mooncake_cli.top.view import render

        out.emit(snap.to_dict(), lambda console: console.print(render(snap)))
        return
    with stop_signals() as stop:
        if out.json:
            _stream(snapshot, interval, stop)
        else:
            _live(out, snapshot, interval, stop)


def _stream(snapshot: Snapshotter, interval: float, stop: StopFlag) -> None:
    """One JSON object per line, one line per refresh, until Ctrl-C or SIGTERM."""
    snap = None
    while True:
        snap = snapshot(snap)
        sys.stdout.write(json.dumps(snap.to_dict()) + "\n")
        sys.stdout.flush()
        if stop.wait(interval):
            return


def _live(out: Out, snapshot: Snapshotter, interval: float, stop: StopFlag) -> None:
    """The screen, redrawn every `interval` seconds until q, Ctrl-C or SIGTERM; a refresh
    that fails keeps the last figures and says why."""
    from rich.live import Live

    from mooncake_cli.top.keys import Keys
    from mooncake_cli.top.view import render

    if not out.console.is_terminal:
        raise ConfigError("the live view needs a terminal: use --once or --json in scripts")
    snap = snapshot(None)  # a conductor that cannot be read at all fails here, one line
    keys_note = f"every {interval:g} s, q quits"
    with Keys() as keys, Live(render(snap, keys_note), console=out.console, screen=True,
                              auto_refresh=False) as live:
        while keys.wait(interval, stop) not in QUIT_KEYS and not stop.wait(0):
            note = keys_note
            try:
                snap = snapshot(snap)
            except (OSError, MooncakeError) as e:
                note = f"refresh failed: {e} (showing the last figures); q quits"
            live.update(render(snap, note), refresh=True)

