"""`mooncake transfer`: serve a segment, run a metadata server, write and read peer memory."""

from __future__ import annotations

import time
from typing import Any

import typer
from rich.markup import escape

from mooncake_cli.commands import common as c
from mooncake_cli.config import human_size, parse_size
from mooncake_cli.http.auth import require_secret
from mooncake_cli.output import Out
from mooncake_cli.registry import Registry
from mooncake_cli.transfer.batch import Op
from mooncake_cli.transfer.engine import TransferEngine
from mooncake_cli.transfer.metadata_http import MetadataServer
from mooncake_cli.transfer.relay_agent import RelayAgent
from mooncake_cli.transfer.relay_client import Relays

app = typer.Typer(no_args_is_help=True, help="Run transfer targets and move bytes between them.")


@app.command()
def serve(
    ctx: typer.Context,
    buffer_size: str = typer.Option("256MiB", "--buffer-size", help="Bytes to register."),
    host: str = c.HOST, port: int = c.PORT, advertise: str = c.ADVERTISE, name: str = c.NAME,
    metadata: str = c.METADATA, transport: str = c.TRANSPORT, secret: str = c.SECRET,
    encrypt: bool = typer.Option(None, "--encrypt", help="TLS 1.3 on every tcp connection, "
                                 "bound to the secret (needs --secret) [default: off]."),
    private: bool = typer.Option(False, "--private", help="Private memory on transparent huge "
                                 "pages instead of shared memory: same-host peers copy into it by "
                                 "the kernel (shm's cross-memory copies, or nixl's cma), 2-3x "
                                 "faster than into 4 KiB pages."),
    relay_port: int = typer.Option(None, "--relay-port", metavar="PORT", help="Also serve a "
                                   "relay on this port (0: any) of --host: other hosts stage "
                                   "transfers to a third host in its buffer (64 MiB) when "
                                   "that path is faster [default: no relay]."),
) -> None:
    """Register a zeroed buffer as a segment and serve it until Ctrl-C."""
    out: Out = ctx.obj
    cfg = c.transfer_config(out, host=host, port=port, advertise=advertise, name=name,
                            metadata=metadata, transport=transport, secret=secret,
                            encrypt=encrypt)
    require_secret(cfg.host, cfg.secret, "the transfer target")
    size = parse_size(buffer_size)
    with c.stop_signals() as stop, TransferEngine(cfg, Registry.from_env()) as engine:
        region = engine.allocate(size, shared=not private)
        agent = None if relay_port is None else RelayAgent(engine, cfg.host, relay_port,
                                                           cfg.secret or None)
        info = {"event": "ready", "segment": engine.name, "address": engine.address,
                "metadata": cfg.metadata, "offset": region.base, "size": size,
                "auth": bool(cfg.secret), "transports": sorted(engine.endpoints.by_name),
                "relay": agent.address if agent else None}
        # peers need --metadata too unless it is the p2p default, or the hints fail as shown
        reach = escape(f"--target {engine.name}" + (
            "" if cfg.metadata.strip().lower() in ("p2p", "p2phandshake", "")
            else f" --metadata {cfg.metadata}"))
        out.event(info, f"serving segment [bold]{escape(engine.name)}[/bold] "
                        f"({human_size(size)} at offset {region.base}, "
                        f"metadata {escape(cfg.metadata)}"
                        f"{', secret required' if cfg.secret else ''}; reachable over "
                        f"{', '.join(sorted(engine.endpoints.by_name))})\n"
                        f"  write: mooncake transfer write {reach} FILE\n"
                        f"  bench: mooncake bench transfer --mode initiator {reach}\n"
                        + (f"  relay: --relay {agent.address}\n" if agent else "")
                        + "Ctrl-C to stop.")
        try:
            c.wait_for_signal(stop)
        finally:
            if agent is not None:
                agent.close()
    out.event({"event": "stopped", "segment": engine.name}, "stopped; segment withdrawn")


@app.command("metadata-server")
def metadata_server(
    ctx: typer.Context,
    host: str = typer.Option("127.0.0.1", "--host", help="Listen address."),
    port: int = typer.Option(8080, "--port", help="Listen port (0 for any free port)."),
    path: str = typer.Option("/metadata", "--path", help="URL path of the key/value API."),
) -> None:
    """Serve segment descriptors over HTTP: GET/PUT/DELETE ?key=K (upstream's contract)."""
    out: Out = ctx.obj
    with c.stop_signals() as stop:
        server = MetadataServer(host, port, path).start()
        try:
            _announce_metadata(out, server)
            c.wait_for_signal(stop)
        finally:
            server.close()


