"""`mooncake store` end to end: a real master (`mooncake --json store master`) and a real node
(`mooncake --json store serve`) in their own processes, and the short-lived client commands (put,
ls, get, stat, rm) through typer's CliRunner. Store errors exit 7 with one line, no traceback."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from mooncake_cli.app import EXIT_CODES, app
from mooncake_cli.store import StoreError
from tests.conftest import free_port
from tests.helpers.store_procs import Proc

pytestmark = pytest.mark.timeout(60)
runner = CliRunner()
LEASE_TTL = 0.3


@pytest.fixture(autouse=True)
def _no_mooncake_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("MOONCAKE_"):
            monkeypatch.delenv(key)


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    """A master and one node contributing 8 MiB; yields the master's HOST:PORT."""
    master = Proc([sys.executable, "-m", "mooncake_cli", "--json", "store", "master",
                   "--port", str(free_port()), "--lease-ttl", str(LEASE_TTL)])
    address = str(master.ready["address"])
    node = None
    try:
        node = Proc([sys.executable, "-m", "mooncake_cli", "--json", "store", "serve",
                     "--master", address, "--segment-size", "8MiB"])
        assert node.ready["master"] == address and node.ready["size"] == 8 << 20
        yield address
    finally:
        if node is not None:
            assert node.stop() == 0
        assert master.stop() == 0  # SIGTERM stops both cleanly


def mooncake(*args: str) -> Any:
    return runner.invoke(app, list(args), prog_name="mooncake")


def one_line_error(result: Any, code: int, *words: str) -> str:
    assert result.exit_code == code, (result.exit_code, result.output, result.exception)
    assert isinstance(result.exception, SystemExit), f"unhandled: {result.exception!r}"
    assert "Traceback" not in result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1, f"want one line, got:\n{result.output}"
    for w in words:
        assert w in lines[0], f"{w!r} not in {lines[0]!r}"
    return lines[0]


def test_store_error_has_its_own_exit_code() -> None:
    codes = dict(EXIT_CODES)
    assert codes[StoreError] == 7
    kinds = [k for k, _ in EXIT_CODES]
    assert all(kinds.index(StoreError) < kinds.index(k) for k in kinds
               if k is not StoreError and issubclass(StoreError, k))


def test_put_ls_get_stat_rm(cluster: str, tmp_path: Path) -> None:
    data = os.urandom(300_000)
    src, dst = tmp_path / "in.bin", tmp_path / "out.bin"
    src.write_bytes(data)
    m = ("--master", cluster)

    r = mooncake("store", "put", "cli/a", str(src), *m)
    assert r.exit_code == 0, r.output
    assert "300000 bytes" in r.output

    r = mooncake("store", "ls", *m)
    assert r.exit_code == 0, r.output
    assert "cli/a" in r.output
    r = mooncake("--json", "store", "ls", "cli/", *m)
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout) == [{"key": "cli/a", "size": len(data), "replicas": 1}]
    r = mooncake("--json", "store", "ls", "nothing/", *m)
    assert json.loads(r.stdout) == []

    r = mooncake("--json", "store", "get", "cli/a", "-o", str(dst), *m)
    assert r.exit_code == 0, r.output
    assert dst.read_bytes() == data
    event = json.loads(r.stdout)
    assert event["event"] == "get" and event["bytes"] == len(data)

    r = mooncake("store", "stat", *m)
    assert r.exit_code == 0, r.output
    assert "1 objects" in r.output and "dram" in r.output
    r = mooncake("--json", "store", "stat", *m)
    assert r.exit_code == 0, r.output
    stats = json.loads(r.stdout)
    assert stats["objects"] == 1 and stats["master"] == cluster
    dram = next(t for t in stats["tiers"] if t["tier"] == "dram")
    assert dram["segments"] == 1 and dram["capacity"] == 8 << 20
    assert dram["objects"] == 1 and dram["bytes_used"] >= len(data)

    time.sleep(LEASE_TTL + 0.2)  # sleep: behaviour - the get above leased it: the lease runs out
    r = mooncake("--json", "store", "rm", "cli/a", *m)
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout) == {"event": "removed", "key": "cli/a"}

    one_line_error(mooncake("store", "get", "cli/a", "-o", str(tmp_path / "gone"), *m), 7,
                   "error:", "cli/a")
    assert not (tmp_path / "gone").exists()
    one_line_error(mooncake("store", "rm", "cli/a", *m), 7, "error:")
    assert json.loads(mooncake("--json", "store", "stat", *m).stdout)["objects"] == 0


def test_put_from_stdin_and_get_to_stdout(cluster: str) -> None:
    m = ("--master", cluster)
    r = runner.invoke(app, ["store", "put", "cli/stdin", "-", *m], input=b"hello store\n")
    assert r.exit_code == 0, r.output
    r = mooncake("store", "get", "cli/stdin", *m)
    assert r.exit_code == 0, r.output
    assert r.stdout_bytes == b"hello store\n"
    one_line_error(mooncake("--json", "store", "get", "cli/stdin", *m), 2, "-o")
    time.sleep(LEASE_TTL + 0.2)  # sleep: behaviour - the get's lease runs out
    assert mooncake("store", "rm", "cli/stdin", *m).exit_code == 0


def test_put_of_an_existing_key_or_an_empty_file_fails(cluster: str, tmp_path: Path) -> None:
    m = ("--master", cluster)
    f = tmp_path / "v"
    f.write_bytes(b"x" * 100)
    assert mooncake("store", "put", "cli/dup", str(f), *m).exit_code == 0
    one_line_error(mooncake("store", "put", "cli/dup", str(f), *m), 7, "error:")
    (tmp_path / "empty").write_bytes(b"")
    one_line_error(mooncake("store", "put", "cli/empty", str(tmp_path / "empty"), *m), 7)
    one_line_error(mooncake("store", "put", "cli/x", str(tmp_path / "missing"), *m), 2,
                   "cannot read")
    assert mooncake("store", "rm", "--force", "cli/dup", *m).exit_code == 0


def test_bad_master_address_is_a_clean_error() -> None:
    one_line_error(mooncake("store", "stat", "--master", "no-port-here"), 7,
                   "HOST:PORT")
    line = one_line_error(mooncake("store", "ls", "--master", f"127.0.0.1:{free_port()}",
                                   "--timeout", "0.3"), 7, "did not answer")
    assert line.startswith("error:")


def test_master_on_a_busy_port_fails_cleanly(cluster: str) -> None:
    port = cluster.rsplit(":", 1)[1]
    one_line_error(mooncake("store", "master", "--port", port), 7, "cannot listen")


def test_serve_needs_a_positive_segment_size() -> None:
    one_line_error(mooncake("store", "serve", "--segment-size", "0"), 2, "segment-size")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
@pytest.mark.parametrize("cmd", [("mooncake_cli", "--json", "store", "master"),
                                 ("mooncake_cli.store.service",)])
def test_a_burst_of_signals_stops_a_server_cleanly(cmd: tuple[str, ...], signum: int) -> None:
    """`kill` and a wrapper forwarding it (timeout, a shell, Ctrl-C pressed twice) send two
    at once: a handler that took a lock deadlocked on the one it interrupted."""
    master = Proc([sys.executable, "-m", *cmd, "--port", str(free_port())])
    try:
        for _ in range(300):
            try:
                os.kill(master.proc.pid, signum)
            except ProcessLookupError:  # gone already
                break
        assert master.proc.wait(20) == 0
    finally:
        master.kill()
