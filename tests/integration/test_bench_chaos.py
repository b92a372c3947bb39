"""`mooncake bench chaos` end to end on tiny settings: a real local etcd, three real --ha
masters and two store nodes; one leader kill and one throughput row, checked for structure and
for the durability counts (never timings)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers.procs import child_env

pytestmark = pytest.mark.timeout(180)


def chaos(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mooncake_cli", *args], capture_output=True,
                          text=True, timeout=170, env=child_env())


def test_one_kill_and_one_row() -> None:
    run = chaos("--json", "bench", "chaos", "--kills", "1", "--sizes", "4KiB", "--duration",
                "0.3", "--segment-size", "32MiB")
    assert run.returncode == 0, run.stderr[-2000:]
    rep = json.loads(run.stdout)
    assert rep["kills"] == 1 and len(rep["recovery_s"]) == 1 and rep["recovery_s"][0] > 0
    assert rep["acked_puts"] > 0
    assert (rep["lost"], rep["resurrected"], rep["wrong_bytes"]) == (0, 0, 0)
    (row,) = rep["throughput"]
    assert row["size"] == 4096
    for mode in ("off", "on"):
        assert row[mode]["puts"] > 0 and row[mode]["p50_us"] > 0
    assert row["ops_ratio"] == pytest.approx(row["on"]["ops_per_s"] / row["off"]["ops_per_s"])


def test_bad_options_are_refused() -> None:
    for args, words in ((["--etcd", "http://x:2379"], "--etcd"), (["--kills", "-1"], "--kills"),
                        (["--sizes", "4MiB", "--segment-size", "8MiB"], "--segment-size")):
        run = chaos("bench", "chaos", *args)
        assert run.returncode == 2, (args, run.stderr)
        assert words in run.stderr and "Traceback" not in run.stderr
