"""Bounds of the data listeners under idle floods and hostile frames, against real processes:
a transfer target (`mooncake transfer serve`) and a store master's zmq port and Unix lane.
Legitimate requests are still served and the process's threads and memory stay bounded."""

from __future__ import annotations

import resource
import socket
import struct
from collections.abc import Iterator

import msgspec
import pytest
import zmq

from mooncake_cli.config import TransferConfig
from mooncake_cli.registry import Registry
from mooncake_cli.store.errors import StoreCode
from mooncake_cli.store.wire import protocol
from mooncake_cli.store.wire.fastlane import Lane, lane_name
from mooncake_cli.transfer import wire
from mooncake_cli.transfer.batch import Op
from mooncake_cli.transfer.engine import TransferEngine
from tests.conftest import start_target, wait_for
from tests.helpers.store_procs import Proc, start_master

pytestmark = pytest.mark.timeout(120)
SECRET = "bounds-secret"
MiB = 1 << 20
FLOOD = 1100  # the count: one more than the old 1,024-connection limit


def status(pid: int) -> tuple[int, int]:
    """(threads, RSS in bytes) of process `pid`."""
    fields = dict(line.split(":", 1) for line in open(f"/proc/{pid}/status"))
    return int(fields["Threads"]), int(fields["VmRSS"].split()[0]) * 1024


@pytest.fixture(autouse=True)
def room_for_sockets() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 4 * FLOOD:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 8 * FLOOD), hard))


def flood(port: int, n: int = FLOOD) -> list[socket.socket]:
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", port))
        socks.append(s)
    return socks


def greeted(s: socket.socket) -> bool:
    """Whether the listener has accepted `s` and sent it its HELLO (left unread)."""
    try:
        return len(s.recv(wire.HELLO.size, socket.MSG_PEEK)) == wire.HELLO.size
    except BlockingIOError:
        return False


def wait_greeted(socks: list[socket.socket], timeout: float = 60.0) -> None:
    """Wait until the listener has taken in every one of `socks`: each has its HELLO."""
    left = list(socks)

    def all_greeted() -> bool:
        left[:] = [s for s in left if not greeted(s)]
        return not left
    wait_for(all_greeted, timeout, what=f"a HELLO on each of {len(socks)} flooding sockets")


def round_trip(eng: TransferEngine, segment: str, offset: int) -> None:
    local = eng.register(bytearray(b"\x33" * MiB))
    eng.transfer(Op.WRITE, local, 0, segment, offset, MiB, timeout=20)
    back = eng.register(bytearray(MiB))
    eng.transfer(Op.READ, back, 0, segment, offset, MiB, timeout=20)
    assert back.view is not None and bytes(back.view) == b"\x33" * MiB


@pytest.mark.parametrize("secret", [SECRET, None])
def test_idle_flood_of_the_transfer_target(secret: str | None) -> None:
    t = start_target(8 * MiB, secret=secret)
    eng = TransferEngine(TransferConfig(secret=secret or "", timeout=10), Registry())
    try:
        threads0, rss0 = status(t.pid)
        socks = flood(int(t.address.rpartition(":")[2]))
        wait_greeted(socks)  # the whole flood is in before the real client comes
        round_trip(eng, t.segment, t.offset)  # a real client is served at once
        threads, rss = status(t.pid)
        print(f"secret={bool(secret)}: threads {threads0} -> {threads}, "
              f"RSS {rss0 >> 20} -> {rss >> 20} MiB")
        if secret:  # nobody who has not proved the secret holds a thread
            assert threads < threads0 + 16
        else:  # at most its per-peer bound of served connections
            assert threads < threads0 + 520
        assert rss < rss0 + 200 * MiB
        for s in socks:
            s.close()
    finally:
        eng.close()
        t.kill()


