"""`mooncake doctor`: run the checks, print them as a table (or --json), exit 1 on a failure."""

from __future__ import annotations

import os

import typer
from rich.console import Console
from rich.markup import escape

from mooncake_cli.config import TransferConfig, load, parse_size, read_toml
from mooncake_cli.config.store import StoreConfig
from mooncake_cli.doctor import GROUP_NAMES, DoctorConfig, DoctorFailed, Status
from mooncake_cli.interfaces import ConfigError
from mooncake_cli.output import Out, table

GROUP = typer.Option(None, "--group",
                     help=f"Only this check group (repeatable): {', '.join(GROUP_NAMES)}.")
RELAY = typer.Option(None, "--relay", metavar="HOST:PORT",
                     help="A host's relay (`transfer serve --relay-port`); with two or more, "
                          "the link matrix between them and MTU mismatches (repeatable).")
COLOR = {Status.OK: "green", Status.WARN: "yellow", Status.FAIL: "red", Status.SKIPPED: "dim"}


def _master(out: Out, flag: str | None) -> str:
    """--master, else [store] master from the config file or MOONCAKE_MASTER; else none."""
    if flag:
        return flag
    store = read_toml(out.config_file).get("store", {})
    if isinstance(store, dict) and store.get("master"):
        return str(store["master"])
    return os.environ.get("MOONCAKE_MASTER", "")


def doctor(
    ctx: typer.Context,
    metadata: str = typer.Option(None, "--metadata",
                                 help="Metadata URL to check: http://HOST:PORT/metadata or "
                                      "etcd://HOST:PORT[,...] [default: [transfer] metadata]."),
    master: str = typer.Option(None, "--master",
                               help="Store master to check [default: [store] master when set]."),
    peer: str = typer.Option(None, "--peer", metavar="HOST:PORT",
                             help="A `mooncake transfer serve` target to probe and measure."),
    relay: list[str] = RELAY,
    peer_mtu: int = typer.Option(0, "--peer-mtu", metavar="BYTES",
                                 help="The peer's RDMA active MTU, compared with ours."),
    device: str = typer.Option(None, "--device", metavar="NAME",
                               help="Check only this RDMA device (e.g. mlx5_0)."),
    sysfs_root: str = typer.Option("/", "--sysfs-root", metavar="DIR",
                                   help="Read sys/, proc/ and dev/ under DIR (a captured tree)."),
    segment_size: str = typer.Option(None, "--segment-size",
                                     help="Bytes this node plans to register "
                                          "[default: [store] segment_size]."),
    host: str = typer.Option(None, "--host", help="Engine listen address to check "
                                                  "[default: [transfer] host]."),
    port: int = typer.Option(None, "--port", help="Engine listen port to check "
                                                  "[default: [transfer] port]."),
    secret: str = typer.Option(None, "--secret", envvar="MOONCAKE_SECRET", show_envvar=True,
                               help="Shared secret of the master and peer."),
    timeout: float = typer.Option(3.0, "--timeout", help="Seconds per network probe."),
    group: list[str] = GROUP,
    loopback: bool = typer.Option(True, "--loopback/--no-loopback",
                                  help="Run the live loopback transfer."),
) -> None:
    """Check install, environment, metadata, master, RDMA, NIXL/UCX, memory, network and the
    links between hosts; say how to fix what is wrong. Exits 1 when a check fails."""
    from mooncake_cli.doctor.runner import run

    out: Out = ctx.obj
    unknown = [g for g in group or [] if g not in GROUP_NAMES]
    if unknown:
        raise ConfigError(f"unknown --group {', '.join(unknown)} (known: {', '.join(GROUP_NAMES)})")
    tcfg = load(TransferConfig, "transfer", out.config_file, metadata=metadata, host=host,
                port=port, secret=secret)
    scfg = load(StoreConfig, "store", out.config_file, secret=secret,
                segment_size=parse_size(segment_size) if segment_size else None)
    cfg = DoctorConfig(metadata=tcfg.metadata, master=_master(out, master), peer=peer or "",
                       relays=tuple(relay or ()), peer_mtu=peer_mtu, device=device or "",
                       root=sysfs_root,
                       segment_size=scfg.segment_size, host=tcfg.host, port=tcfg.port,
                       secret=tcfg.secret or scfg.secret, timeout=timeout, loopback=loopback)
    if out.json:
        checks = run(cfg, group or None)
    else:
        with out.err.status("checking") as spinner:
            checks = run(cfg, group or None, lambda g: spinner.update(f"checking {g}"))
    counts = {s.value: sum(c.status is s for c in checks) for s in Status}
    data = {"ok": counts["fail"] == 0, "counts": counts, "checks": [c.to_dict() for c in checks]}

    def human(c: Console) -> None:
        rows = [(x.group, escape(x.name), f"[{COLOR[x.status]}]{x.status.value}[/]",
                 escape(x.evidence) + (f"\n[bold]fix:[/bold] {escape(x.fix)}"
                                       if x.fix and x.status is not Status.OK else ""))
                for x in checks]
        c.print(table(None, ["group", "check", "status", "evidence and fix"], rows))
        c.print(", ".join(f"{n} {s}" for s, n in counts.items()))

    out.emit(data, human)
    bad = [f"{c.group}/{c.name}" for c in checks if c.status is Status.FAIL]
    if bad:
        raise DoctorFailed(f"{len(bad)} check(s) failed: {', '.join(bad)}")
