"""RDMA discovery and the RDMA doctor checks against captured sysfs trees of mlx5/mlx4 hosts
(tests/data/sysfs/<case>/): each case gives its recommendation, and no check passes where its
condition is not met."""

from __future__ import annotations

import resource
from pathlib import Path
from typing import Any

import pytest

from mooncake_cli.doctor import Check, DoctorConfig, Status
from mooncake_cli.doctor import rdma as rdma_checks
from mooncake_cli.doctor.rdma_limits import dev_check, gpu_check, max_mr_check, memlock_check
from mooncake_cli.rdma.discovery import discover, from_sysfs, recommend_gid, roce_mtu

pytestmark = pytest.mark.timeout(60)
SYSFS = Path(__file__).parent.parent / "data" / "sysfs"


def cfg(case: str, **kw: Any) -> DoctorConfig:
    return DoctorConfig(root=str(SYSFS / case), env={}, **kw)


def by_name(checks: list[Check], name: str) -> Check:
    found = [c for c in checks if c.name == name]
    assert len(found) == 1, [c.name for c in checks]
    return found[0]


def test_discovery_reads_a_roce_port() -> None:
    (dev,) = from_sysfs(str(SYSFS / "healthy_roce"))
    assert (dev.name, dev.hca_type, dev.numa_node, dev.netdevs) == ("mlx5_0", "MT4123", 1,
                                                                    ("eth2",))
    (port,) = dev.ports
    assert port.active and port.roce and port.phys_state == "LinkUp"
    assert (port.netdev, port.netdev_mtu, port.active_mtu) == ("eth2", 9000, 4096)
    assert [(g.index, g.type, g.ipv4) for g in port.gids] == [
        (0, "RoCE v1", None), (1, "RoCE v2", None),
        (2, "RoCE v1", "192.168.10.21"), (3, "RoCE v2", "192.168.10.21")]
    assert port.gids[0].link_local and not port.gids[3].link_local


def test_discovery_of_unknown_numa_and_infiniband() -> None:
    (mlx4,) = from_sysfs(str(SYSFS / "constrained"))
    assert mlx4.numa_node is None  # sysfs says -1
    (ib,) = from_sysfs(str(SYSFS / "infiniband"))
    assert ib.ports[0].link_layer == "InfiniBand" and ib.ports[0].active_mtu is None
    assert [g.type for g in ib.ports[0].gids] == ["IB"]
    assert from_sysfs("/nonexistent") == []
    # not the live root: pyverbs is never consulted for a captured tree
    assert discover(str(SYSFS / "healthy_roce"))[0].source == "sysfs"


def test_roce_mtu_follows_the_netdev() -> None:
    assert [roce_mtu(m) for m in (1500, 4200, 9000, 500)] == [1024, 4096, 4096, 256]
    assert roce_mtu(300) is None


@pytest.mark.parametrize("case, index, words", [
    ("healthy_roce", 3, "IPv4-mapped"),
    ("linklocal_v1", 0, "only RoCE v1"),
    ("infiniband", 0, "InfiniBand"),
])
def test_recommended_gid(case: str, index: int, words: str) -> None:
    port = from_sysfs(str(SYSFS / case))[0].ports[0]
    choice = recommend_gid(port)
    assert choice is not None and choice.index == index and words in choice.reason


def test_healthy_device_passes_every_port_check() -> None:
    checks = rdma_checks.checks(cfg("healthy_roce", peer_mtu=4096))
    assert by_name(checks, "devices").status is Status.OK
    assert by_name(checks, "mlx5_0/1 state").status is Status.OK
    mtu = by_name(checks, "mlx5_0/1 MTU")
    assert mtu.status is Status.OK and "4096" in mtu.evidence
    gid = by_name(checks, "mlx5_0/1 GID")
    assert gid.status is Status.OK and gid.data["recommended"] == 3
    assert "UCX_IB_GID_INDEX=3" in gid.fix  # UCX's variable: nixl is the RDMA path


def test_port_down_fails_with_the_link_fix() -> None:
    checks = rdma_checks.checks(cfg("port_down"))
    state = by_name(checks, "mlx5_0/1 state")
    assert state.status is Status.FAIL and "DOWN" in state.evidence
    assert "ip link set dev eth2 up" in state.fix
    assert not [c for c in checks if c.name in ("mlx5_0/1 MTU", "mlx5_0/1 GID")]


