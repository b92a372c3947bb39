"""The relay over real engines on loopback (tcp): data staged in a third engine's buffer
arrives intact both ways, and the relay holds to the engine's rules: the secret first, its
buffer written only through a lease's capability, nothing forwarded into its own segment."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from mooncake_cli.interfaces import TransferError
from mooncake_cli.transfer import relay_wire
from mooncake_cli.transfer.batch import Op, State, TransferRequest
from mooncake_cli.transfer.relay_agent import RelayAgent
from mooncake_cli.transfer.relay_client import Relays
from tests.conftest import wait_for

MiB = 1 << 20
SECRET = "relay-secret"


@pytest.fixture
def hosts(make_engine: Any) -> Iterator[tuple[Any, Any, Any, RelayAgent]]:
    a, b, c = (make_engine(secret=SECRET, transport="tcp") for _ in range(3))
    agent = RelayAgent(b, secret=SECRET, slots=8, chunk=MiB)
    yield a, b, c, agent
    agent.close()


def test_write_and_read_through_the_relay_arrive_intact(hosts: Any) -> None:
    a, _b, c, agent = hosts
    size = 10 * MiB + 12345  # not a whole number of chunks
    data = os.urandom(size)
    src = a.register(bytearray(data))
    dst = c.register(bytearray(size))
    relays = Relays(a, [agent.address], SECRET)
    try:
        plan, seconds = relays.write(src, 0, c.name, dst.base, size, via=agent.address)
        assert plan.via == agent.address and seconds > 0
        assert bytes(dst.view) == data
        back = a.register(bytearray(size))
        relays.read(back, 0, c.name, dst.base, size, via=agent.address)
        assert bytes(back.view) == data
    finally:
        relays.close()
    # the relay's engine moved the bytes to and from c: its statistics say so
    moved = agent.info([])["links"][c.name]
    assert moved["write"]["bytes"] == size and moved["read"]["bytes"] == size


def test_the_plan_on_loopback_measures_every_link(hosts: Any) -> None:
    a, b, c, agent = hosts
    dst = c.register(bytearray(16 * MiB))
    relays = Relays(a, [agent.address], SECRET)
    try:
        plan = relays.plan(Op.WRITE, c.name, dst.base, 16 * MiB)
    finally:
        relays.close()
    assert set(plan.relay_s) == {agent.address} and plan.direct_s > 0
    assert plan.via in (None, agent.address)
    assert c.name in agent.measured  # the relay probed its own link to c


def _raw(address: str, secret: str | None) -> relay_wire.RelayConnection:
    return relay_wire.RelayConnection(address, secret, 5.0)


def test_the_relay_keeps_the_engines_rules(hosts: Any) -> None:
    a, b, c, agent = hosts
    with pytest.raises(TransferError, match="refused our secret"):
        _raw(agent.address, "wrong")
    with pytest.raises(TransferError, match="requires the cluster secret"):
        _raw(agent.address, None)
    with _raw(agent.address, SECRET) as conn:
        with pytest.raises(TransferError, match="forward needs a lease first"):
            conn.call({"op": "forward", "slot": 0, "length": 1, "target": c.name})
        with pytest.raises(TransferError, match="unknown relay op 'format'"):
            conn.call({"op": "format"})
        with pytest.raises(TransferError, match="info names at most 256 hosts"):
            conn.call({"op": "info", "hosts": ["127.0.0.1"] * 257})
        with pytest.raises(TransferError, match="a lease holds 1 to 8 slots, not 99"):
            conn.call({"op": "lease", "slots": 99})
        lease = conn.call({"op": "lease", "slots": 2})
        with pytest.raises(TransferError, match="not its own"):
            conn.call({"op": "forward", "slot": 0, "length": 1, "target": b.name})
        with pytest.raises(TransferError, match="slot 5 is not one of this lease's 2"):
            conn.call({"op": "forward", "slot": 5, "length": 1, "target": c.name})
        with pytest.raises(TransferError, match="malformed forward request"):
            conn.call({"op": "forward", "slot": 0, "target": c.name})
        # the buffer takes a write with the lease's capability, and refuses one without
        src = a.register(bytearray(b"x" * 4096))
        off = int(lease["offsets"][0])
        plain = TransferRequest(Op.WRITE, src, 0, b.name, off, 4096)
        status = a.submit([plain]).wait(10)[0]
        assert status.state is State.FAILED and "guarded" in status.reason
        capped = TransferRequest(Op.WRITE, src, 0, b.name, off, 4096,
                                 bytes.fromhex(lease["cap"]))
        assert a.submit([capped]).wait(10)[0].state is State.COMPLETED
        other = int(lease["offsets"][1]) + MiB  # the slot after this lease's two
        assert other < agent.region.base + agent.region.length
        wrong = TransferRequest(Op.WRITE, src, 0, b.name, other, 4096,
                                bytes.fromhex(lease["cap"]))
        status = a.submit([wrong]).wait(10)[0]
        assert status.state is State.FAILED and "does not cover" in status.reason
        assert agent.info([])["free"] == agent.slots - 2
    # the lease goes back once the relay sees the close
    wait_for(lambda: agent.info([])["free"] == agent.slots, 10, 0.01,
             "the lease to go back with its connection")


def test_a_small_transfer_goes_direct_without_measuring(hosts: Any) -> None:
    a, _b, c, agent = hosts
    data = os.urandom(MiB)
    src = a.register(bytearray(data))
    dst = c.register(bytearray(MiB))
    relays = Relays(a, [agent.address], SECRET)
    try:
        plan, _ = relays.write(src, 0, c.name, dst.base, MiB)
        assert plan.via is None and "below" in plan.why
        assert relays._conns == {} and agent.measured == {}  # nothing probed, no lease
    finally:
        relays.close()
    assert bytes(dst.view) == data
