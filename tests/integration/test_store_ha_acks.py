"""Durable answers of an HA master (store/ha/acks.py) over its real zmq socket: a put-end or a
remove is answered only once the owner's poll acknowledged it, long polls are held until news,
and a master that is starting answers "not ready, retry" (a real `--ha` process included)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import uuid
from typing import Any

import pytest
import zmq

from mooncake_cli.store import Mount, StoreMaster
from mooncake_cli.store.errors import StoreCode
from mooncake_cli.store.ha.acks import MAX_POLL_WAIT
from mooncake_cli.store.ha.leader import NOT_LEADER
from mooncake_cli.store.records import Replica
from mooncake_cli.store.reports import HoldingsReport
from mooncake_cli.store.service import MasterService
from mooncake_cli.store.wire import protocol as p
from tests.conftest import REPO, free_port, wait_for
from tests.helpers.procs import child_env

pytestmark = pytest.mark.timeout(60)


class Peer:
    """A DEALER on a master's port: send now, read the answer later."""

    def __init__(self, ctx: zmq.Context[Any], address: str) -> None:
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(f"tcp://{address}")

    def send(self, request: Any) -> None:
        self.sock.send(p.encode(request))

    def answer(self, within: float) -> p.Reply | None:
        if not self.sock.poll(int(within * 1000)):
            return None
        return p.decode_reply(self.sock.recv_multipart()[0])

    def ask(self, request: Any) -> p.Reply:
        self.send(request)
        reply = self.answer(5)
        assert reply is not None
        return reply


def test_put_end_and_remove_wait_for_the_owner(durable: Any) -> None:
    service, ctx = durable
    owner, writer = Peer(ctx, service.address), Peer(ctx, service.address)
    assert owner.ask(p.MountSegment(Mount("seg", "own", "h", 0, 1 << 20))).ok
    first = p.result(owner.ask(p.PollHoldings("own")), HoldingsReport)
    assert first.reset and not first.added

    owner.send(p.PollHoldings("own", first.epoch, first.upto, wait=5))  # held: nothing new
    assert owner.answer(0.3) is None
    assert writer.ask(p.PutStart("k", 10)).ok
    writer.send(p.PutEnd("k", "c0ffee"))
    news = owner.answer(2)  # the held poll answers as soon as the put ends
    assert news is not None and news.ok
    report = p.result(news, HoldingsReport)
    assert [h.key for h in report.added] == ["k"] and report.added[0].replica.checksum == "c0ffee"
    assert writer.answer(0.3) is None  # not acknowledged before the owner confirms
    owner.send(p.PollHoldings("own", report.epoch, report.upto, wait=5))
    done = writer.answer(2)
    assert done is not None and done.ok  # the owner's acknowledgement releases it

    writer.send(p.Remove("k", True))
    gone = owner.answer(2)
    assert gone is not None
    report = p.result(gone, HoldingsReport)
    assert [g.key for g in report.removed] == ["k"]
    assert writer.answer(0.3) is None
    owner.send(p.PollHoldings("own", report.epoch, report.upto, wait=5))
    removed = writer.answer(2)
    assert removed is not None and removed.ok


def test_a_checksum_at_put_start_tells_the_owner_before_the_put_ends(durable: Any) -> None:
    service, ctx = durable
    owner, writer = Peer(ctx, service.address), Peer(ctx, service.address)
    assert owner.ask(p.MountSegment(Mount("seg", "own", "h", 0, 1 << 20))).ok
    first = p.result(owner.ask(p.PollHoldings("own")), HoldingsReport)
    owner.send(p.PollHoldings("own", first.epoch, first.upto, wait=5))
    assert writer.ask(p.PutStart("k", 10, checksum="c0ffee")).ok
    news = owner.answer(2)  # told at put_start, while the writer writes
    assert news is not None
    report = p.result(news, HoldingsReport)
    assert [(h.key, h.replica.checksum) for h in report.added] == [("k", "c0ffee")]
    owner.send(p.PollHoldings("own", report.epoch, report.upto, wait=5))
    book = service.master.state.reports
    wait_for(lambda: (j := book.journal("own")) is not None and j.acked >= report.upto, 5,
             what="the master to take in the owner's acknowledgement")  # before the put ends
    # confirmed already; were the end news to the owner, it would wait for an ack that the
    # owner (not polling again) never sends, and fail after the durable timeout
    assert writer.ask(p.PutEnd("k", "c0ffee")).ok
    assert owner.answer(0.3) is None

    assert writer.ask(p.BatchPutStart(["a", "b"], [10, 10], checksums=["aa", "bb"])).ok
    news = owner.answer(2)
    assert news is not None
    report = p.result(news, HoldingsReport)
    assert sorted(h.key for h in report.added) == ["a", "b"]
    owner.send(p.PollHoldings("own", report.epoch, report.upto, wait=5))
    assert writer.ask(p.BatchPutRevoke(["a"])).ok  # a revoked put is taken back from the owner
    news = owner.answer(MAX_POLL_WAIT + 1)  # no answer waits for it: a poll held before the
    # revoke came answers it at its deadline (it had raced the 2 s wait here on a loaded host)
    assert news is not None
    assert [g.key for g in p.result(news, HoldingsReport).removed] == ["a"]


