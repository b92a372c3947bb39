"""The `mooncake` CLI through typer's CliRunner: global options, errors and exit codes, plugins,
config files, and `transfer` moving real bytes to targets served by separate processes.

Errors must be one line on stderr with the exit code of app.EXIT_CODES and no traceback unless
`--log-level debug`. CliRunner mixes stderr into `result.output`; JSON is read from
`result.stdout`, which has no stderr in it.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
import typer.main
from packaging.version import Version
from typer.testing import CliRunner

from mooncake_cli import __version__
from mooncake_cli.app import app
from tests.helpers import procs
from tests.helpers.procs import line_done

REPO = Path(__file__).resolve().parents[2]
PLUGIN_KEYS = {"group", "name", "package", "version", "available", "reason"}

runner = CliRunner()


@pytest.fixture(autouse=True)
def _no_mooncake_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No MOONCAKE_* setting of the outer environment leaks into a test."""
    for key in list(os.environ):
        if key.startswith("MOONCAKE_"):
            monkeypatch.delenv(key)


def mooncake(*args: str, env: dict[str, str] | None = None) -> Any:
    return runner.invoke(app, list(args), env=env, prog_name="mooncake")


def assert_error(result: Any, code: int, *words: str) -> str:
    """A handled error: exit `code`, one line of output, no traceback, every word in it."""
    assert result.exit_code == code, (result.exit_code, result.output, result.exception)
    assert isinstance(result.exception, SystemExit), f"unhandled: {result.exception!r}"
    assert "Traceback" not in result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1, f"want one line, got:\n{result.output}"
    for w in words:
        assert w in lines[0], f"{w!r} not in {lines[0]!r}"
    return lines[0]


