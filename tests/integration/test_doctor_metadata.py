"""Metadata and master checks against real servers: etcd healthy, stopped, given the wrong URL
kind; the HTTP metadata server; a real store master up, down, with and without segments."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import etcd3gw
import pytest

from mooncake_cli.doctor import DoctorConfig, Status
from mooncake_cli.doctor import master as master_checks
from mooncake_cli.doctor import metadata as metadata_checks
from mooncake_cli.interfaces import SegmentDescriptor
from mooncake_cli.transfer.metadata import KEY_PREFIX
from tests.conftest import free_port, wait_for
from tests.helpers.store_procs import Proc, start_master, start_node

pytestmark = pytest.mark.timeout(120)


def run_meta(url: str, **kw: Any) -> dict[str, Any]:
    checks = metadata_checks.checks(DoctorConfig(metadata=url, env={}, timeout=3, **kw))
    return {c.name: c for c in checks}


def etcd_port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def test_healthy_etcd(etcd: str) -> None:
    port = etcd_port(etcd)
    checks = run_meta(etcd)
    assert [c.status for c in checks.values()] == [Status.OK] * 5, checks
    assert "etcd 3." in checks[f"etcd 127.0.0.1:{port}"].evidence
    assert checks["etcd put/get/delete"].status is Status.OK
    # loopback-only advertised URLs are fine on one host, a warning once peers are remote
    adv = run_meta(etcd, peer="10.1.2.3:12345")["etcd advertised URLs"]
    assert adv.status is Status.WARN and "--advertise-client-urls" in adv.fix


def test_stale_descriptor_is_listed(etcd: str) -> None:
    client = etcd3gw.client(host="127.0.0.1", port=etcd_port(etcd))
    dead = free_port()
    name = f"127.0.0.1:{dead}"
    key = KEY_PREFIX + name
    client.put(key, SegmentDescriptor(name, "127.0.0.1", dead, "boot", 1, False)
               .to_json().decode())
    try:
        stale = run_meta(etcd)["stale segments"]
        assert stale.status is Status.WARN and key in stale.evidence
        assert "never expires" in stale.evidence
    finally:
        client.delete(key)
    assert run_meta(etcd)["stale segments"].status is Status.OK


def test_live_descriptor_is_not_stale(etcd: str, spawn_target: Any) -> None:
    target = spawn_target(1 << 20, metadata=etcd, name="doctor-live")
    stale = run_meta(etcd)["stale segments"]
    assert stale.status is Status.OK and "doctor-live" in stale.data["segments"]
    target.stop()


def test_stopped_etcd_fails() -> None:
    port = free_port()
    checks = run_meta(f"etcd://127.0.0.1:{port}")
    bad = checks[f"etcd 127.0.0.1:{port}"]
    assert bad.status is Status.FAIL and "refused" in bad.evidence.lower()
    assert "etcd put/get/delete" not in checks


def test_http_url_at_etcds_port_names_etcd(etcd: str) -> None:
    port = etcd_port(etcd)
    check = run_meta(f"http://127.0.0.1:{port}/metadata")["http server"]
    assert check.status is Status.FAIL and "etcd's client port" in check.evidence
    assert f"etcd://127.0.0.1:{port}" in check.evidence


def test_etcd_url_at_an_http_metadata_server_names_it(metadata_server: Any) -> None:
    port = metadata_server.port
    check = run_meta(f"etcd://127.0.0.1:{port}")[f"etcd 127.0.0.1:{port}"]
    assert check.status is Status.FAIL and "HTTP metadata server" in check.evidence
    assert f"http://127.0.0.1:{port}/metadata" in check.evidence


def test_http_metadata_server(metadata_server: Any) -> None:
    checks = run_meta(metadata_server.url)
    assert checks["http server"].status is Status.OK
    assert checks["http put/get/delete"].status is Status.OK
    assert checks["stale segments"].status is Status.SKIPPED
    wrong = run_meta(f"http://127.0.0.1:{metadata_server.port}/nope")["http server"]
    assert wrong.status is Status.FAIL and "/metadata" in wrong.fix
    down = run_meta(f"http://127.0.0.1:{free_port()}/metadata")["http server"]
    assert down.status is Status.FAIL


def test_bad_and_absent_urls() -> None:
    bad = run_meta("ftp://x")
    assert [c.status for c in bad.values()] == [Status.FAIL]
    assert run_meta("etcd://")["url"].status is Status.FAIL
    assert run_meta("p2p")["metadata"].status is Status.SKIPPED


# -- the store master ---------------------------------------------------------------------------
@pytest.fixture
def master() -> Iterator[Proc]:
    m = start_master(0)
    yield m
    m.stop()


def run_master(address: str, **kw: Any) -> dict[str, Any]:
    checks = master_checks.checks(DoctorConfig(master=address, env={}, timeout=2, **kw))
    return {c.name: c for c in checks}


def test_etcd_url_at_a_master_is_not_http(master: Proc) -> None:
    port = int(master.ready["address"].rsplit(":", 1)[1])
    check = run_meta(f"etcd://127.0.0.1:{port}")[f"etcd 127.0.0.1:{port}"]
    assert check.status is Status.FAIL and "not an HTTP server" in check.evidence
    assert "ZeroMQ" in check.evidence
    http = run_meta(f"http://127.0.0.1:{port}/metadata")["http server"]
    assert http.status is Status.FAIL and "ZeroMQ" in http.evidence


def test_master_up_without_and_with_segments(master: Proc) -> None:
    address = master.ready["address"]
    checks = run_master(address)
    assert checks["reachable"].status is Status.OK
    assert checks["leader"].status is Status.OK and "no HA" in checks["leader"].evidence
    skew = checks["clock skew"]  # same host, same clock
    assert skew.status is Status.OK and abs(skew.data["skew_s"]) < 0.5
    assert checks["segments"].status is Status.FAIL  # nobody mounted memory yet
    node = start_node(address, segment_size=8 << 20)
    try:
        checks = run_master(address)
        assert checks["segments"].status is Status.OK
        cap = checks["capacity"]
        assert cap.status is Status.OK and cap.data["capacity"] == 8 << 20
    finally:
        node.stop()


def test_clock_skew_thresholds() -> None:
    ok = master_checks.skew_check(0.2, 0.001)
    warn = master_checks.skew_check(-1.5, 0.001)
    fail = master_checks.skew_check(8.0, 0.01)
    assert (ok.status, warn.status, fail.status) == (Status.OK, Status.WARN, Status.FAIL)
    assert "NTP" in warn.fix and "+8000.0 ms" in fail.evidence
    # a slow round trip makes the measurement uncertain: no alarm within the uncertainty
    assert master_checks.skew_check(0.9, 0.6).status is Status.OK


def test_master_with_a_secret_we_lack() -> None:
    m = start_master(0, "--secret", "s3cret")
    try:
        refused = run_master(m.ready["address"])["reachable"]
        assert refused.status is Status.FAIL and "--secret" in refused.fix
        assert run_master(m.ready["address"], secret="s3cret")["reachable"].status is Status.OK
    finally:
        m.stop()


def test_master_down_fails() -> None:
    checks = run_master(f"127.0.0.1:{free_port()}")
    assert list(checks) == ["reachable"] and checks["reachable"].status is Status.FAIL
    assert "mooncake store master" in checks["reachable"].fix


def test_no_master_is_skipped() -> None:
    (only,) = master_checks.checks(DoctorConfig(env={}))
    assert only.status is Status.SKIPPED


def test_ha_leader_and_standby(etcd: str) -> None:
    pytest.importorskip("mooncake_cli.store.ha.election")
    from tests.helpers.store_procs import start_ha_master

    ha = f"{etcd}/doctor-{free_port()}"
    first = start_ha_master(ha)
    try:
        def elected() -> dict[str, Any] | None:
            checks = run_master(ha)
            ok = "leader" in checks and checks["leader"].status is Status.OK
            return checks if ok else None

        lead = wait_for(elected, 30, interval=0.2, what="an elected leader")
        assert first.ready["address"] in lead["leader"].evidence  # type: ignore[index]
        second = start_ha_master(ha)
        try:
            standby = wait_for(lambda: (c := run_master(second.ready["address"])["leader"])
                               .status is Status.WARN and c, 30, interval=0.2,
                               what="the standby to see the leader")
            assert first.ready["address"] in standby.evidence  # type: ignore[attr-defined]
        finally:
            second.stop()
    finally:
        first.stop()
    assert run_master(f"etcd://127.0.0.1:{free_port()}/x")["reachable"].status is Status.FAIL
