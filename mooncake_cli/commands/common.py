"""Options and helpers shared by the commands that start a transfer engine."""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

import typer

from mooncake_cli.config import TransferConfig, load
from mooncake_cli.heap import freeze_startup, wait_settling
from mooncake_cli.http.auth import resolve_secret
from mooncake_cli.interfaces import ConfigError
from mooncake_cli.output import Out
from mooncake_cli.signals import StopFlag, stop_signals

HOST = typer.Option(None, "--host", help="Listen address [default: 127.0.0.1].")
PORT = typer.Option(None, "--port", help="Listen port [default: 0, any free port].")
ADVERTISE = typer.Option(None, "--advertise", help="Address peers use to reach this engine.")
NAME = typer.Option(None, "--name", help="Segment name [default: HOST:PORT].")
METADATA = typer.Option(None, "--metadata",
                        help="p2p (default), http://HOST:PORT/metadata or etcd://HOST:PORT[,...].")
TRANSPORT = typer.Option(None, "--transport", help="auto (default), tcp, shm or another plugin.")
SECRET = typer.Option(None, "--secret", envvar="MOONCAKE_SECRET", show_envvar=True,
                      help="Shared secret every connection must prove (HMAC challenge).")
SECRET_FILE = typer.Option(None, "--secret-file", envvar="MOONCAKE_SECRET_FILE",
                           show_envvar=True, metavar="FILE",
                           help="File whose first line is the shared secret (safer than "
                                "--secret, which other users can see in the process list).")
CONNECTIONS = typer.Option(None, "--connections", help="Connections per peer [default: 4].")
TIMEOUT = typer.Option(None, "--timeout", help="Seconds per socket operation [default: 10].")


def transfer_config(out: Out, **flags: Any) -> TransferConfig:
    return load(TransferConfig, "transfer", out.config_file, **flags)


def cluster_config(out: Out, secret: str | None, secret_file: str | None) -> TransferConfig:
    """The transfer config of a serving role, its secret the cluster secret of --secret,
    --secret-file (or their variables) or else the [transfer] table's."""
    tcfg = transfer_config(out)
    return dataclasses.replace(tcfg, secret=resolve_secret(secret, secret_file) or tcfg.secret)


def wait_for_signal(stop: StopFlag | None = None, settle_heap: bool = False) -> None:
    """Block until `stop` is set (by `stop_signals`), or until Ctrl-C or SIGTERM;
    `settle_heap`: meanwhile keep full garbage collections off what the server holds, else
    only off what it held at start-up (mooncake_cli/heap.py)."""
    if stop is None:
        with stop_signals() as stop:
            wait_for_signal(stop, settle_heap)
        return
    if settle_heap:
        wait_settling(stop)
        return
    freeze_startup()
    while not stop.wait(3600):
        pass


def read_input(path: str) -> bytes:
    """The bytes of file `path`, or of stdin for `-`; ConfigError when it cannot be read."""
    try:
        if path == "-":
            return sys.stdin.buffer.read()
        with open(path, "rb") as fh:
            return fh.read()
    except OSError as e:
        raise ConfigError(f"cannot read {path}: {e.strerror}") from e


def check_output(out: Out, path: str) -> None:
    """Refuse `-o -` with --json before any work: both want stdout."""
    if path == "-" and out.json:
        raise ConfigError("--json and -o - both want stdout: give -o a file")


def write_output(path: str, data: bytes | bytearray) -> bool:
    """Write `data` to file `path`, or to stdout for `-` (then True: nothing else to print)."""
    if path == "-":
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
        return True
    try:
        with open(path, "wb") as fh:
            fh.write(data)
    except OSError as e:
        raise ConfigError(f"cannot write {path}: {e.strerror}") from e
    return False
