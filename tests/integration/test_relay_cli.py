"""The relay from the command line and in doctor, against real engines and relays on loopback
(tcp): `transfer write --relay --via`, its one-line errors, and `doctor --group topology`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from mooncake_cli.doctor.check import DoctorConfig, Status
from mooncake_cli.doctor.topology import checks
from mooncake_cli.transfer.relay_agent import RelayAgent

MiB = 1 << 20
SECRET = "relay-cli-secret"


@pytest.fixture
def hosts(make_engine: Any) -> Iterator[tuple[Any, Any, RelayAgent, RelayAgent]]:
    b, c = (make_engine(secret=SECRET, transport="tcp") for _ in range(2))
    agents = [RelayAgent(e, secret=SECRET, slots=4, chunk=MiB) for e in (b, c)]
    yield b, c, agents[0], agents[1]
    for agent in agents:
        agent.close()


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mooncake_cli", "--json", *args],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "MOONCAKE_SECRET": SECRET})


def test_write_through_a_relay_and_direct(hosts: Any, tmp_path: Any) -> None:
    _b, c, relay, _ = hosts
    dst = c.register(bytearray(12 * MiB))
    for via, path in ((relay.address, relay.address), ("direct", None)):
        data = os.urandom(10 * MiB)
        (tmp_path / "data").write_bytes(data)
        done = cli("transfer", "write", str(tmp_path / "data"), "--target", c.name, "--offset",
                   str(dst.base), "--relay", relay.address, "--via", via, "--transport", "tcp")
        assert done.returncode == 0, done.stderr
        event = json.loads(done.stdout)
        assert (event["relay"], event["bytes"]) == (path, len(data))
        assert bytes(dst.view[:len(data)]) == data


def test_errors_are_one_line(hosts: Any, tmp_path: Any) -> None:
    _b, c, relay, _ = hosts
    dst = c.register(bytearray(12 * MiB))
    (tmp_path / "data").write_bytes(bytes(10 * MiB))
    for via, error in (("nowhere", "error: bad relay address 'nowhere': use HOST:PORT"),
                       ("127.0.0.1:1", "error: cannot connect to the relay at 127.0.0.1:1: "
                                       "Connection refused")):
        done = cli("transfer", "write", str(tmp_path / "data"), "--target", c.name,
                   "--offset", str(dst.base), "--via", via, "--transport", "tcp")
        assert done.returncode != 0 and done.stderr.strip() == error, done.stderr


def test_doctor_topology_on_loopback(hosts: Any) -> None:
    _b, _c, one, two = hosts
    assert [(x.status, x.evidence) for x in checks(DoctorConfig(loopback=False))] == [
        (Status.SKIPPED, "no --relay given")]
    got = checks(DoctorConfig(relays=(one.address, two.address, "127.0.0.1:1"), secret=SECRET,
                              loopback=False))
    by_name = {x.name: x for x in got}
    dead = by_name["relay 127.0.0.1:1"]
    assert dead.status is Status.FAIL and "Connection refused" in dead.evidence
    matrix = by_name["link matrix"]
    assert matrix.status is Status.OK
    assert set(matrix.data["matrix"]) == {one.address, two.address}
    assert matrix.data["matrix"][one.address][two.address]["bandwidth_bytes_per_s"] > 0
    mtu = by_name[f"MTU {one.address} / {two.address}"]
    assert mtu.status is Status.OK and mtu.data["mtu"][0] == mtu.data["mtu"][1] > 0
    done = cli("doctor", "--group", "topology", "--relay", "nowhere")
    assert (done.returncode, done.stderr.strip()) == (
        2, "error: bad --relay 'nowhere': expected HOST:PORT")
