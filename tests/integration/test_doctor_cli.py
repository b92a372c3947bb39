"""`mooncake --json doctor` end to end in a child process: exit 0 when nothing fails, 1 with
the failed checks named when one does, 2 for bad input; the JSON carries every check."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, free_port
from tests.helpers.procs import child_env

pytestmark = pytest.mark.timeout(180)
SYSFS = Path(__file__).parent.parent / "data" / "sysfs"
MIB = 1 << 20


def doctor(*args: str, memlock: int | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    def limit() -> None:
        if memlock is not None:
            _, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
            resource.setrlimit(resource.RLIMIT_MEMLOCK, (memlock, hard))

    return subprocess.run([sys.executable, "-m", "mooncake_cli", "--json", "doctor", *args],
                          capture_output=True, text=True, cwd=REPO, env=child_env(**env),
                          preexec_fn=limit, timeout=150)


def statuses(done: subprocess.CompletedProcess[str]) -> dict[str, str]:
    data: dict[str, Any] = json.loads(done.stdout)
    assert data["ok"] is (done.returncode == 0)
    return {f"{c['group']}/{c['check']}": c["status"] for c in data["checks"]}


def planned() -> int:
    """A segment this machine's real memlock limit covers (the memlock check must pass)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    return 4 * MIB if soft == resource.RLIM_INFINITY else min(4 * MIB, soft)


def test_everything_healthy_exits_0(etcd: str, metadata_server: Any) -> None:
    done = doctor("--metadata", etcd, "--sysfs-root", str(SYSFS / "healthy_roce"),
                  "--segment-size", str(planned()), "--peer-mtu", "4096")
    assert done.returncode == 0, done.stdout + done.stderr
    s = statuses(done)
    assert set(s.values()) <= {"ok", "warn", "skipped"}
    for must in ("install/python", "metadata/etcd put/get/delete", "rdma/mlx5_0/1 GID",
                 "rdma/memlock", "memory/hugepages", "network/loopback transfer"):
        assert s[must] == "ok", must
    # the same groups through an HTTP metadata server
    http = doctor("--metadata", metadata_server.url, "--group", "metadata")
    assert http.returncode == 0 and statuses(http)["metadata/http put/get/delete"] == "ok"


def test_a_failed_check_exits_1_and_is_named() -> None:
    done = doctor("--sysfs-root", str(SYSFS / "port_down"), "--group", "rdma",
                  "--segment-size", str(planned()))
    assert done.returncode == 1
    assert statuses(done)["rdma/mlx5_0/1 state"] == "fail"
    assert "rdma/mlx5_0/1 state" in done.stderr


def test_memlock_below_the_plan_fails_for_real() -> None:
    args = ("--sysfs-root", str(SYSFS / "healthy_roce"), "--group", "rdma")
    low = doctor(*args, "--segment-size", "1MiB", memlock=64 << 10)
    assert low.returncode == 1 and statuses(low)["rdma/memlock"] == "fail"
    fits = doctor(*args, "--segment-size", "32KiB", memlock=64 << 10)
    assert fits.returncode == 0 and statuses(fits)["rdma/memlock"] == "ok"


def test_dead_metadata_and_master_exit_1() -> None:
    done = doctor("--metadata", f"etcd://127.0.0.1:{free_port()}", "--master",
                  f"127.0.0.1:{free_port()}", "--group", "metadata", "--group", "master",
                  "--timeout", "1")
    assert done.returncode == 1
    s = statuses(done)
    assert s["master/reachable"] == "fail"
    assert [v for k, v in s.items() if k.startswith("metadata/etcd 127.0.0.1")] == ["fail"]


def test_proxy_from_the_environment_exits_1() -> None:
    done = doctor("--metadata", "etcd://10.9.8.7:2379", "--group", "environment",
                  http_proxy="http://proxy.invalid:3128", no_proxy="localhost")
    assert done.returncode == 1 and statuses(done)["environment/proxy"] == "fail"


@pytest.mark.parametrize("args", [
    ("--peer", "nonsense"),
    ("--group", "bogus"),
    ("--sysfs-root", "/no/such/dir"),
    ("--peer-mtu", "1500"),
])
def test_bad_input_exits_2(args: tuple[str, ...]) -> None:
    done = doctor(*args)
    assert done.returncode == 2 and done.stdout == ""
    assert "error" in done.stderr.lower()
