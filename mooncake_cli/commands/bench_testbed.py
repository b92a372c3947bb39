"""`mooncake bench testbed`: hosts as network namespaces joined by shaped veth links."""

from __future__ import annotations

import os
from typing import Any

import typer
from rich import box
from rich.console import Console
from rich.table import Table

from mooncake_cli.config import parse_size
from mooncake_cli.output import Out
from mooncake_cli.testbed import bed, linkbench
from mooncake_cli.testbed.state import DEFAULT_PREFIX, require
from mooncake_cli.testbed.topology import DEFAULT_HOSTS, DEFAULT_RATE

app = typer.Typer(no_args_is_help=True, help="Hosts as network namespaces joined by veth links "
                                             "shaped with tc (root only).")

COMMAND = typer.Argument(..., metavar="CMD...", help="The command and its arguments "
                         "(after --).")
HOST = typer.Argument(..., metavar="HOST", help="The host whose namespace runs the command.")
PREFIX = typer.Option(DEFAULT_PREFIX, "--prefix", help="Names the namespaces (PREFIX-HOST), "
                      "interfaces and the record /run/mooncake-testbed-PREFIX.json.")


def _status_table(st: dict[str, Any]) -> Any:
    def draw(con: Console) -> None:
        if not st["hosts"]:
            con.print(f"no testbed is up (prefix {st['prefix']})")
            for ns in st.get("stray_namespaces", []):
                con.print(f"[yellow]stray namespace:[/yellow] {ns} (`down` removes it)")
            return
        t = Table(title=f"testbed {st['prefix']}: {'up' if st['up'] else 'DAMAGED'}, made "
                        f"{st['created']}", title_justify="left", box=box.SIMPLE_HEAD)
        for col in ("host", "netns", "address", "interface", "peer", "rate", "shaped", "mtu"):
            t.add_column(col, no_wrap=True)
        for h in st["hosts"]:
            name = h["host"] + (" (forwards)" if h["forwards"] else "")
            ns = h["netns"] if h["present"] else f"{h['netns']} MISSING"
            for a in h["addresses"]:
                shaped = "-" if a["shaped_bps"] is None else (
                    "yes" if a["shaped_bps"] == a["rate_bps"] else f"{a['shaped_bps']} bit/s")
                addr = a["address"] + ("" if a["present"] else " MISSING")
                mtu = str(a["mtu"]) + ("" if a["mtu_now"] in (None, a["mtu"])
                                       else f" (now {a['mtu_now']})")
                t.add_row(name, ns, addr, a["ifname"], a["peer"], a["rate"], shaped, mtu)
                name = ns = ""
        con.print(t)
        con.print(f"{len(st['routes'])} static route(s) for hosts without a direct link")
    return draw


@app.command("up")
def up(
    ctx: typer.Context,
    hosts: str = typer.Option(str(DEFAULT_HOSTS), "--hosts", help="A count (hosts a, b, c, "
                              "...) or comma-separated names."),
    links: str = typer.Option(None, "--links", help="HOST-HOST=RATE pairs, e.g. "
                              f"'a-b=1gbit,a-c=10gbit,b-c=25gbit' [default: every pair at "
                              f"{DEFAULT_RATE}]; /mtu=N sets both ends' MTU, /mtu=N:M each "
                              "end's (a-b=1gbit/mtu=1500:1400) [default: 1500]. Hosts "
                              "without a direct link talk through others."),
    prefix: str = PREFIX,
) -> None:
    """Replace any testbed of this prefix with a new one: a namespace per host, a veth pair per
    link with a /30 from 10.77.0.0/16, htb shaping at the link rate each way, and routes."""
    out: Out = ctx.obj
    made = bed.up(bed.plan(prefix, hosts, links))
    st = bed.status(made.prefix)
    out.emit(st, _status_table(st))


@app.command("down")
def down(ctx: typer.Context, prefix: str = PREFIX) -> None:
    """Delete this prefix's namespaces (with their links and any process left in them)."""
    out: Out = ctx.obj
    gone = bed.down(prefix)
    out.event({"event": "down", "prefix": prefix, "deleted": gone},
              f"deleted {len(gone)} namespace(s)" + (f": {', '.join(gone)}" if gone else ""))