def test_mtu_mismatch_with_the_peer_fails_and_names_the_setting() -> None:
    mismatch = by_name(rdma_checks.checks(cfg("mtu_1024", peer_mtu=4096)), "mlx5_0/1 MTU")
    assert mismatch.status is Status.FAIL
    assert "1024" in mismatch.evidence and "4096" in mismatch.evidence
    assert "mtu 4192" in mismatch.fix and "UCX_IB_PATH_MTU=1024" in mismatch.fix
    same = by_name(rdma_checks.checks(cfg("mtu_1024", peer_mtu=1024)), "mlx5_0/1 MTU")
    assert same.status is Status.WARN and "jumbo" in same.evidence  # matches, but small
    bigger = by_name(rdma_checks.checks(cfg("healthy_roce", peer_mtu=1024)), "mlx5_0/1 MTU")
    assert bigger.status is Status.FAIL and "peer" in bigger.fix


def test_link_local_v1_only_table_warns_and_says_how_to_get_v2() -> None:
    gid = by_name(rdma_checks.checks(cfg("linklocal_v1")), "mlx5_0/1 GID")
    assert gid.status is Status.WARN and gid.data["recommended"] == 0
    assert "ip addr add" in gid.fix and "not routable" in gid.evidence


def test_gid_index_set_to_the_wrong_entry_warns() -> None:
    c = DoctorConfig(root=str(SYSFS / "healthy_roce"), env={"UCX_IB_GID_INDEX": "0"})
    gid = by_name(rdma_checks.checks(c), "mlx5_0/1 GID")
    assert gid.status is Status.WARN and "UCX_IB_GID_INDEX=3" in gid.fix
    for fine in ("3", "auto"):  # auto: UCX picks, as it does unset
        c = DoctorConfig(root=str(SYSFS / "healthy_roce"), env={"UCX_IB_GID_INDEX": fine})
        assert by_name(rdma_checks.checks(c), "mlx5_0/1 GID").status is Status.OK
    # a variable nothing reads is not taken for a setting
    c = DoctorConfig(root=str(SYSFS / "healthy_roce"), env={"MC_GID_INDEX": "0"})
    assert by_name(rdma_checks.checks(c), "mlx5_0/1 GID").status is Status.OK


def test_device_selection() -> None:
    missing = rdma_checks.checks(cfg("healthy_roce", device="mlx5_9"))
    assert [c.status for c in missing] == [Status.FAIL] and "mlx5_0" in missing[0].evidence
    assert by_name(rdma_checks.checks(cfg("healthy_roce", device="mlx5_0")),
                   "devices").status is Status.OK


def test_no_device_is_skipped_not_passed(tmp_path: Path) -> None:
    (only,) = rdma_checks.checks(DoctorConfig(root=str(tmp_path), env={}))
    assert only.status is Status.SKIPPED


def test_memlock_against_the_plan() -> None:
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    assert memlock_check(resource.RLIM_INFINITY, 1 << 40).status is Status.OK
    assert memlock_check(64 << 10, 1 << 20).status is Status.FAIL
    assert memlock_check(1 << 20, 1 << 20).status is Status.OK
    if soft != resource.RLIM_INFINITY:  # this process's real limit, both ways
        assert memlock_check(soft, soft + 1).status is Status.FAIL
        assert memlock_check(soft, soft).status is Status.OK


def test_mlx4_max_mr_size_from_module_parameters() -> None:
    c = cfg("constrained", segment_size=8 << 30)
    devices = from_sysfs(c.root)
    small = max_mr_check(devices, c)
    assert small.status is Status.FAIL and "2 GiB" in small.evidence
    assert "log_num_mtt" in small.fix
    assert max_mr_check(devices, cfg("constrained", segment_size=1 << 30)).status is Status.OK
    healthy = cfg("healthy_roce")
    assert max_mr_check(from_sysfs(healthy.root), healthy).status is Status.SKIPPED


def test_uverbs_access() -> None:
    assert dev_check(cfg("healthy_roce")).status is Status.OK
    missing = dev_check(cfg("constrained"))
    assert missing.status is Status.FAIL and "ib_uverbs" in missing.fix


def test_gpu_peer_memory(tmp_path: Path) -> None:
    assert gpu_check(cfg("healthy_roce")).status is Status.OK
    old = gpu_check(cfg("constrained"))
    assert old.status is Status.FAIL and "nvidia_peermem" in old.fix
    (tmp_path / "sys/module/nvidia").mkdir(parents=True)
    (tmp_path / "proc/sys/kernel").mkdir(parents=True)
    (tmp_path / "proc/sys/kernel/osrelease").write_text("6.5.0-1\n")
    assert gpu_check(DoctorConfig(root=str(tmp_path), env={})).status is Status.WARN
    assert gpu_check(DoctorConfig(root=str(SYSFS / "infiniband"),
                                  env={})).status is Status.OK
    (tmp_path / "sys/module/nvidia").rmdir()
    assert gpu_check(DoctorConfig(root=str(tmp_path), env={})).status is Status.SKIPPED