def _announce_metadata(out: Out, server: MetadataServer) -> None:
    out.event({"event": "ready", "url": server.url},
              f"metadata server at [bold]{server.url}[/bold] — use --metadata {server.url}\n"
              "Ctrl-C to stop.")


def _client(out: Out, metadata: str | None, transport: str | None, secret: str | None,
            connections: int | None, timeout: float | None) -> TransferEngine:
    cfg = c.transfer_config(out, metadata=metadata, transport=transport, secret=secret,
                            connections=connections, timeout=timeout)
    return TransferEngine(cfg, Registry.from_env())


RELAY = typer.Option(None, "--relay", metavar="HOST:PORT", help="A relay (`transfer serve "
                     "--relay-port`) the transfer may go through; repeatable.")
VIA = typer.Option("auto", "--via", metavar="auto|direct|HOST:PORT", help="auto: through the "
                   "relay whose measured links beat the direct one, else direct; direct; or "
                   "through this relay.")


def _move(engine: TransferEngine, op: Op, region: Any, target: str, offset: int, n: int,
          relays: list[str], via: str) -> dict[str, Any]:
    """Move the bytes by the path `via` names; the plan (empty when no relay was given)."""
    if not relays and via == "auto":
        engine.transfer(op, region, 0, target, offset, n)
        return {}
    if via not in ("auto", "direct") and via not in relays:
        relays = [*relays, via]
    router = Relays(engine, relays, engine.config.secret or None, engine.config.timeout * 2)
    try:
        plan, _seconds = (router.write(region, 0, target, offset, n, via) if op is Op.WRITE
                         else router.read(region, 0, target, offset, n, via))
    finally:
        router.close()
    return {"path": plan.to_dict(), "relay": plan.via}


def _path(plan: dict[str, Any]) -> str:
    if not plan:
        return ""
    return f" through {plan['relay']}" if plan["relay"] else " direct"


@app.command()
def write(
    ctx: typer.Context,
    file: str = typer.Argument(..., help="File to send, or - for stdin."),
    target: str = typer.Option(..., "--target", help="Segment name of the target."),
    offset: int = typer.Option(0, "--offset", help="Offset in the target segment."),
    metadata: str = c.METADATA, transport: str = c.TRANSPORT, secret: str = c.SECRET,
    connections: int = c.CONNECTIONS, timeout: float = c.TIMEOUT,
    relay: list[str] = RELAY, via: str = VIA,
) -> None:
    """Write a file's bytes into a peer segment (through a relay when that is faster)."""
    out: Out = ctx.obj
    data = c.read_input(file)
    with _client(out, metadata, transport, secret, connections, timeout) as engine:
        region = engine.register(bytearray(data))
        t0 = time.perf_counter()
        plan = _move(engine, Op.WRITE, region, target, offset, len(data), relay or [], via)
        dt = time.perf_counter() - t0
        transport_used = engine.transport_for(target)
    out.event({"event": "written", "target": target, "offset": offset, "bytes": len(data),
               "seconds": dt, "transport": transport_used, **plan},
              f"wrote {len(data)} bytes to {escape(target)} at offset {offset} over "
              f"{transport_used}{_path(plan)} in {dt * 1e3:.2f} ms")


@app.command()
def read(
    ctx: typer.Context,
    target: str = typer.Option(..., "--target", help="Segment name of the target."),
    length: str = typer.Option(..., "--length", help="Bytes to read (e.g. 4096, 1MiB)."),
    offset: int = typer.Option(0, "--offset", help="Offset in the target segment."),
    output: str = typer.Option(..., "-o", "--output", help="File to write, or - for stdout."),
    metadata: str = c.METADATA, transport: str = c.TRANSPORT, secret: str = c.SECRET,
    connections: int = c.CONNECTIONS, timeout: float = c.TIMEOUT,
    relay: list[str] = RELAY, via: str = VIA,
) -> None:
    """Read bytes from a peer segment into a file (through a relay when that is faster)."""
    out: Out = ctx.obj
    n = parse_size(length)
    c.check_output(out, output)
    with _client(out, metadata, transport, secret, connections, timeout) as engine:
        buf = bytearray(n)
        region = engine.register(buf)
        t0 = time.perf_counter()
        plan = _move(engine, Op.READ, region, target, offset, n, relay or [], via)
        dt = time.perf_counter() - t0
        transport_used = engine.transport_for(target)
    if c.write_output(output, buf):
        return
    out.event({"event": "read", "target": target, "offset": offset, "bytes": n, "seconds": dt,
               "transport": transport_used, "output": output, **plan},
              f"read {n} bytes from {escape(target)} at offset {offset} over "
              f"{transport_used}{_path(plan)} into {escape(output)} in {dt * 1e3:.2f} ms")
