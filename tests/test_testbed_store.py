"""A store spread over three testbed hosts serves puts and gets across shaped links: the master
on a, a store client on each of a, b and c (10 Gbit a-b, 1 Gbit a-c, 100 Mbit b-c), each putting
objects into its own segment; then every client reads every object back, byte for byte, its
transfer engine reading each other host's objects from that host's segment over the link."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from mooncake_cli.testbed import bed as testbed_bed
from mooncake_cli.testbed.state import Testbed
from tests.helpers import testbed
from tests.helpers.procs import read_line, stop
from tests.helpers.store_procs import REPO

pytestmark = pytest.mark.timeout(300)
bed = testbed.fixture("a,b,c", "a-b=10gbit,a-c=1gbit,b-c=100mbit")
HOSTS = ("a", "b", "c")
SIZE = 256 << 10


class InHost:
    """A process in a testbed host, answering one JSON line per JSON command."""

    def __init__(self, tb: Testbed, host: str, argv: list[str], secret: str) -> None:
        full, env = testbed_bed.exec_argv(tb, host, argv)
        self.proc = subprocess.Popen(full, cwd=REPO, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE,
                                     env={**os.environ, **env, "MOONCAKE_SECRET": secret})
        self.ready = read_line(self.proc, 120)

    def ask(self, **cmd: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd).encode() + b"\n")
        self.proc.stdin.flush()
        return read_line(self.proc, 120)


@pytest.fixture
def clients(bed: Testbed) -> Iterator[dict[str, InHost]]:
    secret = secrets.token_hex(16)
    made: list[InHost] = []
    try:
        master = InHost(bed, "a", [sys.executable, "-m", "mooncake_cli", "--json", "store",
                                   "master", "--host", bed.address("a"), "--port", "0"], secret)
        made.append(master)
        for h in HOSTS:
            made.append(InHost(bed, h, [sys.executable, "-m", "tests.helpers.testbed_store",
                                        str(master.ready["address"])], secret))
        yield dict(zip(HOSTS, made[1:], strict=True))
    finally:
        for p in reversed(made):
            if p.proc.stdin is not None:
                p.proc.stdin.close()
            stop(p.proc, 30)


def test_puts_and_gets_across_three_hosts(clients: dict[str, InHost]) -> None:
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
