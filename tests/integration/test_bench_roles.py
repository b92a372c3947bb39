"""`mooncake bench conductor-cpu` and `bench prefix-reuse`: roles as processes of their own.
Here on our engine (the demo model), or refused in one line where vLLM is not installed; the
vLLM runs are the plugin's tests (plugins/mooncake-vllm/tests/test_bench_vllm.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import psutil
import pytest

from mooncake_cli.worker.engines import names
from tests.helpers.procs import child_env
from tests.helpers.store_procs import REPO

NO_VLLM = pytest.mark.skipif("vllm" in names(), reason="vLLM is installed here")


def mooncake(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mooncake_cli", *args], capture_output=True,
                          text=True, cwd=REPO, env=child_env(), timeout=timeout)


def test_conductor_cpu_per_request_on_our_engine() -> None:
    done = mooncake("--json", "bench", "conductor-cpu", "--engine", "native", "--model",
                    "demo", "--requests", "12", "--prompt-tokens", "64", "--idle", "0.5")
    assert done.returncode == 0, done.stderr
    rep = json.loads(done.stdout)
    run = rep["runs"]["native"]
    assert run["served"] == 12 and run["errors"] == 0
    assert run["conductor_cpu_s"] > 0  # 12 streamed answers cost the conductor some CPU
    assert run["cpu_ms_per_request"] == pytest.approx(run["conductor_cpu_s"] / 12 * 1e3,
                                                      abs=1e-3)
    assert run["cpu_ms_per_request_less_idle"] <= run["cpu_ms_per_request"]
    assert not psutil.pid_exists(run["conductor_pid"])  # the cluster is stopped after
    assert rep["ratios"] == {} and rep["host"]["cores"] >= 1


def test_conductor_cpu_refuses_an_engine_named_twice() -> None:
    done = mooncake("bench", "conductor-cpu", "--engine", "native,native")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "error: --engine 'native,native': name each engine once, e.g. native,vllm"]


@NO_VLLM
def test_without_vllm_each_bench_is_one_line() -> None:
    for args in (["bench", "conductor-cpu"], ["bench", "prefix-reuse"],
                 ["bench", "trace", "--local", "1,1", "--engine", "vllm"]):
        done = mooncake(*args, timeout=120)
        assert done.returncode == 3, args
        [line] = done.stderr.strip().splitlines()
        assert line.startswith("error: --engine vllm needs vLLM and the mooncake-vllm plugin"), \
            line
        assert done.stdout == ""  # nothing started, nothing measured
