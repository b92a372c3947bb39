"""`mooncake doctor --group nixl` in a child process: with the real nixl-cu12 package (UCX's
own report of its transports), with the plugin turned off by MOONCAKE_PLUGINS, with the
package absent (its import blocked in the child), and against captured RDMA/GPU hosts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from mooncake_backends.nixl.ucx import UcxInfo

from mooncake_cli.doctor import nixl as doctor_nixl
from mooncake_cli.doctor.check import DoctorConfig, Status
from mooncake_cli.registry import Registry
from tests.conftest import REPO
from tests.helpers.procs import child_env

pytestmark = pytest.mark.timeout(120)
SYSFS = Path(__file__).parent.parent / "data" / "sysfs"
HAVE = any(p.name == "nixl" and p.available for p in Registry().plugins("mooncake.transports"))
needs_nixl = pytest.mark.skipif(not HAVE, reason="nixl-cu12 is not installed")

# runs the CLI in a child whose imports of the NIXL package fail, as on a host without it
BLOCKED = """
import importlib.abc, runpy, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("nixl", "nixl_cu12", "nixl_cu13"):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return None
sys.meta_path.insert(0, Block())
sys.argv = ["mooncake", *sys.argv[1:]]
runpy.run_module("mooncake_cli", run_name="__main__")
"""


def cli(*args: str, blocked: bool = False, **env: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-c", BLOCKED] if blocked else [sys.executable, "-m", "mooncake_cli"]
    return subprocess.run([*argv, "--json", *args], capture_output=True, text=True, cwd=REPO,
                          env=child_env(**env), timeout=100)


def checks(done: subprocess.CompletedProcess[str]) -> dict[str, dict[str, Any]]:
    assert "Traceback" not in done.stderr, done.stderr
    data = json.loads(done.stdout)
    assert data["ok"] is (done.returncode == 0)
    return {c["check"]: c for c in data["checks"] if c["group"] == "nixl"}


@needs_nixl
def test_with_the_real_package_ucx_reports_its_transports() -> None:
    got = checks(cli("doctor", "--group", "nixl"))
    assert got["package"]["status"] == "ok" and got["package"]["data"]["version"] == "1.5.1"
    assert got["UCX"]["status"] == "ok" and got["UCX"]["data"]["version"].startswith("1.")
    tls = {t for t, _ in got["UCX transports"]["data"]["resources"]}
    assert {"tcp", "cma"} <= tls  # what UCX itself sees on this host
    assert got["cma (same host)"]["status"] == "ok"
    assert got["RDMA"]["status"] == "skipped" and "no RDMA device" in got["RDMA"]["evidence"]
    assert got["CUDA"]["status"] == "skipped"


@needs_nixl
def test_a_captured_tree_is_not_compared_with_this_machines_ucx() -> None:
    got = checks(cli("doctor", "--group", "nixl", "--sysfs-root",
                     str(SYSFS / "healthy_roce")))
    assert got["UCX transports"]["status"] == "ok"
    assert got["RDMA"]["status"] == got["CUDA"]["status"] == "skipped"
    assert "--sysfs-root" in got["RDMA"]["evidence"]


# what UCX reported on hosts with and without the hardware, checked against a captured tree
NO_FAST = UcxInfo("1.23.0", ("self", "tcp", "cma", "ib"), (("tcp", "lo"), ("cma", "memory")))
FAST = UcxInfo("1.23.0", ("self", "tcp", "cma", "ib", "cuda"),
               (("rc_mlx5", "mlx5_0:1"), ("cuda_copy", "cuda"), ("cuda_ipc", "cuda"),
                ("cma", "memory")))


def test_rdma_devices_that_ucx_cannot_use_fail_with_a_fix() -> None:
    cfg = DoctorConfig(root=str(SYSFS / "healthy_roce"))  # mlx5_0 and the NVIDIA driver
    bad = doctor_nixl.rdma_check(NO_FAST, cfg)
    assert bad.status is Status.FAIL and "mlx5_0" in bad.evidence and "UCX_TLS" in bad.fix
    [cuda, gdr] = doctor_nixl.gpu_checks(NO_FAST, cfg)
    assert cuda.status is Status.FAIL and "libcudart" in cuda.fix
    assert gdr.status is Status.SKIPPED
    good = doctor_nixl.rdma_check(FAST, cfg)
    assert good.status is Status.OK and "mlx5_0:1" in good.evidence
    [cuda, gdr] = doctor_nixl.gpu_checks(FAST, cfg)
    assert cuda.status is Status.OK and "cuda_ipc" in cuda.evidence
    assert gdr.status is Status.OK  # nvidia_peermem is loaded there
    [_, gdr] = doctor_nixl.gpu_checks(FAST, DoctorConfig(root=str(SYSFS / "constrained")))
    assert gdr.status is Status.WARN and "nvidia_peermem" in gdr.fix  # not loaded there


def test_disabled_by_mooncake_plugins_is_skipped_with_the_fix() -> None:
    got = checks(cli("doctor", "--group", "nixl", MOONCAKE_PLUGINS="tcp,shm"))
    assert list(got) == ["package"]
    assert got["package"]["status"] == "skipped"
    assert "MOONCAKE_PLUGINS" in got["package"]["evidence"] + got["package"]["fix"]


def test_absent_package_warns_and_names_the_install() -> None:
    done = cli("doctor", "--group", "nixl", blocked=True)
    assert done.returncode == 0, done.stderr  # optional: a warning, not a failure
    got = checks(done)
    assert list(got) == ["package"]
    assert got["package"]["status"] == "warn"
    assert "not installed" in got["package"]["evidence"]
    assert "mooncake-cli[nixl]" in got["package"]["fix"]
    plugins = {p["name"]: p for p in json.loads(cli("plugins", blocked=True).stdout)}
    assert plugins["nixl"]["available"] is False and "not installed" in plugins["nixl"]["reason"]
    assert plugins["tcp"]["available"] is True