@app.command("status")
def status(ctx: typer.Context, prefix: str = PREFIX) -> None:
    """Each host's namespace and its address, interface, peer and rate per link, checked
    against what exists now."""
    out: Out = ctx.obj
    st = bed.status(prefix)
    out.emit(st, _status_table(st))


@app.command("exec", context_settings={"allow_extra_args": True,
                                       "ignore_unknown_options": True})
def exec_(
    host: str = HOST,
    command: list[str] = COMMAND,
    bind: bool = typer.Option(False, "--bind", help="Also set MOONCAKE_TRANSFER_HOST to the "
                              "host's address, so transfer engines listen on the testbed."),
    prefix: str = PREFIX,
) -> None:
    """Run a command inside HOST's namespace (it replaces this process), with
    MOONCAKE_TESTBED_HOST and MOONCAKE_TESTBED_ADDR (the host's first address) set."""
    argv, env = bed.exec_argv(require(prefix), host, list(command), bind)
    os.execvpe(argv[0], argv, {**os.environ, **env})


@app.command("transfer")
def transfer(
    ctx: typer.Context,
    rates: str = typer.Option("1gbit,10gbit,25gbit", "--rates", metavar="RATE,...",
                              help="Link rates, one 2-host testbed each."),
    duration: float = typer.Option(5.0, "--duration", help="Seconds per measurement."),
    block_size: str = typer.Option("4MiB", "--block-size", help="Bytes per request."),
    batch_size: int = typer.Option(4, "--batch-size", help="Requests per batch."),
    threads: int = typer.Option(1, "--threads", help="Threads, one outstanding batch each."),
    streams: int = typer.Option(1, "--streams", metavar="N", help="Parallel raw TCP streams (the "
                                "reference; like iperf -P)."),
    prefix: str = typer.Option("mctbx", "--prefix", help="Prefix of the testbeds it makes "
                               "(and deletes)."),
) -> None:
    """Transfer engine (tcp) against the link rate and a raw TCP stream, per link rate."""
    out: Out = ctx.obj
    rep = linkbench.run([r for r in rates.split(",") if r.strip()], prefix, duration,
                        parse_size(block_size), batch_size, threads, streams,
                        None if out.json else lambda s: out.err.print(s))
    out.emit(rep, _transfer_table(rep))


def _transfer_table(rep: dict[str, Any]) -> Any:
    def draw(con: Console) -> None:
        w = rep["workload"]
        t = Table(title=f"testbed transfer: {w['op']} {w['block']} x {w['batch_size']} over "
                        f"{w['transport']}, {w['threads']} thread(s), {w['seconds']:g} s each, "
                        f"{w['hosts']}, raw TCP: {w['raw_streams']} stream(s)",
                  title_justify="left", box=box.SIMPLE_HEAD,
                  caption=f"GB/s = 1e9 bytes/s; started {rep['started_utc']} UTC, load "
                          f"average {rep['load_average_start'][0]:.2f} (1 min) on "
                          f"{rep['cpus']} CPUs; ÷: over the link rate",
                  caption_justify="left")
        for col in ("link", "GB/s", "engine", "÷", "raw TCP", "÷", "engine÷raw", "ok"):
            t.add_column(col, justify="left" if col == "link" else "right", no_wrap=True)
        for r in rep["rows"]:
            t.add_row(r["rate"], f"{r['link_gbyte_per_s']:.3f}",
                      f"{r['engine_gbyte_per_s']:.3f}", f"{r['engine_of_rate']:.2f}",
                      f"{r['raw_gbyte_per_s']:.3f}", f"{r['raw_of_rate']:.2f}",
                      "-" if r["engine_of_raw"] is None else f"{r['engine_of_raw']:.2f}",
                      {True: "yes", False: "NO", None: "-"}[r["engine_verified"]])
        con.print(t)
    return draw
