"""The root `mooncake` command: global options, subcommand groups, one error -> exit-code map."""

from __future__ import annotations

import logging
import sys
import traceback
from typing import Any

import typer
from rich.markup import escape
from typer.core import TyperGroup

from mooncake_cli import __version__, extras
from mooncake_cli.config import read_toml
from mooncake_cli.interfaces import (
    ConfigError,
    MetadataError,
    MooncakeError,
    PluginError,
    TransferError,
)
from mooncake_cli.output import Out
from mooncake_cli.store.errors import StoreError

try:  # typer >= 0.24 vendors click: its exceptions no longer derive from click's
    from typer.exceptions import TyperException as _ClickBase
except ImportError:  # pragma: no cover - older typer re-exports click's
    from click import ClickException as _ClickBase  # type: ignore[assignment]

# Click's own control flow (help, usage errors, Ctrl-C abort): typer reports these itself.
_CLICK_SIGNALS: tuple[type[BaseException], ...] = (typer.Exit, typer.Abort, _ClickBase)

EXIT_CODES: list[tuple[type[BaseException], int]] = [
    (ConfigError, 2),
    (PluginError, 3),
    (MetadataError, 4),
    (TransferError, 5),
    (StoreError, 7),
    (MooncakeError, 1),
    (OSError, 6),
]
LOG_LEVELS = ("debug", "info", "warning", "error")


def exit_code(exc: BaseException) -> int:
    for kind, code in EXIT_CODES:
        if isinstance(exc, kind):
            return code
    return 70


GLOBAL_FLAGS = ("--json",)  # accepted after the command too: `mooncake plugins --json`


def hoist_global_flags(args: list[str]) -> list[str]:
    """`args` with the global flags given after the command moved in front of it (up to a
    `--`, after which everything is an argument)."""
    end = args.index("--") if "--" in args else len(args)
    moved = [a for a in args[:end] if a in GLOBAL_FLAGS]
    return moved + [a for a in args[:end] if a not in GLOBAL_FLAGS] + args[end:]


class MooncakeGroup(TyperGroup):
    """Turns every library error into one line on stderr and its exit code."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if ctx.parent is None:  # the root: global flags may follow the command
            args = hoist_global_flags(list(args))
        result: list[str] = super().parse_args(ctx, args)
        return result

    def invoke(self, ctx: Any) -> Any:  # a click Context (typer vendors click >= 0.24)
        try:
            return super().invoke(ctx)
        except _CLICK_SIGNALS:
            raise
        except KeyboardInterrupt:
            raise typer.Exit(130) from None
        except Exception as e:
            out = ctx.obj if isinstance(ctx.obj, Out) else Out()
            if out.log_level == "debug":
                out.err.print(traceback.format_exc(), markup=False)
            missing = extras.missing_line(e)  # an optional package: the extra to install
            if missing is not None:
                out.err.print(f"[red]error:[/red] {escape(missing)}", markup=True,
                              soft_wrap=True)
                raise typer.Exit(extras.EXIT_CODE) from None
            code = exit_code(e)
            what = "error" if code != 70 else "internal error"
            msg = str(e) or type(e).__name__
            if isinstance(e, OSError) and e.strerror:
                msg = f"{e.strerror}" + (f": {e.filename}" if e.filename else "")
            hint = "" if code != 70 or out.log_level == "debug" else \
                " (run with --log-level debug for the traceback)"
            out.err.print(f"[red]{what}:[/red] {escape(msg)}{hint}", markup=True, soft_wrap=True)
            raise typer.Exit(code) from None


app = typer.Typer(cls=MooncakeGroup, no_args_is_help=True, add_completion=False,
                  pretty_exceptions_enable=False, rich_markup_mode=None,
                  help="Mooncake KVCache-centric serving: conductor, prefill and decode "
                       "workers, store, transfer engine, benchmarks and doctor.")


def _version(value: bool) -> None:
    if value:
        typer.echo(f"mooncake-cli {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    ctx: typer.Context,
    config: str = typer.Option(None, "--config", metavar="FILE",
                               help="TOML file with one table per role ([conductor], "
                                    "[prefill], [decode], [store], [transfer], "
                                    "[bench_transfer], [bench_store], ...)."),
    json_: bool = typer.Option(False, "--json", help="Machine-readable JSON output."),
    log_level: str = typer.Option("warning", "--log-level", metavar="LEVEL",
                                  help="debug, info, warning or error (debug shows tracebacks)."),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    """Mooncake KVCache-centric serving in one command."""
    if log_level.lower() not in LOG_LEVELS:
        raise typer.BadParameter(f"use one of {', '.join(LOG_LEVELS)}", param_hint="--log-level")
    out = Out(json=json_, config_file=config, log_level=log_level.lower())
    logging.basicConfig(level=log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    ctx.obj = out
    if config:
        read_toml(config)  # a missing or malformed file fails every command up front


def _register() -> None:
    from mooncake_cli.commands import (
        bench,
        conductor,
        models,
        plugins,
        store,
        top,
        transfer,
        workers,
    )
    from mooncake_cli.commands.doctor import doctor

    app.add_typer(conductor.app, name="conductor")
    app.command("prefill")(workers.prefill)
    app.command("decode")(workers.decode)
    app.add_typer(store.app, name="store")
    app.add_typer(transfer.app, name="transfer")
    app.add_typer(bench.app, name="bench")
    app.command("doctor")(doctor)
    app.command("plugins")(plugins.plugins)
    app.add_typer(models.app, name="models")
    app.command("top")(top.top)


_register()


def main(argv: list[str] | None = None) -> None:
    app(args=argv, prog_name="mooncake")
