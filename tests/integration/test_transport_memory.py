"""The in-memory transport (a test double for the engine, like httpx's MockTransport): the
engine's whole-batch path, per-request status, bounds refused before any byte moves, and
failures injected by a handler, all without sockets or a second process."""

from __future__ import annotations

import importlib.metadata as md
import os

import pytest

from mooncake_cli.registry import Registry
from mooncake_cli.testing.memory import MemoryChannel, MemoryTransport
from mooncake_cli.transfer.batch import Op, State, TransferRequest
from mooncake_cli.transfer.spi import BatchChannel, Endpoint, Transport

T, TIERS = "mooncake.transports", "mooncake.tiers"
MiB = 1 << 20


def registry() -> Registry:
    return Registry([md.EntryPoint("tcp", "mooncake_backends.tcp:TcpTransport", T),
                     md.EntryPoint("memory", "mooncake_cli.testing.memory:MemoryTransport", T),
                     md.EntryPoint("dram", "mooncake_backends.dram:DramTier", TIERS)])


@pytest.fixture
def pair(make_engine):
    reg = registry()
    tgt = make_engine(registry=reg)
    eng = make_engine(registry=reg, transport="memory")
    return reg.get(T, "memory"), tgt, eng


def test_it_implements_the_contract(pair) -> None:
    transport, tgt, eng = pair
    assert isinstance(transport, Transport)
    assert isinstance(eng.endpoints.by_name["memory"], Endpoint)
    assert "memory" in tgt.descriptor().extra
    region = tgt.allocate(MiB)
    assert eng.transport_for(tgt.name) == "memory"
    ch = eng._peer(tgt.name).acquire()
    assert isinstance(ch, MemoryChannel) and isinstance(ch, BatchChannel)
    eng._peer(tgt.name).release(ch)
    assert eng.transport_choices()[tgt.name] == ("memory", "memory: an engine of this process")
    assert region.length == MiB


def test_batch_is_handed_over_whole_with_per_request_status(pair) -> None:
    transport, tgt, eng = pair
    region = tgt.allocate(4 * MiB)
    data = os.urandom(4 * MiB)
    src = eng.register(bytearray(data))
    reqs = [TransferRequest(Op.WRITE, src, o, tgt.name, region.base + o, MiB)
            for o in range(0, 4 * MiB, MiB)]
    transport.handler = lambda s: "refused by the test" if s.start == 2 * MiB else None
    statuses = eng.submit(reqs).wait(5)
    assert [s.state for s in statuses] == [State.COMPLETED, State.COMPLETED, State.FAILED,
                                           State.COMPLETED]
    assert statuses[2].reason == "refused by the test" and statuses[2].transferred == 0
    assert [s.transferred for s in statuses if s.state is State.COMPLETED] == [MiB] * 3
    # a batched transport gets each request whole: never cut into slices
    assert sorted(s.length for s in transport.moved) == [MiB] * 3
    view = bytes(region.view)
    assert view[:2 * MiB] == data[:2 * MiB] and view[3 * MiB:] == data[3 * MiB:]
    assert view[2 * MiB:3 * MiB] == bytes(MiB)


def test_out_of_region_requests_never_reach_the_transport(pair) -> None:
    transport, tgt, eng = pair
    a = tgt.allocate(MiB)
    b = tgt.allocate(MiB)
    src = eng.register(bytearray(os.urandom(2 * MiB)))
    seen = []

    def record(s):
        seen.append(s)

    transport.handler = record
    reqs = [TransferRequest(Op.WRITE, src, 0, tgt.name, a.base + MiB - 16, 4096),  # spans a|b
            TransferRequest(Op.WRITE, src, 0, tgt.name, b.base + 2 * MiB, 16),  # past b
            TransferRequest(Op.WRITE, src, MiB, tgt.name, b.base, MiB)]  # fine
    statuses = eng.submit(reqs).wait(5)
    assert [s.state for s in statuses] == [State.FAILED, State.FAILED, State.COMPLETED]
    assert all("bounds" in s.reason for s in statuses[:2])
    assert [(s.remote_offset, s.length) for s in seen] == [(b.base, MiB)]
    assert bytes(a.view) == bytes(MiB)  # not even the in-bounds head of the first one moved


def test_read_back_and_zero_length(pair) -> None:
    _, tgt, eng = pair
    region = tgt.allocate(MiB)
    data = os.urandom(MiB)
    region.view[:] = data
    dst = eng.register(bytearray(MiB))
    st = eng.submit([TransferRequest(Op.READ, dst, 0, tgt.name, region.base, MiB),
                     TransferRequest(Op.READ, dst, 0, tgt.name, region.base, 0)]).wait(5)
    assert [s.state for s in st] == [State.COMPLETED, State.COMPLETED]
    assert bytes(dst.view) == data


def test_a_closed_peer_is_unreachable(make_engine, metadata_server) -> None:
    reg = registry()
    tgt = make_engine(registry=reg, metadata=metadata_server.url, name="gone")
    eng = make_engine(registry=reg, transport="memory", metadata=metadata_server.url, name="me")
    region = tgt.allocate(MiB)
    name, desc = tgt.name, tgt.descriptor()
    tgt.close()
    src = eng.register(bytearray(MiB))
    eng.metadata.publish(desc)  # a stale descriptor still names it
    [st] = eng.submit([TransferRequest(Op.WRITE, src, 0, name, region.base, MiB)]).wait(5)
    assert st.state is State.FAILED and "no transport reaches" in st.reason
    assert "not an engine of this process" in st.reason


class Rogue(MemoryTransport):
    """Publishes a field in the shm transport's namespace."""

    def attach(self, engine):
        ep = super().attach(engine)
        ep.fields = lambda: {"memory": ep.token, "shm": "not-mine"}
        return ep


def test_fields_outside_a_transports_namespace_are_dropped(make_engine) -> None:
    reg = Registry([md.EntryPoint("tcp", "mooncake_backends.tcp:TcpTransport", T),
                    md.EntryPoint("memory", "tests.integration.test_transport_memory:Rogue", T)])
    eng = make_engine(registry=reg)
    extra = eng.descriptor().extra
    assert "memory" in extra and "shm" not in extra


class Refusing(MemoryTransport):
    """Cannot register memory (like NIXL refusing a region): it must not cost the others."""

    def attach(self, engine):
        ep = super().attach(engine)

        def refuse(region):
            raise RuntimeError("no room")

        ep.register = refuse
        return ep


def test_a_transport_that_cannot_register_leaves_the_region_to_the_others(
        make_engine, caplog) -> None:
    reg = Registry([md.EntryPoint("tcp", "mooncake_backends.tcp:TcpTransport", T),
                    md.EntryPoint("memory", "tests.integration.test_transport_memory:Refusing", T),
                    md.EntryPoint("dram", "mooncake_backends.dram:DramTier", TIERS)])
    tgt = make_engine(registry=reg)
    with caplog.at_level("WARNING", logger="mooncake.transfer"):
        region = tgt.register(bytearray(MiB))
    assert region in tgt.segment.regions
    assert any("memory cannot register" in r.getMessage() for r in caplog.records)
    eng = make_engine(transport="tcp")
    data = os.urandom(MiB)
    src = eng.register(bytearray(data))
    assert eng.transfer(Op.WRITE, src, 0, tgt.name, region.base, MiB).state is State.COMPLETED
    assert bytes(region.view) == data
