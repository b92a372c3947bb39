"""Relays and the link matrix on a real testbed: hosts a, b, c, each serving a segment and a
relay; a writes 32 MiB to c directly and through b's relay (twice each, the faster counts),
then as the plan chooses (tests/helpers/relay_run.py). With a-c at
100 Mbit and a-b, b-c at 1 Gbit the relay is faster and chosen; with a-c at 10 Gbit direct
is faster and chosen. `doctor --group topology` from a reports the measured matrix and flags
the MTU mismatch of b-c (c's end 1400). The namespaces are gone after each testbed."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from mooncake_cli.bench.stats import Child
from mooncake_cli.testbed import bed as testbed_bed
from mooncake_cli.testbed import netns
from mooncake_cli.testbed.state import Testbed
from tests.helpers import testbed

MOONCAKE = [sys.executable, "-m", "mooncake_cli", "--json"]
MiB = 1 << 20
SIZE = 32 * MiB
ENGINE_PORT, RELAY_PORT = 7000, 7100
LINKS = {"slow": "a-b=1gbit,a-c=100mbit,b-c=1gbit/mtu=1500:1400",
         "fast": "a-b=1gbit,a-c=10gbit,b-c=1gbit/mtu=1500:1400"}
SECRET = {"MOONCAKE_SECRET": secrets.token_hex(16)}
PREFIX = "mctr"  # not the helper's mctt: other modules' testbeds may be up meanwhile


def _run(tb: Testbed, host: str, args: list[str], timeout: float = 120) -> dict[str, Any]:
    argv, env = testbed_bed.exec_argv(tb, host, MOONCAKE + args, bind=True)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **env, **SECRET})
    # 0 from doctor too: its topology checks here are ok or warn (b-c's MTU), never a
    # failure, which alone makes it exit 1
    assert done.returncode == 0, (done.stdout, done.stderr)
    return dict(json.loads(done.stdout))


@pytest.fixture(scope="module", params=sorted(LINKS))
def cluster(request: pytest.FixtureRequest) -> Iterator[tuple[str, Testbed, dict[str, Any]]]:
    with testbed.running("3", LINKS[request.param], PREFIX) as tb:
        children = []
        try:
            ready = {}
            for h in tb.hosts:
                argv, env = testbed_bed.exec_argv(tb, h, MOONCAKE + [
                    "transfer", "serve", "--host", tb.address(h), "--port", str(ENGINE_PORT),
                    "--transport", "tcp", "--buffer-size", str(2 * SIZE),
                    "--relay-port", str(RELAY_PORT)], bind=True)
                children.append(Child(argv, f"transfer serve on {h}", {**env, **SECRET}))
                ready[h] = children[-1].line(timeout=60)
            yield request.param, tb, ready
        finally:
            for child in children:
                child.close()
    left = [n for n in netns.namespaces() if n.startswith(f"{PREFIX}-")]
    assert not left, f"namespaces left after the run: {left}"


def _arrived(tb: Testbed, ready: dict[str, Any], offset: int, tmp: str) -> str:
    """SHA-256 of c's SIZE bytes at `offset` (read inside c)."""
    c = ready["c"]
    out = os.path.join(tmp, "back")
    _run(tb, "c", ["transfer", "read", "--target", c["segment"], "--offset", str(offset),
                   "--length", str(SIZE), "-o", out, "--transport", "tcp"])
    with open(out, "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()


def test_a_relay_is_used_exactly_when_it_is_faster(cluster: Any, tmp_path: Any) -> None:
    kind, tb, ready = cluster
    relay, c = ready["b"]["relay"], ready["c"]
    argv, env = testbed_bed.exec_argv(tb, "a", [
        sys.executable, "-m", "tests.helpers.relay_run", c["segment"], str(c["offset"]),
        relay, str(SIZE)], bind=True)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=180,
                          env={**os.environ, **env, **SECRET})
    assert done.returncode == 0, done.stderr
    runs = json.loads(done.stdout)["runs"]
    # each path twice, the faster counts (the first opens connections)
    direct = min(r["seconds"] for r in runs if r["via"] == "direct" and r["relay"] is None)
    relayed = min(r["seconds"] for r in runs if r["via"] == relay and r["relay"] == relay)
    auto = runs[-1]
    relay_faster = relayed < direct
    assert relay_faster == (kind == "slow"), (kind, direct, relayed)
    assert (auto["relay"] == relay) == relay_faster, (direct, relayed, auto["plan"])
    if kind == "slow":  # 100 Mbit against two 1 Gbit hops: several times faster
        assert relayed < direct / 3, (direct, relayed)
    # the bytes arrived: c holds what the last write at each offset sent
    assert _arrived(tb, ready, auto["offset"], str(tmp_path)) == auto["sha256"]
    last_relayed = [r for r in runs if r["via"] == relay][-1]
    assert _arrived(tb, ready, last_relayed["offset"], str(tmp_path)) == \
        last_relayed["sha256"]


def test_doctor_reports_the_matrix_and_the_mtu_mismatch(cluster: Any) -> None:
    kind, tb, ready = cluster
    relays = [ready[h]["relay"] for h in tb.hosts]
    got = _run(tb, "a", ["doctor", "--group", "topology", *sum((["--relay", r] for r in relays),
                                                                [])])
    checks = {c["check"]: c for c in got["checks"]}
    matrix = checks["link matrix"]["data"]["matrix"]
    a, b, c = relays
    assert checks["link matrix"]["status"] == "ok"
    assert {(s, d) for s in matrix for d in matrix[s]} == {
        (x, y) for x in relays for y in relays if x != y}

    def rate(x: str, y: str) -> float:
        return float(matrix[x][y]["bandwidth_bytes_per_s"]) * 8

    for x, y in ((a, b), (b, a), (b, c), (c, b)):
        assert 0.5e9 <= rate(x, y) <= 1.05e9, (x, y, rate(x, y))
    if kind == "slow":
        assert 0.5e8 <= rate(a, c) <= 1.05e8 and 0.5e8 <= rate(c, a) <= 1.05e8
    else:
        assert rate(a, c) > 1.05e9 and rate(c, a) > 1.05e9
    assert all(matrix[x][y]["latency_s"] > 0 for x in matrix for y in matrix[x])
    mtu = {tuple(c["data"]["hosts"]): c for c in got["checks"] if c["check"].startswith("MTU")}
    assert (mtu[(b, c)]["status"], mtu[(b, c)]["data"]["mtu"]) == ("warn", [1500, 1400])
    assert "MTU mismatch" in mtu[(b, c)]["evidence"]
    assert [mtu[k]["status"] for k in ((a, b), (a, c))] == ["ok", "ok"]
