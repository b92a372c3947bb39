"""Memory checks: hugepages vs the planned segment, NUMA placement, free RAM; against captured
trees and against this machine's own /proc and /sys."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mooncake_cli.doctor import DoctorConfig, Status
from mooncake_cli.doctor.memory import (
    hugepage_check,
    hugepage_pools,
    meminfo,
    numa_check,
    numa_nodes,
    ram_check,
)

pytestmark = pytest.mark.timeout(60)
SYSFS = Path(__file__).parent.parent / "data" / "sysfs"


def cfg(case: str, size: int) -> DoctorConfig:
    return DoctorConfig(root=str(SYSFS / case), segment_size=size, env={})


def info(c: DoctorConfig) -> dict[str, int]:
    return meminfo(Path(c.path("proc/meminfo")).read_text())


def test_meminfo_of_this_machine_matches_the_kernel() -> None:
    live = meminfo(Path("/proc/meminfo").read_text())
    phys = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert abs(live["MemTotal"] - phys) < 1 << 20  # both are the kernel's totalram
    assert 0 < live["MemAvailable"] <= live["MemTotal"]


def test_hugepages_cover_or_not_the_segment() -> None:
    c = cfg("healthy_roce", 2 << 30)
    assert hugepage_pools(c) == {2 << 20: (2048, 2048), 1 << 30: (0, 0)}
    assert hugepage_check(c, info(c)).status is Status.OK  # 4 GiB free >= 2 GiB
    c = cfg("healthy_roce", 8 << 30)
    short = hugepage_check(c, info(c))
    assert short.status is Status.WARN
    # to have 4096 free 2 MiB pages with 2048 reserved and free, reserve 4096
    assert "echo 4096 > /sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages" in short.fix
    c = cfg("constrained", 1 << 20)
    assert hugepage_check(c, info(c)).status is Status.WARN  # 512 reserved, none free


def test_no_hugepages_reserved_is_not_a_problem(tmp_path: Path) -> None:
    pool = tmp_path / "sys/kernel/mm/hugepages/hugepages-2048kB"
    pool.mkdir(parents=True)
    (pool / "nr_hugepages").write_text("0\n")
    (pool / "free_hugepages").write_text("0\n")
    c = DoctorConfig(root=str(tmp_path), segment_size=1 << 30, env={})
    check = hugepage_check(c, {})
    assert check.status is Status.OK and "none reserved" in check.evidence
    empty = DoctorConfig(root=str(tmp_path / "sys/kernel"), env={})
    assert hugepage_check(empty, {}).status is Status.SKIPPED


def test_numa_layout_and_the_nic_node() -> None:
    c = cfg("healthy_roce", 1 << 30)
    nodes = numa_nodes(c)
    assert sorted(nodes) == [0, 1] and nodes[1][0] == "32-63,96-127"
    good = numa_check(c)
    assert good.status is Status.OK and "--cpunodebind=1 --membind=1" in good.evidence
    unknown = numa_check(cfg("constrained", 1 << 20))
    assert unknown.status is Status.WARN and "unknown" in unknown.evidence
    # node 1 has about 57 GiB free: a 100 GiB segment does not fit next to the NIC
    crowded = numa_check(cfg("healthy_roce", 100 << 30))
    assert crowded.status is Status.WARN and "node 1" in crowded.evidence


def test_numa_of_this_machine() -> None:
    c = DoctorConfig(env={})
    check = numa_check(c)
    if os.path.isdir("/sys/devices/system/node/node0"):
        assert check.status is Status.OK and "node 0" in check.evidence
    else:
        assert check.status is Status.SKIPPED


def test_free_ram_against_the_segment() -> None:
    c = cfg("healthy_roce", 8 << 30)
    assert ram_check(c, info(c)).status is Status.OK
    c = cfg("constrained", 8 << 30)  # 1.9 GiB available
    assert ram_check(c, info(c)).status is Status.FAIL
    c = cfg("constrained", 1800 << 20)  # fits, with under 20% headroom
    assert ram_check(c, info(c)).status is Status.WARN
    live = DoctorConfig(env={}, segment_size=1 << 20)
    assert ram_check(live, meminfo(Path("/proc/meminfo").read_text())).status is Status.OK
    huge = DoctorConfig(env={}, segment_size=1 << 50)
    assert ram_check(huge, meminfo(Path("/proc/meminfo").read_text())).status is Status.FAIL


def test_runner_runs_the_chosen_groups_in_order() -> None:
    from mooncake_cli.doctor.runner import GROUPS, run

    seen: list[str] = []
    checks = run(cfg("constrained", 8 << 30), ["rdma", "memory"], seen.append)
    assert seen == ["rdma", "memory"]
    groups = [c.group for c in checks]
    assert set(groups) == {"rdma", "memory"} and groups.index("memory") > groups.index("rdma")
    assert list(GROUPS)[0] == "install" and len(GROUPS) == 9 and "nixl" in GROUPS
