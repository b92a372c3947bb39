"""`mooncake bench transfer` through typer's CliRunner: real child processes, real sockets.

These check structure and that every number is positive, never timing thresholds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from mooncake_cli.app import app
from mooncake_cli.bench import upstream

runner = CliRunner()


def bench(*args: str, env: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    return runner.invoke(app, ["--json", "bench", "transfer", *args], env=env)


def reports(result) -> list[dict]:  # type: ignore[no-untyped-def,type-arg]
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["reports"]  # type: ignore[no-any-return]


def check_row(row: dict, name: str) -> None:  # type: ignore[type-arg]
    assert row["name"] == name
    for key in ("bytes", "transfers", "seconds", "gbps", "transfers_per_s", "p50_us", "p99_us"):
        assert row[key] > 0, (name, key, row)
    assert row["p50_us"] <= row["p99_us"]
    assert row["bytes"] == row["transfers"] * row["block_size"] or name == "socket"


@pytest.mark.parametrize("transport,reference", [("tcp", "socket"), ("shm", "memcpy")])
def test_local_run(transport: str, reference: str) -> None:
    (rep,) = reports(bench("--mode", "local", "--transport", transport, "--duration", "0.5",
                           "--block-size", "64KiB", "--batch-size", "2", "--threads", "2",
                           "--buffer-size", "4MiB"))
    ours, ref = rep["results"]
    check_row(ours, "ours")
    check_row(ref, reference)
    assert ours["transport"] == transport
    assert ours["verified"] is True
    assert (ours["op"], ours["block_size"], ours["batch_size"], ours["threads"]) == \
        ("write", 64 << 10, 2, 2)
    assert rep["workload"]["transport"] == transport
    assert rep["ratios"][reference] == pytest.approx(ours["gbps"] / ref["gbps"], rel=0.01)


def test_sweep_runs_both_ops_for_every_size() -> None:
    reps = reports(bench("--transport", "tcp", "--duration", "0.2", "--buffer-size", "1MiB",
                         "--sweep", "4KiB,256KiB"))
    assert [(r["workload"]["op"], r["workload"]["block_size"]) for r in reps] == \
        [("write", 4096), ("read", 4096), ("write", 256 << 10), ("read", 256 << 10)]
    for r in reps:
        check_row(r["results"][0], "ours")
        assert r["results"][0]["verified"] is True


def test_human_table() -> None:
    result = runner.invoke(app, ["bench", "transfer", "--transport", "shm", "--op", "read",
                                 "--duration", "0.2", "--buffer-size", "1MiB"])
    assert result.exit_code == 0, result.output
    assert "ours" in result.stdout and "memcpy" in result.stdout and "read 64 KiB" in result.stdout


def test_target_and_initiator_modes() -> None:
    env = {**os.environ, "MOONCAKE_SECRET": "s3cret"}
    proc = subprocess.Popen([sys.executable, "-m", "mooncake_cli", "--json", "bench", "transfer",
                             "--mode", "target", "--buffer-size", "2MiB"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        ready = json.loads(proc.stdout.readline())
        assert ready["event"] == "ready" and ready["auth"] is True
        args = ("--mode", "initiator", "--target", ready["segment"], "--transport", "tcp",
                "--duration", "0.3", "--op", "read", "--buffer-size", "1MiB")
        (rep,) = reports(bench(*args, "--secret", "s3cret"))
        check_row(rep["results"][0], "ours")
        assert "reference" in rep["skipped"]  # no loopback reference for a named target
        wrong = bench(*args, "--secret", "nope")
        assert wrong.exit_code == 4 and "refused our secret" in wrong.output  # at its describe
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.mark.parametrize("args,code,words", [
    (["--mode", "initiator"], 2, "--target"),
    (["--block-size", "1MiB", "--batch-size", "4", "--buffer-size", "2MiB"], 2, "does not fit"),
    (["--transport", "carrier-pigeon"], 3, "carrier-pigeon"),
    (["--op", "copy"], 2, "--op"),
    (["--mode", "sideways"], 2, "--mode"),
    (["--block-size", "lots"], 2, "bad size"),
    (["--duration", "0"], 2, "--duration"),
    (["--mode", "initiator", "--target", "127.0.0.1:1", "--compare-upstream"], 2, "local"),
    (["--sweep", "1MiB,1GiB", "--buffer-size", "2MiB"], 2, "does not fit"),
])
def test_bad_combinations(args: list[str], code: int, words: str) -> None:
    result = bench(*args)
    assert result.exit_code == code, result.output
    assert words in result.output
    assert "Traceback" not in result.output


def test_unreachable_target_fails_cleanly() -> None:
    result = bench("--mode", "initiator", "--target", "127.0.0.1:1", "--duration", "0.2")
    assert result.exit_code == 4, result.output  # its describe cannot connect
    assert "cannot connect" in result.output
    assert "Traceback" not in result.output


@pytest.mark.skipif(not upstream.available()[0], reason="upstream wheel does not import: "
                    "pip install 'mooncake-cli[upstream]'")
def test_compare_upstream() -> None:
    (rep,) = reports(bench("--transport", "tcp", "--compare-upstream", "--duration", "0.5",
                           "--block-size", "256KiB", "--batch-size", "2", "--buffer-size",
                           "4MiB", "--op", "read"))
    ours, up, sock = rep["results"]
    check_row(up, "upstream")
    assert up["verified"] is True and up["batch_size"] == 2 and up["op"] == "read"
    assert set(rep["ratios"]) == {"upstream", "socket"}
    assert rep["ratios"]["upstream"] > 0
