"""Environment and install checks: proxy variables against no_proxy, hostname resolution, the
engine's port held by another socket, plugins and Python."""

from __future__ import annotations

import importlib.metadata as md
import os
import socket
from pathlib import Path

import pytest

from mooncake_cli.doctor import DoctorConfig, Status
from mooncake_cli.doctor.environment import hostname_check, port_check, proxy_check
from mooncake_cli.doctor.install import (
    native_check,
    plugin_checks,
    python_check,
    pyverbs_check,
    torch_check,
)
from mooncake_cli.registry import Registry

pytestmark = pytest.mark.timeout(60)
SYSFS = Path(__file__).parent.parent / "data" / "sysfs"
PROXY_VARS = ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY",
              "ALL_PROXY", "no_proxy", "NO_PROXY")


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for v in PROXY_VARS:
        monkeypatch.delenv(v, raising=False)
    return monkeypatch


def env_cfg(**kw: str) -> DoctorConfig:
    return DoctorConfig(env=dict(os.environ), **kw)  # type: ignore[arg-type]


def proxy(cfg: DoctorConfig) -> Status:
    return proxy_check(cfg.env, cfg.cluster_hosts()).status


def test_no_proxy_variables_pass(clean_env: pytest.MonkeyPatch) -> None:
    assert proxy(env_cfg(metadata="etcd://10.0.0.5:2379")) is Status.OK


@pytest.mark.parametrize("var", ["http_proxy", "HTTP_PROXY", "https_proxy", "ALL_PROXY"])
def test_proxy_capturing_cluster_hosts_fails(clean_env: pytest.MonkeyPatch, var: str) -> None:
    clean_env.setenv(var, "http://proxy.corp:3128")
    cfg = env_cfg(metadata="etcd://10.0.0.5:2379,10.0.0.6:2379", master="10.0.0.7:50051")
    check = proxy_check(cfg.env, cfg.cluster_hosts())
    assert check.status is Status.FAIL and var in check.evidence
    assert check.data["captured"] == ["10.0.0.5", "10.0.0.6", "10.0.0.7"]
    assert "no_proxy=10.0.0.5,10.0.0.6,10.0.0.7" in check.fix


@pytest.mark.parametrize("no_proxy, status", [
    ("10.0.0.0/8", Status.OK),
    ("10.0.0.5,10.0.0.7", Status.OK),
    ("*", Status.OK),
    ("10.0.0.5", Status.FAIL),  # the master is left out
    ("192.168.0.0/16", Status.FAIL),
])
def test_no_proxy_coverage(clean_env: pytest.MonkeyPatch, no_proxy: str, status: Status) -> None:
    clean_env.setenv("http_proxy", "http://proxy.corp:3128")
    clean_env.setenv("no_proxy", no_proxy)
    assert proxy(env_cfg(metadata="http://10.0.0.5:8080/metadata",
                         master="10.0.0.7:50051")) is status


def test_no_proxy_domain_suffix(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("HTTPS_PROXY", "http://proxy.corp:3128")
    clean_env.setenv("NO_PROXY", ".cluster.local")
    assert proxy(env_cfg(metadata="etcd://etcd-0.cluster.local:2379")) is Status.OK
    assert proxy(env_cfg(metadata="etcd://etcd-0.example.com:2379")) is Status.FAIL


def test_proxy_without_known_hosts_warns(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("all_proxy", "socks5://proxy.corp:1080")
    assert proxy(env_cfg()) is Status.WARN


def test_hostname_resolution() -> None:
    local = hostname_check("localhost", remote=False)
    assert local.status is Status.WARN and "loopback" in local.evidence
    remote = hostname_check("localhost", remote=True)
    assert remote.status is Status.FAIL and "--advertise" in remote.fix
    assert hostname_check("no-such-host.invalid", remote=True).status is Status.FAIL
    name = socket.gethostname()
    addrs = {str(a[4][0]) for a in socket.getaddrinfo(name, None)}
    live = hostname_check(name, remote=True)
    expected = Status.OK if any(not a.startswith("127.") and a != "::1" for a in addrs) \
        else Status.FAIL
    assert live.status is expected


def test_port_held_by_another_socket() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        held = port_check("127.0.0.1", port)
        assert held.status is Status.FAIL and "held by another socket" in held.evidence
    assert port_check("127.0.0.1", port).status is Status.OK  # released
    assert port_check("127.0.0.1", 0).status is Status.OK
    foreign = port_check("203.0.113.9", 0)  # TEST-NET-3: not an address of this host
    assert foreign.status is Status.FAIL and "cannot bind" in foreign.evidence


def test_plugins_loaded_broken_and_disabled() -> None:
    eps = [*md.entry_points(group="mooncake.transports"),
           md.EntryPoint("broken", "no_such_module_xyz:Transport", "mooncake.transports")]
    checks = {c.name: c for c in plugin_checks(Registry(eps))}
    assert checks["plugin tcp"].status is Status.OK
    assert checks["plugin broken"].status is Status.FAIL
    assert "no_such_module_xyz" in checks["plugin broken"].evidence
    only = {c.name: c for c in plugin_checks(Registry(eps, only=["shm"]))}
    assert only["plugin tcp"].status is Status.SKIPPED


def test_python_torch_and_pyverbs() -> None:
    assert python_check((3, 9, 18)).status is Status.FAIL
    assert python_check().status is Status.OK
    torch = torch_check()
    assert torch.status is Status.OK and torch.data["version"]
    try:
        import pyverbs  # noqa: F401
        have = True
    except ImportError:
        have = False
    with_devices = pyverbs_check(DoctorConfig(root=str(SYSFS / "healthy_roce"), env={}))
    assert with_devices.status is (Status.OK if have else Status.SKIPPED)
    if not have:  # optional for doctor alone: no claim that a transport needs it
        assert "transfers do not need it" in with_devices.evidence
        assert "cannot run" not in with_devices.evidence
    without = pyverbs_check(DoctorConfig(root=str(SYSFS / "healthy_roce" / "dev"), env={}))
    assert without.status is (Status.OK if have else Status.SKIPPED)


def test_the_streamed_copy_is_reported_built_or_missing_with_its_fix() -> None:
    built = native_check()  # this tree is installed by setup.sh, which has a C compiler
    assert built.status is Status.OK and built.data == {"streamed": True}
    missing = native_check(False, "No module named 'mooncake_cli.native.streamcopy'")
    assert missing.status is Status.WARN and "memmove" in missing.evidence
    assert "development VM" in missing.evidence  # a figure from one machine says so
    assert "streamcopy" in missing.evidence and "C compiler" in missing.fix


def test_kernel_copies_are_probed_for_real() -> None:
    """A real child process's private memory, read as shm reads it (root or ptrace_scope 0
    here: allowed)."""
    from mooncake_cli.doctor.environment import kernel_copy_check, probe_kernel_copy

    assert probe_kernel_copy() is None
    c = kernel_copy_check(probe_kernel_copy, 1)
    assert c.status is Status.OK and "process_vm_writev" in c.evidence


def test_refused_kernel_copies_warn_with_the_fix() -> None:
    from mooncake_cli.doctor.environment import kernel_copy_check

    c = kernel_copy_check(lambda: "Operation not permitted", 1)
    assert c.status is Status.WARN and "go over tcp" in c.evidence
    assert "ptrace_scope=0" in (c.fix or "") and c.data == {"ptrace_scope": 1}
    assert "same user" in (kernel_copy_check(lambda: "no", 0).fix or "")
