"""A store spread over three testbed hosts serves puts and gets across shaped links: the master
on a, a store client on each of a, b and c (10 Gbit a-b, 1 Gbit a-c, 100 Mbit b-c), each putting
objects into its own segment; then every client reads every object back, byte for byte, its
transfer engine reading each other host's objects from that host's segment over the link."""

from __future__ import annotations

import secrets
import sys
from collections.abc import Iterator

import pytest

from mooncake_cli.testbed import bed as testbed_bed
from mooncake_cli.testbed.state import Testbed
from tests.helpers import testbed
from tests.helpers.store_procs import Proc, proc_list

pytestmark = pytest.mark.timeout(300)
bed = testbed.fixture("a,b,c", "a-b=10gbit,a-c=1gbit,b-c=100mbit")
HOSTS = ("a", "b", "c")
SIZE = 256 << 10


@pytest.fixture
def clients(bed: Testbed) -> Iterator[dict[str, Proc]]:
    secret = secrets.token_hex(16)

    def in_host(host: str, argv: list[str]) -> Proc:
        full, env = testbed_bed.exec_argv(bed, host, argv)
        return Proc(full, {**env, "MOONCAKE_SECRET": secret})

    for made in proc_list():
        master = in_host("a", [sys.executable, "-m", "mooncake_cli", "--json", "store",
                               "master", "--host", bed.address("a"), "--port", "0"])
        made.append(master)
        for h in HOSTS:
            made.append(in_host(h, [sys.executable, "-m", "tests.helpers.testbed_store",
                                    str(master.ready["address"])]))
        yield dict(zip(HOSTS, made[1:], strict=True))


def test_puts_and_gets_across_three_hosts(clients: dict[str, Proc]) -> None:
    keys = {h: [f"{h}/object-{i}" for i in range(6)] for h in HOSTS}
    for h, c in clients.items():
        assert c.ask(cmd="put", keys=keys[h], size=SIZE)["ok"], h
    segment = {h: c.ready["segment"] for h, c in clients.items()}
    every = [k for h in HOSTS for k in keys[h]]
    for h, c in clients.items():
        got = c.ask(cmd="get", keys=every)
        assert got["good"] == every, (h, got)
        assert got["replicas"] == {k: [segment[k.split("/")[0]]] for k in every}, h
        others = {segment[o]: 6 * SIZE for o in HOSTS if o != h}
        assert got["read_from"] == others, (h, got["read_from"])