def test_a_remount_brings_its_holdings_before_anything_is_placed(durable: Any) -> None:
    service, ctx = durable
    owner = Peer(ctx, service.address)
    seg = Mount("seg", "own", "h", 0, 1 << 20)
    assert owner.ask(p.MountSegment(seg)).ok
    assert owner.ask(p.PutStart("k", 4096, checksum="c0ffee")).ok
    report = p.result(owner.ask(p.PollHoldings("own")), HoldingsReport)
    held = [h for h in report.added if h.key == "k"]
    assert held

    new = MasterService(StoreMaster(), port=0)  # a new leader knows nothing of the segment
    try:
        peer = Peer(ctx, new.address)
        reply = peer.ask(p.Remount(seg, held))
        assert reply.ok and p.result(reply, list[p.Reply])[0].ok
        # mount and registration in one step: a put now is placed beside "k", not over it
        x = p.result(peer.ask(p.PutStart("x", 4096)), list[Replica])[0].offset
        k = held[0].replica.offset
        assert x >= k + 4096 or x + 4096 <= k
        assert p.result(peer.ask(p.Exists("k")), bool)
    finally:
        new.close()


def test_an_owner_that_never_confirms_fails_the_put(durable: Any) -> None:
    service, ctx = durable
    service.acks.timeout = 0.5
    peer = Peer(ctx, service.address)
    assert peer.ask(p.MountSegment(Mount("seg", "silent", "h", 0, 1 << 20))).ok
    assert peer.ask(p.PutStart("k", 10)).ok
    started = time.monotonic()
    reply = peer.ask(p.PutEnd("k"))
    assert not reply.ok and reply.code == StoreCode.RPC_FAIL
    assert "did not confirm" in reply.message and time.monotonic() - started >= 0.5
    other = peer.ask(p.Exists("other"))  # the service kept serving meanwhile
    assert other.ok


def test_a_long_poll_without_ha_answers_at_its_deadline() -> None:
    with MasterService(StoreMaster(), port=0) as service:
        ctx: zmq.Context[Any] = zmq.Context()
        try:
            peer = Peer(ctx, service.address)
            assert peer.ask(p.MountSegment(Mount("seg", "c", "h", 0, 1 << 20))).ok
            first = p.result(peer.ask(p.PollHoldings("c")), HoldingsReport)
            started = time.monotonic()
            reply = peer.ask(p.PollHoldings("c", first.epoch, first.upto, wait=0.4))
            assert reply.ok and time.monotonic() - started >= 0.4
            assert peer.ask(p.PutStart("k", 10)).ok
            assert peer.ask(p.PutEnd("k")).ok  # without HA nothing waits for the owner
        finally:
            ctx.destroy(linger=0)


def test_a_starting_master_answers_not_ready() -> None:
    with MasterService(StoreMaster(), port=0, starting=True) as service:
        ctx: zmq.Context[Any] = zmq.Context()
        try:
            reply = Peer(ctx, service.address).ask(p.Exists("k"))
        finally:
            ctx.destroy(linger=0)
    assert not reply.ok and reply.code == NOT_LEADER and "not ready, retry" in reply.message


@pytest.mark.parametrize("argv", [["-m", "mooncake_cli.store.service"],
                                  ["-m", "mooncake_cli", "store", "master"]])
def test_an_ha_master_process_never_answers_an_internal_error(etcd: str,
                                                              argv: list[str]) -> None:
    port = free_port()
    ctx: zmq.Context[Any] = zmq.Context()
    peer = Peer(ctx, f"127.0.0.1:{port}")
    peer.sock.setsockopt(zmq.RECONNECT_IVL, 5)
    replies: list[p.Reply] = []
    stop = threading.Event()

    def flood() -> None:  # asks from before the process exists until it leads
        while not stop.is_set():
            peer.send(p.Exists("k"))
            reply = peer.answer(0.05)
            if reply is not None:
                replies.append(reply)
                if reply.ok:
                    return
            time.sleep(0.002)  # sleep: pace - the flood's rate

    thread = threading.Thread(target=flood)
    thread.start()
    master = subprocess.Popen([sys.executable, *argv, "--port", str(port), "--ha",
                               f"{etcd}/s{uuid.uuid4().hex[:8]}"],
                              cwd=REPO, env=child_env(), stdout=subprocess.DEVNULL)
    try:
        thread.join(30)
        assert replies and replies[-1].ok, "the master never led"
        refusals = replies[:-1]
        assert all(r.code == NOT_LEADER for r in refusals), [r.message for r in refusals]
        assert all("not ready" in r.message or "standby" in r.message for r in refusals)
        assert any("not ready" in r.message for r in refusals)
    finally:
        stop.set()
        thread.join(5)
        master.terminate()
        master.wait(10)
        ctx.destroy(linger=0)
