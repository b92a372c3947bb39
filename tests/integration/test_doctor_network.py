"""Network checks: ephemeral range and TIME_WAIT (captured trees and this machine's real
sockets), the live loopback transfer, and a probe plus bandwidth test to a real target."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest

from mooncake_cli.doctor import DoctorConfig, Status
from mooncake_cli.doctor.network import loopback_check, peer_checks, range_check, time_wait_check
from tests.conftest import free_port, wait_for

pytestmark = pytest.mark.timeout(120)
SYSFS = Path(__file__).parent.parent / "data" / "sysfs"


def test_port_range_from_captured_trees() -> None:
    ok = range_check(DoctorConfig(root=str(SYSFS / "healthy_roce"), env={}))
    assert ok.status is Status.OK and ok.data == {"low": 32768, "high": 60999}
    narrow = range_check(DoctorConfig(root=str(SYSFS / "constrained"), env={}))
    assert narrow.status is Status.WARN and "100 ports" in narrow.evidence
    inside = range_check(DoctorConfig(root=str(SYSFS / "healthy_roce"), port=40000, env={}))
    assert inside.status is Status.WARN and "ip_local_reserved_ports=40000" in inside.fix


def test_time_wait_exhaustion_from_a_captured_tree() -> None:
    bad = time_wait_check(DoctorConfig(root=str(SYSFS / "constrained"), env={}))
    assert bad.status is Status.FAIL and bad.data["time_wait"] == 95
    good = time_wait_check(DoctorConfig(root=str(SYSFS / "healthy_roce"), env={}))
    assert good.status is Status.OK and good.data["time_wait"] == 3


def _count() -> int:
    return int(time_wait_check(DoctorConfig(env={})).data["time_wait"])


def test_time_wait_counts_real_sockets() -> None:
    """Close a connection from the client side: the client's end sits in TIME_WAIT."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        port = server.getsockname()[1]
        clients = []
        for _ in range(5):
            c = socket.create_connection(("127.0.0.1", port))
            peer, _ = server.accept()
            clients.append((c, peer))
        for c, peer in clients:
            c.close()  # active close: TIME_WAIT on this side
            peer.close()
        needle = f":{port:04X}"

        def waiting() -> int:
            rows = Path("/proc/net/tcp").read_text().splitlines()[1:]
            return sum(1 for r in rows if r.split()[3] == "06" and needle in r.split()[2])

        wait_for(lambda: waiting() >= 5, 10, what="five TIME_WAIT sockets")
        assert _count() >= 5


def test_loopback_transfer_through_the_engine() -> None:
    check = loopback_check(DoctorConfig(env={}))
    assert check.status is Status.OK and check.data["bytes"] == 8 << 20


def test_loopback_fails_when_tcp_is_disabled() -> None:
    check = loopback_check(DoctorConfig(env={"MOONCAKE_PLUGINS": "shm"}))
    assert check.status is Status.FAIL and "MOONCAKE_PLUGINS" in check.evidence
    assert loopback_check(DoctorConfig(env={}, loopback=False)).status is Status.SKIPPED


def test_peer_probe_and_bandwidth(spawn_target: Any) -> None:
    target = spawn_target(8 << 20)
    probe, bw = peer_checks(DoctorConfig(peer=target.segment, env={}))
    assert probe.status is Status.OK and target.segment in probe.evidence
    assert bw.status is Status.OK and bw.data["verified"] is True and bw.data["bytes"] > 0


def test_dead_peer_fails() -> None:
    port = free_port()
    (only,) = peer_checks(DoctorConfig(peer=f"127.0.0.1:{port}", env={}, timeout=2))
    assert only.status is Status.FAIL and f"127.0.0.1:{port}" in only.evidence
    assert peer_checks(DoctorConfig(env={}))[0].status is Status.SKIPPED
