"""The master's same-host lane (Unix socket) next to zmq: a real MasterService with both, real
clients and engines. The data path uses the lane, falls back to zmq when it is gone, honours
the secret, and the master survives garbage sent to it."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from mooncake_cli.store.client import StoreClient
from mooncake_cli.store.errors import ObjectNotFound, RpcFailed, StoreError
from mooncake_cli.store.master import StoreMaster
from mooncake_cli.store.service import MasterService
from mooncake_cli.store.wire import protocol
from mooncake_cli.store.wire.fastlane import HEADER, AnswerLost, Lane, LaneServer, lane_name
from mooncake_cli.store.wire.protocol import BatchGetReplicaList, BatchPutEnd, Exists
from mooncake_cli.transfer.wire import HELLO

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def service() -> Iterator[Callable[..., MasterService]]:
    made: list[MasterService] = []

    def make(secret: str | None = None) -> MasterService:
        made.append(MasterService(StoreMaster(), port=0, secret=secret))
        return made[-1]

    yield make
    for s in made:
        s.close()


@pytest.fixture
def client(make_engine: Callable[..., Any]) -> Iterator[Callable[..., StoreClient]]:
    made: list[StoreClient] = []

    def make(address: str, secret: str | None = None) -> StoreClient:
        made.append(StoreClient(address, make_engine(timeout=3), 8 << 20, secret=secret,
                                timeout=3))
        return made[-1]

    yield make
    for c in made:
        c.close()


def late_lane(svc: MasterService, c: StoreClient, only: type | None = None) -> threading.Event:
    """Put a lane in front of `svc` that, once the returned event is set, answers one request
    (of type `only`, when given) after `c` gave up waiting for it, and serves the rest."""
    c.put("warm", b"w")  # the lane is up
    assert svc.lane is not None
    svc.lane.close()
    slow = threading.Event()

    def late(send: Callable[[bytes], None], body: bytes) -> None:
        if slow.is_set():
            slow.clear()
            time.sleep(c.timeout + 0.5)  # sleep: behaviour - answered after the client gave up
        send(body)

    def serve(frames: list[bytes], send: Callable[[bytes], None]) -> None:
        if only is not None and type(protocol.decode_request(frames[0])) is not only:
            svc.serve(frames, send)
        else:
            svc.serve(frames, lambda body: late(send, body))

    svc.lane = LaneServer(svc.address, serve, None)
    c._lanes.close()  # the next call opens a lane to the slow server
    return slow


def test_data_path_rides_the_lane_and_falls_back_to_zmq(service, client) -> None:  # type: ignore[no-untyped-def]
    svc = service()
    assert svc.lane is not None
    c = client(svc.address)
    c.put("a", b"x" * 5000)
    assert c.get("a") == b"x" * 5000 and c.exists("a")
    assert c._lanes._lane is not None and len(svc.lane.served)  # the lane carried them
    svc.lane.close()  # the lane goes away: zmq answers, nothing is lost
    assert c.get("a") == b"x" * 5000
    assert c.batch_get(["a", "nope"])[0] == b"x" * 5000
    assert c._lanes._lane is None
    c.put("b", b"y" * 10)
    assert c.get("b") == b"y" * 10
    with pytest.raises(ObjectNotFound):
        c.get("nope")


def test_lane_with_a_secret(service, client) -> None:  # type: ignore[no-untyped-def]
    svc = service(secret="s3cret")
    c = client(svc.address, secret="s3cret")
    c.put("k", b"v" * 100)
    assert c.get("k") == b"v" * 100
    assert c._lanes._lane is not None
    for secret in (b"wrong", None):  # refused at the handshake, before any frame
        with pytest.raises(StoreError, match="secret"):
            Lane(svc.address, secret, 3).call(Exists("k"), bool)
    assert c.exists("k")


def test_garbage_on_the_lane_is_dropped_and_the_master_keeps_serving(service, client) -> None:  # type: ignore[no-untyped-def]
    svc = service()
    c = client(svc.address)
    c.put("k", b"1234")
    for junk in (HEADER.pack(1 << 31, 0), HEADER.pack(5, 0) + b"\xff\xfe\x00\x01\x02",
                 b"\x01\x02"):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(3)
        s.connect(lane_name(svc.address))
        assert s.recv(HELLO.size, socket.MSG_WAITALL)[:3] == b"MCS"  # no secret: no proof
        s.sendall(junk)
        if junk.startswith(HEADER.pack(5, 0)):  # well framed, bad body: an error reply
            head = s.recv(HEADER.size, socket.MSG_WAITALL)
            n, m = HEADER.unpack(head)
            assert n > 0 and m == 0
            assert b"malformed" in s.recv(n, socket.MSG_WAITALL)
        elif len(junk) == HEADER.size:  # over the size limit: hung up on
            assert s.recv(1) == b""
        s.close()
    assert c.get("k") == b"1234"
    assert Lane(svc.address, None, 3).call(Exists("k"), bool) is True


def test_a_lost_lane_answer_is_not_sent_again_by_zmq(service, client) -> None:  # type: ignore[no-untyped-def]
    """The master applied a PutStart but its answer came too late: sending it again by zmq
    would meet the object it just created, so the client gets RpcFailed instead."""
    svc = service()
    c = client(svc.address)
    slow = late_lane(svc, c)
    slow.set()
    with pytest.raises(RpcFailed) as err:
        c.put("k", b"x" * 100)
    assert type(err.value) is AnswerLost, err.value  # not a resent PutStart's refusal
    assert c._lanes._lane is None
    assert c.describe("k").key == "k"  # the master did start that put: it was sent once


def test_a_peer_that_never_reads_its_answers_stalls_only_its_own_lane(service, client) -> None:  # type: ignore[no-untyped-def]
    """A batch get's answer goes out with the master's lock held (its leases follow it): a
    peer that sends requests and never reads the answers must not keep that lock while its
    socket is full, or every other client would wait for it."""
    svc = service()
    c = client(svc.address)
    c.put("k", b"v" * 64)
    body = protocol.encode(BatchGetReplicaList(["k"] * 2000))  # an answer of ~100 KB
    hostile = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    hostile.settimeout(3)
    hostile.connect(lane_name(svc.address))
    assert hostile.recv(HELLO.size, socket.MSG_WAITALL)[:3] == b"MCS"
    hostile.settimeout(0.5)
    with pytest.raises(TimeoutError):  # until the master, stuck on answers never read, stops
        for _ in range(1000):  # reading requests too
            hostile.sendall(HEADER.pack(len(body), 0) + body)
    started = time.monotonic()
    for i in range(20):
        assert c.get("k") == b"v" * 64
        assert c.batch_get(["k", "k"]) == [b"v" * 64] * 2
        c.put(f"n{i}", b"x")
    assert time.monotonic() - started < 2.0  # not one stall of the stuck send (10 s)
    hostile.close()


def test_a_lost_batch_end_answer_still_held(service, client) -> None:  # type: ignore[no-untyped-def]
    """A batch put's end goes out naming the writer's segment, so no report brings those
    replicas back: when its answer is lost (maybe applied), the writer records them anyway."""
    svc = service()
    c = client(svc.address)
    slow = late_lane(svc, c, BatchPutEnd)
    slow.set()
    with pytest.raises(RpcFailed):
        c.batch_put(["b1", "b2"], [b"x" * 100, b"y" * 100])
    assert {"b1", "b2"} <= set(c.owner.holdings.keys())  # recorded: the master did end them
    assert [c.describe(k).complete for k in ("b1", "b2")] == [True, True]


def test_spin_polls_until_readable_closed_or_its_time_is_up() -> None:
    from mooncake_cli.store.wire.lane_frames import spin

    def idle() -> bool:
        return True
    a, b = socket.socketpair()
    try:
        t0 = time.perf_counter()
        assert spin(a, 0.02, idle) is False  # nothing came: it gave up, having polled its time
        assert time.perf_counter() - t0 >= 0.02
        assert spin(a, 0, idle) is False  # no polling asked for
        threading.Timer(0.005, b.sendall, (b"x",)).start()
        assert spin(a, 5.0, idle) is True  # data arrived while it polled
        assert a.recv(1) == b"x"  # peeked, not consumed: the read that follows gets it
        t0 = time.perf_counter()
        assert spin(a, 5.0, lambda: False) is False  # a task waits for a CPU: no polling
        assert time.perf_counter() - t0 < 1.0
        b.close()
        assert spin(a, 5.0, idle) is True  # the peer closed: the read that follows meets the end
        assert a.recv(1) == b""
    finally:
        a.close()
        b.close()


def test_cpu_to_spare_compares_the_kernels_runnable_count_with_our_cpus(
        tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import os

    from mooncake_cli.store.wire import lane_frames
    monkeypatch.setattr(lane_frames, "_CPUS", 2)
    f = tmp_path / "loadavg"
    fd = os.open(f, os.O_RDWR | os.O_CREAT)
    try:
        monkeypatch.setattr(lane_frames, "_LOADAVG", fd)
        for line, spare in ((b"0.50 0.40 0.30 2/310 4242\n", True),
                            (b"2.50 1.40 0.30 3/310 4242\n", False),
                            (b"garbage\n", False)):
            os.ftruncate(fd, 0)
            os.pwrite(fd, line, 0)
            assert lane_frames.cpu_to_spare() is spare, line
        monkeypatch.setattr(lane_frames, "_LOADAVG", None)  # no /proc here: never poll
        assert lane_frames.cpu_to_spare() is False
    finally:
        os.close(fd)