def closed_port() -> int:
    """A loopback port nothing listens on (bound once, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_file(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


# -- child processes --------------------------------------------------------------------------
class Child:
    """`python -m mooncake_cli ARGS` in its own process, read until its ready output."""

    def __init__(self, *args: str, ready: Callable[[bytes], bool]) -> None:
        self.args = args
        self.child = procs.Child([sys.executable, "-m", "mooncake_cli", *args],
                                 procs.child_env())
        self.output = self.child.ready(ready)

    @property
    def proc(self) -> subprocess.Popen[bytes]:
        return self.child.popen

    def json(self) -> dict[str, Any]:
        return json.loads(self.output.splitlines()[0])

    def stop(self) -> int:
        self.child.stop(10)
        return int(self.proc.returncode)


@pytest.fixture
def spawn() -> Iterator[Callable[..., Child]]:
    """Start CLI child processes; all are stopped (SIGTERM, then SIGKILL) on teardown."""
    children: list[Child] = []

    def start(*args: str, ready: Callable[[bytes], bool] = line_done) -> Child:
        children.append(Child(*args, ready=ready))
        return children[-1]

    yield start
    for c in children:
        c.stop()


@pytest.fixture
def target(spawn: Callable[..., Child]) -> dict[str, Any]:
    """A 1 MiB `transfer serve` in another process; its JSON ready line."""
    ready = spawn("--json", "transfer", "serve", "--buffer-size", "1MiB").json()
    assert ready["event"] == "ready" and ready["size"] == 1 << 20
    return ready


# -- global options ---------------------------------------------------------------------------
def test_version() -> None:
    r = mooncake("--version")
    assert r.exit_code == 0
    assert r.output == f"mooncake-cli {__version__}\n"


def test_help_lists_global_options_and_commands() -> None:
    r = mooncake("--help")
    assert r.exit_code == 0, r.output
    for word in ("--config", "--json", "--log-level", "--version", "plugins", "transfer",
                 "bench"):
        assert word in r.output


def _paths(cmd: Any, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = [path]
    for name, sub in sorted((getattr(cmd, "commands", None) or {}).items()):
        out += _paths(sub, path + (name,))
    return out


@pytest.mark.parametrize("path", _paths(typer.main.get_command(app)),
                         ids=lambda p: " ".join(p) or "mooncake")
def test_every_command_has_help(path: tuple[str, ...]) -> None:
    r = mooncake(*path, "--help")
    assert r.exit_code == 0, r.output
    assert r.output.startswith("Usage: mooncake")
    assert "error" not in r.output.splitlines()[-1].lower()


def test_group_without_command_shows_help() -> None:
    r = mooncake("transfer")
    no_command = 2 if Version(version("click")) >= Version("8.2") else 0  # Click 8.2 changed it
    assert r.exit_code == no_command, r.output
    assert "Usage: mooncake transfer" in r.output and "serve" in r.output
    assert "internal error" not in r.output


def test_bad_log_level_is_a_usage_error() -> None:
    r = mooncake("--log-level", "loud", "plugins")
    assert r.exit_code == 2, r.output
    assert "--log-level" in r.output and "debug, info, warning, error" in r.output
    assert "Traceback" not in r.output


def test_unknown_command_and_option_are_usage_errors() -> None:
    for args in (["transfer", "frob"], ["transfer", "serve", "--bogus"],
                 ["transfer", "read", "--target", "x"]):
        r = mooncake(*args)
        assert r.exit_code == 2, (args, r.output)
        assert "Error" in r.output and "Traceback" not in r.output
        assert "internal error" not in r.output


def test_missing_config_file(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope.toml")
    assert_error(mooncake("--config", missing, "plugins"), 2, "error:", missing, "does not exist")


def test_malformed_config_file(tmp_path: Path) -> None:
    bad = write_file(tmp_path / "bad.toml", "[transfer\n")
    assert_error(mooncake("--config", bad, "plugins"), 2, bad, "not valid TOML")


def test_unknown_config_key_names_the_key(tmp_path: Path) -> None:
    cfg = write_file(tmp_path / "c.toml", "[transfer]\nconnexions = 8\n")
    line = assert_error(mooncake("--config", cfg, "transfer", "read", "--target",
                                 f"127.0.0.1:{closed_port()}", "--length", "4",
                                 "-o", str(tmp_path / "out")), 2, "'connexions'")
    assert "[transfer]" in line  # brackets survive rich markup
    assert "connections" in line  # the known keys are listed


def test_bad_config_value(tmp_path: Path) -> None:
    cfg = write_file(tmp_path / "c.toml", "[transfer]\nconnections = \"many\"\n")
    assert_error(mooncake("--config", cfg, "transfer", "read", "--target", "127.0.0.1:1",
                          "--length", "4", "-o", str(tmp_path / "o")), 2, "connections",
                 "'many'")


# -- plugins ----------------------------------------------------------------------------------
def _plugins(*args: str, env: dict[str, str] | None = None) -> list[dict[str, Any]]:
    r = mooncake("--json", "plugins", *args, env=env)
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert isinstance(data, list) and data
    for p in data:
        assert PLUGIN_KEYS <= set(p), p
        assert isinstance(p["available"], bool) and isinstance(p["reason"], str)
        assert p["available"] or p["reason"], f"unavailable without a reason: {p}"
    return data


def test_plugins_table() -> None:
    r = mooncake("plugins")
    assert r.exit_code == 0, r.output
    for word in ("group", "name", "package", "version", "available", "mooncake.transports",
                 "mooncake.tiers", "tcp", "shm", "dram", "mooncake-cli"):
        assert word in r.output


def test_plugins_json() -> None:
    by_name = {(p["group"], p["name"]): p for p in _plugins()}
    tcp = by_name[("mooncake.transports", "tcp")]
    assert tcp["available"] is True and tcp["reason"] == ""
    assert tcp["package"] == "mooncake-cli" and tcp["version"] == __version__
    assert ("mooncake.tiers", "dram") in by_name


def test_plugins_group_filter() -> None:
    assert {p["group"] for p in _plugins("--group", "mooncake.tiers")} == {"mooncake.tiers"}


def test_mooncake_plugins_env_restricts_what_loads() -> None:
    by_name = {p["name"]: p for p in _plugins(env={"MOONCAKE_PLUGINS": "tcp"})}
    assert by_name["tcp"]["available"] is True
    assert by_name["shm"]["available"] is False
    assert "MOONCAKE_PLUGINS" in by_name["shm"]["reason"]
    assert by_name["dram"]["available"] is True  # the tiers group was not named
    r = mooncake("plugins", env={"MOONCAKE_PLUGINS": "tcp", "COLUMNS": "200"})
    assert r.exit_code == 0 and "disabled by MOONCAKE_PLUGINS" in r.output


def test_unexpected_exception_is_an_internal_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from mooncake_cli.commands import plugins as plugins_cmd

    def boom(*_: object) -> None:
        raise RuntimeError("boom [/x]")

    monkeypatch.setattr(plugins_cmd.Registry, "from_env", classmethod(boom))
    line = assert_error(mooncake("plugins"), 70, "internal error", "boom [/x]")
    assert "--log-level debug" in line
    r = mooncake("--log-level", "debug", "plugins")
    assert r.exit_code == 70 and "Traceback (most recent call last)" in r.output


# -- transfer: errors -------------------------------------------------------------------------
def test_read_from_a_target_nobody_serves(tmp_path: Path) -> None:
    seg = f"127.0.0.1:{closed_port()}"
    r = mooncake("transfer", "read", "--target", seg, "--length", "4", "-o",
                 str(tmp_path / "out"))
    assert_error(r, 5, seg, "cannot connect")  # a TransferError: nothing listens there
    assert not (tmp_path / "out").exists()


def test_debug_log_level_shows_the_traceback(tmp_path: Path) -> None:
    args = ["transfer", "read", "--target", f"127.0.0.1:{closed_port()}", "--length", "4",
            "-o", str(tmp_path / "out")]
    quiet = mooncake(*args)
    assert quiet.exit_code != 0 and "Traceback" not in quiet.output
    loud = mooncake("--log-level", "debug", *args)
    assert loud.exit_code == quiet.exit_code
    assert "Traceback (most recent call last)" in loud.output
    assert loud.output.rstrip().splitlines()[-1] == quiet.output.strip()


def test_bad_size_and_missing_file(tmp_path: Path) -> None:
    assert_error(mooncake("transfer", "read", "--target", "127.0.0.1:1", "--length", "1bogus",
                          "-o", str(tmp_path / "o")), 2, "1bogus")
    missing = str(tmp_path / "missing.bin")
    assert_error(mooncake("transfer", "write", "--target", "127.0.0.1:1", missing), 2,
                 "cannot read", missing)
    assert_error(mooncake("--json", "transfer", "read", "--target", "127.0.0.1:1", "--length",
                          "4", "-o", "-"), 2, "stdout")


# -- transfer: real bytes through real processes ----------------------------------------------
def test_write_then_read_round_trip(target: dict[str, Any], tmp_path: Path) -> None:
    seg = target["segment"]
    data = os.urandom(100_000)
    src = tmp_path / "in.bin"
    src.write_bytes(data)
    w = mooncake("--json", "transfer", "write", "--target", seg, "--offset", "4096", str(src))
    assert w.exit_code == 0, w.output
    event = json.loads(w.stdout)
    assert event["event"] == "written" and event["bytes"] == len(data)
    assert event["target"] == seg and event["offset"] == 4096

    dst = tmp_path / "out.bin"
    r = mooncake("transfer", "read", "--target", seg, "--offset", "4096", "--length",
                 str(len(data)), "-o", str(dst))
    assert r.exit_code == 0, r.output
    assert dst.read_bytes() == data
    assert f"read {len(data)} bytes from {seg}" in r.output

    r = mooncake("transfer", "read", "--target", seg, "--offset", "4096", "--length", "4KiB",
                 "-o", "-", "--transport", "tcp")
    assert r.exit_code == 0, r.output
    assert r.stdout_bytes == data[:4096]

    r = mooncake("transfer", "read", "--target", seg, "--offset", str((1 << 20) - 10),
                 "--length", "20", "-o", str(tmp_path / "oob"))
    assert_error(r, 5, "out of bounds")


def test_wrong_secret_is_refused(spawn: Callable[..., Child], tmp_path: Path) -> None:
    ready = spawn("--json", "transfer", "serve", "--buffer-size", "1MiB",
                  "--secret", "s3cret").json()
    assert ready["auth"] is True
    seg, src = ready["segment"], tmp_path / "in.bin"
    src.write_bytes(b"x" * 1000)
    for args in (["--secret", "wrong"], ["--secret", "wrong", "--transport", "tcp"]):
        line = assert_error(mooncake("transfer", "write", "--target", seg, *args, str(src)), 5)
        assert "secret" in line
    line = assert_error(mooncake("transfer", "write", "--target", seg, str(src)), 5)
    assert "secret" in line
    assert mooncake("transfer", "write", "--target", seg, "--secret", "s3cret",
                    str(src)).exit_code == 0
    r = mooncake("transfer", "write", "--target", seg, str(src),
                 env={"MOONCAKE_SECRET": "s3cret"})
    assert r.exit_code == 0, r.output


def test_config_file_sets_transfer_values(spawn: Callable[..., Child], tmp_path: Path) -> None:
    ready = spawn("--json", "transfer", "serve", "--buffer-size", "1MiB",
                  "--secret", "from-file").json()
    seg, src = ready["segment"], tmp_path / "in.bin"
    src.write_bytes(os.urandom(5000))
    cfg = write_file(tmp_path / "mooncake.toml",
                     '[transfer]\nsecret = "from-file"\ntransport = "tcp"\n'
                     'slice-size = "64KiB"\nconnections = 2\n')
    r = mooncake("--json", "--config", cfg, "transfer", "write", "--target", seg, str(src))
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["transport"] == "tcp"  # from the file
    r = mooncake("--json", "--config", cfg, "transfer", "write", "--target", seg,
                 "--transport", "shm", str(src))
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["transport"] == "shm"  # a flag beats the file
    r = mooncake("--json", "--config", cfg, "transfer", "write", "--target", seg, str(src),
                 env={"MOONCAKE_TRANSFER_TRANSPORT": "shm"})
    assert json.loads(r.stdout)["transport"] == "shm"  # so does the environment
    bad = write_file(tmp_path / "bad.toml", '[transfer]\nsecret = "nope"\n')
    assert_error(mooncake("--config", bad, "transfer", "write", "--target", seg, str(src)), 5,
                 "secret")


def test_segments_by_name_through_a_metadata_server(spawn: Callable[..., Child],
                                                    tmp_path: Path) -> None:
    md = spawn("--json", "transfer", "metadata-server", "--port", "0").json()
    url = md["url"]
    assert md["event"] == "ready" and url.startswith("http://127.0.0.1:")
    serve = spawn("transfer", "serve", "--metadata", url, "--name", "foo", "--buffer-size",
                  "1MiB", ready=lambda out: b"Ctrl-C to stop." in out)
    assert f"--target foo --metadata {url}".encode() in serve.output  # hints that work

    data = os.urandom(3000)
    src, dst = tmp_path / "in.bin", tmp_path / "out.bin"
    src.write_bytes(data)
    r = mooncake("transfer", "write", "--metadata", url, "--target", "foo", str(src))
    assert r.exit_code == 0, r.output
    assert "to foo" in r.output
    r = mooncake("transfer", "read", "--metadata", url, "--target", "foo", "--length",
                 str(len(data)), "-o", str(dst))
    assert r.exit_code == 0, r.output
    assert dst.read_bytes() == data

    r = mooncake("transfer", "read", "--metadata", url, "--target", "bar", "--length", "4",
                 "-o", str(dst))
    assert_error(r, 5, "bar", "not found")  # the read fails as a transfer (TransferError)
    assert serve.stop() == 0  # SIGTERM: withdrawn and clean


def test_json_is_accepted_after_the_command_too() -> None:
    before, after = mooncake("--json", "plugins"), mooncake("plugins", "--json")
    assert after.exit_code == 0, after.output
    assert json.loads(after.stdout) == json.loads(before.stdout)
    assert mooncake("plugins", "--", "--json").exit_code == 2  # after --, an argument
