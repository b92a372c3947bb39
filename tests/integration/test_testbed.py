"""The testbed on real namespaces: 4 hosts, d reachable only through c; every host reaches every
address of every other host; shaped links carry their rate; `exec` runs in the named host's
namespace; `up` replaces, `down` removes everything the prefix made and nothing else."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from mooncake_cli.testbed import netns, stream
from mooncake_cli.testbed.state import Testbed, state_path
from tests.conftest import wait_for
from tests.helpers import testbed

LINKS = "a-b=1gbit,a-c=10gbit,b-c=25gbit,c-d=100mbit/mtu=1500:1400"
bed = testbed.fixture("4", LINKS)


def cli(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, "-m", "mooncake_cli", *args], capture_output=True,
                          text=True, timeout=60)
    if check:
        assert done.returncode == 0, done.stderr
    return done


def test_every_host_reaches_every_address_of_every_other(bed: Testbed) -> None:
    listeners = {h: stream.Listener(bed, h) for h in bed.hosts}
    try:
        for src in bed.hosts:
            for dst in bed.hosts:
                if dst == src:
                    continue
                addrs = [a["address"] for a in bed.addresses(dst)]
                got = stream.connect(bed, src, listeners[dst].port, addrs)
                assert got == {a: "ok" for a in addrs}, (src, dst, got)
    finally:
        for li in listeners.values():
            li.close()


def _route_dev(bed: Testbed, host: str, addr: str) -> str:
    out = netns.run(["ip", "-n", bed.netns(host), "-j", "route", "get", addr])
    return str(json.loads(out)[0]["dev"])


def test_direct_links_are_used_and_d_goes_through_c(bed: Testbed) -> None:
    # b's address on b-c is reached from a over a-b, not through c
    bc = bed.link_between("b", "c")
    assert bc is not None
    assert _route_dev(bed, "a", bc.addr("b")) == "mctt-b"
    assert _route_dev(bed, "d", bed.address("a")) == "mctt-c"
    assert bed.forwarders == ["c"]


def _ratio(bed: Testbed, src: str, dst: str) -> float:
    link = bed.link_between(src, dst)
    assert link is not None
    got = stream.measure(bed, src, dst, 3.0, dst_addr=link.addr(dst))
    return got.bits_per_s / link.rate_bps


def test_shaped_links_carry_their_rate(bed: Testbed) -> None:
    # 100 Mbit and 1 Gbit are far below what this host's CPUs move over a veth, so the
    # shaping alone sets the speed
    assert 0.7 <= _ratio(bed, "d", "c") <= 1.05
    assert 0.7 <= _ratio(bed, "a", "b") <= 1.05


def test_exec_runs_in_the_hosts_namespace(bed: Testbed) -> None:
    done = cli("bench", "testbed", "exec", "--prefix", "mctt", "b", "--",
               "ip", "-j", "-4", "addr", "show")
    found = {a["local"] for i in json.loads(done.stdout) for a in i["addr_info"]}
    assert found == {"127.0.0.1"} | {a["address"] for a in bed.addresses("b")}
    done = cli("bench", "testbed", "exec", "--prefix", "mctt", "--bind", "d", "--",
               "sh", "-c", "echo $MOONCAKE_TESTBED_HOST $MOONCAKE_TRANSFER_HOST "
               "$MOONCAKE_TRANSFER_TRANSPORT")
    assert done.stdout.split() == ["d", bed.address("d"), "tcp"]  # never shm between hosts


def test_status_lists_each_hosts_addresses_and_rates(bed: Testbed) -> None:
    st = json.loads(cli("--json", "bench", "testbed", "status", "--prefix", "mctt").stdout)
    assert st["up"] is True
    assert [h["host"] for h in st["hosts"]] == ["a", "b", "c", "d"]
    c = next(h for h in st["hosts"] if h["host"] == "c")
    assert [(a["peer"], a["rate"]) for a in c["addresses"]] == [
        ("a", "10gbit"), ("b", "25gbit"), ("d", "100mbit")]
    for h in st["hosts"]:
        for a in h["addresses"]:
            assert a["present"] and a["shaped_bps"] == a["rate_bps"], a
            assert a["mtu_now"] == a["mtu"], a
    mtus = {(h["host"], a["peer"]): a["mtu_now"] for h in st["hosts"] for a in h["addresses"]}
    assert (mtus[("c", "d")], mtus[("d", "c")], mtus[("a", "b")]) == (1500, 1400, 1500)


def _root_view() -> tuple[str, str]:
    """The root namespace's interfaces and routes."""
    return netns.run(["ip", "-o", "link"]), netns.run(["ip", "route"])


def test_up_twice_replaces_and_down_removes_only_its_own(bed: Testbed) -> None:
    root = _root_view()
    cli("bench", "testbed", "up", "--prefix", "mctu", "--hosts", "3")
    assert sorted(n for n in netns.namespaces() if n.startswith("mctu-")) == \
        ["mctu-a", "mctu-b", "mctu-c"]
    cli("bench", "testbed", "up", "--prefix", "mctu", "--hosts", "x,y", "--links", "x-y=1gbit")
    assert sorted(n for n in netns.namespaces() if n.startswith("mctu-")) == ["mctu-x", "mctu-y"]
    st = json.loads(cli("--json", "bench", "testbed", "status", "--prefix", "mctu").stdout)
    assert [h["host"] for h in st["hosts"]] == ["x", "y"] and st["up"]
    assert _root_view() == root  # nothing in the root namespace changed
    left = subprocess.Popen([sys.executable, "-m", "mooncake_cli", "bench", "testbed", "exec",
                             "--prefix", "mctu", "x", "--", "sleep", "600"])
    try:
        wait_for(lambda: str(left.pid) in netns.run(["ip", "netns", "pids", "mctu-x"]).split(),
                 30, 0.05, "exec to enter mctu-x")
        done = cli("bench", "testbed", "down", "--prefix", "mctu")
        assert left.wait(timeout=10) == -9  # down killed what still ran in the namespace
    finally:
        if left.poll() is None:
            left.kill()
    assert "mctu-x" in done.stdout and "mctu-y" in done.stdout
    assert not [n for n in netns.namespaces() if n.startswith("mctu-")]
    assert not os.path.exists(state_path("mctu"))
    assert "mctu-" not in netns.run(["ip", "-o", "link"])
    # the module's testbed (another prefix) is untouched
    assert {f"mctt-{h}" for h in bed.hosts} <= set(netns.namespaces())


def test_errors_are_one_line(bed: Testbed) -> None:
    done = cli("bench", "testbed", "exec", "--prefix", "mctt", "zz", "--", "true", check=False)
    assert (done.returncode, done.stderr.strip()) == (
        2, "error: no host 'zz' in the testbed (hosts: a, b, c, d)")
    done = cli("bench", "testbed", "exec", "--prefix", "mctv", "a", "--", "true", check=False)
    assert done.returncode == 2
    assert done.stderr.startswith("error: no testbed is up (no /run/mooncake-testbed-mctv.json)")
    done = cli("bench", "testbed", "up", "--prefix", "mctu", "--links", "a-z=1gbit",
               check=False)
    assert done.returncode == 2
    assert done.stderr.strip() == "error: link a-z: no host 'z' (hosts: a, b, c)"
    # root without capabilities: `ip netns add` is refused
    done = subprocess.run(["setpriv", "--inh-caps=-all", "--bounding-set=-all",
                           sys.executable, "-m", "mooncake_cli", "bench", "testbed", "up",
                           "--prefix", "mctu"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: `ip netns add mctu-a` failed:")
    assert not [n for n in netns.namespaces() if n.startswith("mctu-")]
