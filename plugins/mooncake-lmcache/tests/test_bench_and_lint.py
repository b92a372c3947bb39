"""The bench runs end to end on a small KV cache (every backend retrieves bit for bit; no
timing is asserted), and the plugin stays clean under ruff and mypy."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

PLUGIN = Path(__file__).resolve().parents[1]


def run(*cmd: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=PLUGIN, capture_output=True, text=True, timeout=timeout)


@pytest.mark.timeout(300)
def test_the_bench_compares_every_backend_on_verified_retrieves() -> None:
    r = run(sys.executable, "-m", "mooncake_lmcache.bench", "--tokens", "600", "--layers", "2",
            "--heads", "2", "--rounds", "2", "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads(r.stdout)
    assert report["kv_bytes"] == 600 * 2 * 2 * 128 * 2
    rows = {row["backend"]: row for row in report["results"]}
    assert set(rows) == {"mooncake (node)", "mooncake (own seg)", "lmcache local disk",
                         "lmcache redis"}
    for row in rows.values():
        assert row["verified"] is True and row["rounds"] == 2 and row["gbps"] > 0
    assert set(report["ratios"]) == {f"{a} / {b}" for a in ("mooncake (node)",
                                                            "mooncake (own seg)")
                                     for b in ("lmcache local disk", "lmcache redis")}


def test_bad_bench_arguments_are_an_error_line() -> None:
    r = run(sys.executable, "-m", "mooncake_lmcache.bench", "--tokens", "0")
    assert r.returncode == 2
    assert "sizes and --rounds must be positive" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.timeout(300)
def test_ruff_and_mypy_are_clean() -> None:
    ruff = run(sys.executable, "-m", "ruff", "check", ".")
    assert ruff.returncode == 0, ruff.stdout + ruff.stderr
    mypy = run(sys.executable, "-m", "mypy", "mooncake_lmcache", "tests")
    assert mypy.returncode == 0, mypy.stdout + mypy.stderr