def test_a_torn_write_to_a_real_target_leaves_its_memory_untouched() -> None:
    t = start_target(8 * MiB, secret=SECRET)
    eng = TransferEngine(TransferConfig(secret=SECRET), Registry())
    try:
        round_trip(eng, t.segment, t.offset)  # the page holds 0x33 now
        s = socket.create_connection(t.address.rsplit(":", 1), timeout=5)  # type: ignore[arg-type]
        nonce = wire.HELLO.unpack(wire.recv_exact(s, wire.HELLO.size))[3]
        s.sendall(wire.prove(SECRET, nonce))
        assert wire.recv_exact(s, 1) == b"\x00"
        s.sendall(wire.REQUEST.pack(wire.OP_WRITE, 0, 0, 1, t.offset, 64 << 10) + b"\xff" * 4096)
        s.shutdown(socket.SHUT_WR)  # cut short after one page of 16
        s.settimeout(30)
        assert s.recv(1) == b"", "the target answered a torn write"  # it hung up: done with it
        s.close()
        back = eng.register(bytearray(64 << 10))
        eng.transfer(Op.READ, back, 0, t.segment, t.offset, 64 << 10)
        assert back.view is not None and bytes(back.view) == b"\x33" * (64 << 10)
    finally:
        eng.close()
        t.kill()


@pytest.fixture
def master() -> Iterator[Proc]:
    m = start_master(0, "--secret", SECRET)
    yield m
    m.stop()


def raw(address: str, body: bytes, secret: str | None = SECRET) -> protocol.Reply:
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(f"tcp://{address}")
    frames = [body] if secret is None else [body, protocol.mac(secret.encode(), body)]
    s.send_multipart(frames)
    assert s.poll(10000), "no answer"
    reply = protocol.decode_reply(s.recv_multipart()[0])
    s.close()
    ctx.term()
    return reply


def test_a_segment_of_2_64_bytes_is_refused_and_stat_still_works(master: Proc) -> None:
    address = str(master.ready["address"])
    evil = msgspec.msgpack.encode({"op": "mount_segment", "segment": {
        "name": "evil", "client_id": "evil", "host": "h", "base": 0, "size": 2**64 - 1,
        "tier": "dram"}})
    reply = raw(address, evil)
    assert not reply.ok and reply.code == StoreCode.INVALID_PARAMS, reply
    assert "segment size" in reply.message
    stat = raw(address, protocol.encode(protocol.Stats()))
    assert stat.ok, stat


def test_the_lane_takes_no_frame_before_the_secret(master: Proc) -> None:
    address = str(master.ready["address"])
    _, rss0 = status(master.proc.pid)
    socks = []
    for _ in range(4):  # the issue's: each announces a 250 MiB body and sends most of it
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(lane_name(address))
        s.settimeout(10)
        assert s.recv(wire.HELLO.size, socket.MSG_WAITALL)[:3] == b"MCS"
        s.sendall(struct.pack("<II", 250 * MiB, 32))
        try:
            for _ in range(50):
                s.sendall(b"\0" * MiB)
        except OSError:
            pass  # hung up on: the header was not a proof
        socks.append(s)
    _, rss = status(master.proc.pid)
    assert rss < rss0 + 30 * MiB, (rss0 >> 20, rss >> 20)
    lane = Lane(address, SECRET.encode(), 5)  # the real client still gets in
    assert lane.call(protocol.Exists("nothing"), bool) is False
    lane.close()
    for s in socks:
        s.close()


def test_an_unauthenticated_lane_flood_does_not_lock_clients_out(master: Proc) -> None:
    address = str(master.ready["address"])
    threads0, _ = status(master.proc.pid)
    socks: list[socket.socket] = []
    queued: list[socket.socket] = []  # those in the backlog (connected)
    for _ in range(FLOOD):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.setblocking(False)
        if s.connect_ex(lane_name(address)) == 0:  # else EAGAIN: the backlog was full
            queued.append(s)
        socks.append(s)
    wait_greeted(queued)  # every connection that got in has been taken in by the gate
    lane = Lane(address, SECRET.encode(), 5)
    assert lane.call(protocol.Exists("nothing"), bool) is False
    threads, _ = status(master.proc.pid)
    assert threads < threads0 + 8
    lane.close()
    for s in socks:
        s.close()
