"""`mooncake plugins`: every plugin, its package and version, and why it is off."""

from __future__ import annotations

from dataclasses import asdict

import typer
from rich.console import Console
from rich.markup import escape

from mooncake_cli.output import Out, table
from mooncake_cli.registry import Registry


def plugins(
    ctx: typer.Context,
    group: str = typer.Option(None, "--group", help="Only this entry-point group."),
) -> None:
    """List transport and tier plugins: group, name, package, version, available or why not."""
    out: Out = ctx.obj
    registry = Registry.from_env()
    infos = registry.plugins(group)
    data = [{k: v for k, v in asdict(p).items()} for p in infos]
    for p, d in zip(infos, data, strict=True):  # transports: when `auto` picks them, and why
        if p.group == "mooncake.transports" and p.available:
            obj = registry.get(p.group, p.name)
            d["priority"] = obj.priority
            d["choice"] = (obj.why_priority() if hasattr(obj, "why_priority")
                           else f"priority {obj.priority}: best of those that reach a peer")

    def human(c: Console) -> None:
        rows = [(p.group, p.name, p.package, p.version,
                 ("[green]yes[/green]" + (f": {escape(d['choice'])}" if "choice" in d else ""))
                 if p.available else f"[red]no[/red]: {escape(p.reason)}")
                for p, d in zip(infos, data, strict=True)]
        c.print(table(None, ["group", "name", "package", "version", "available"], rows))

    out.emit(data, human)
