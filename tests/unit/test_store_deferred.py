"""Work a master defers past its answer (MasterState.defer): a batch's admissions, completions
and leases run right after the answer is sent, the master's lock held from the request to the
end of that work, so that no other request sees the state without it."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import msgspec
import pytest

from mooncake_cli.store.errors import StoreCode
from mooncake_cli.store.master import StoreMaster
from mooncake_cli.store.records import Mount, ReplicateConfig
from mooncake_cli.store.service import MasterService
from mooncake_cli.store.wire import protocol as p
from tests.helpers.clock import FakeClock

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def svc() -> Iterator[MasterService]:
    s = MasterService(StoreMaster(), port=0)
    s.master.mount_segment(Mount("seg", "client-1", "127.0.0.1", 1 << 20, 64 << 20))
    yield s
    s.close()


def ask(svc: MasterService, request: p.Request,
        on_send: Callable[[], None] | None = None) -> list[Any]:
    """The per-key (ok, code, message, value) of a batch `request` served by `svc`;
    `on_send()` runs when the answer is sent."""
    sent: list[bytes] = []

    def send(body: bytes) -> None:
        if on_send is not None:
            on_send()
        sent.append(body)
    assert svc.serve([p.encode(request)], send) is None
    assert len(sent) == 1
    reply = p.decode_reply(sent[0])
    assert reply.ok, reply.message
    return msgspec.msgpack.decode(reply.result)  # type: ignore[no-any-return]


def test_a_batch_is_answered_before_its_objects_are_admitted_and_nobody_sees_between(svc) -> None:  # type: ignore[no-untyped-def]
    st = svc.master.objects.state
    keys = ["a", "b", "c"]
    seen: dict[str, object] = {}
    other: list[bool] = []

    def meanwhile() -> None:  # when the answer goes out: nothing admitted yet ...
        seen["start"] = [k in st.objects for k in keys]
        t = threading.Thread(target=lambda: other.append(svc.master.exists("a")))
        t.start()
        t.join(0.3)
        seen["other_waits"] = t.is_alive()  # ... and another request waits for the lock
        seen["thread"] = t
    starts = ask(svc, p.BatchPutStart(keys, [100, 100, 100], None), meanwhile)
    assert [ok for ok, *_ in starts] == [True] * 3
    assert seen["start"] == [False] * 3 and seen["other_waits"] is True
    assert all(st.objects[k].put_deadline is not None for k in keys)  # admitted once sent
    seen["thread"].join(5)  # type: ignore[attr-defined]
    assert other == [False]  # it ran after the admissions: pending, not missing

    def ended() -> None:
        seen["end"] = [st.objects[k].complete for k in keys]
    ends = ask(svc, p.BatchPutEnd(keys, ["s1", "s2", "s3"]), ended)
    assert [ok for ok, *_ in ends] == [True] * 3
    assert seen["end"] == [False] * 3
    assert [st.objects[k].complete for k in keys] == [True] * 3
    assert [st.objects[k].replicas[0].checksum for k in keys] == ["s1", "s2", "s3"]
    assert st.counts["puts"] == 3

    def leased() -> None:
        seen["lease"] = st.objects["a"].lease_until
    gets = ask(svc, p.BatchGetReplicaList(["a", "nope", "b"]), leased)
    assert [(ok, code) for ok, code, *_ in gets] == [
        (True, 0), (False, int(StoreCode.OBJECT_NOT_FOUND)), (True, 0)]
    assert seen["lease"] == 0.0 and st.objects["a"].lease_until > 0  # leased after the answer


def test_a_key_twice_in_one_deferred_batch_acts_as_one_by_one(svc) -> None:  # type: ignore[no-untyped-def]
    st = svc.master.objects.state
    starts = ask(svc, p.BatchPutStart(["x", "x", "y"], [10, 10, 10], None))
    assert [(ok, code) for ok, code, *_ in starts] == [
        (True, 0), (False, int(StoreCode.OBJECT_ALREADY_EXISTS)), (True, 0)]
    ends = ask(svc, p.BatchPutEnd(["x", "x", "y"], ["first", "second", "y"]))
    assert [ok for ok, *_ in ends] == [True] * 3  # the second end of x is a repeat
    assert st.objects["x"].replicas[0].checksum == "first" and st.counts["puts"] == 2
    again = ask(svc, p.BatchPutStart(["x", "x"], [10, 10], None, upsert=True))
    assert [(ok, code) for ok, code, *_ in again] == [
        (True, 0), (False, int(StoreCode.REPLICA_IS_NOT_READY))]
    assert len(ask(svc, p.BatchGetReplicaList(["y", "y"]))) == 2
    assert st.objects["y"].lease_until > 0


def test_a_failing_send_still_runs_the_deferred_work(svc) -> None:  # type: ignore[no-untyped-def]
    st = svc.master.objects.state

    def broken(body: bytes) -> None:
        raise OSError("the peer went away")
    with pytest.raises(OSError):
        svc.serve([p.encode(p.BatchPutStart(["z"], [10], None))], broken)
    assert st.objects["z"].put_deadline is not None and st.later is None


def test_the_tick_expires_puts_from_the_puts_under_way_alone() -> None:
    """Housekeeping looks at the puts that have not ended (MasterState.pending), not at
    every object: each change of a put's state keeps that book."""
    clock = FakeClock(100.0)
    m = StoreMaster(now=clock, put_timeout=5.0)
    m.mount_segment(Mount("seg", "client-1", "127.0.0.1", 1 << 20, 64 << 20))
    m.heartbeat("client-1")
    st = m.objects.state
    m.batch_put_start(["done", "revoked", "late", "dropped"], [10] * 4)
    assert list(st.pending) == ["done", "revoked", "late", "dropped"]
    m.batch_put_end(["done"])
    m.put_revoke("revoked")
    m.remove("dropped", force=True)
    assert list(st.pending) == ["late"]
    clock.advance(4.0)
    m.heartbeat("client-1")
    assert m.tick().discarded_puts == () and list(st.pending) == ["late"]
    clock.advance(2.0)
    m.heartbeat("client-1")
    assert m.tick().discarded_puts == ("late",)
    assert st.pending == {} and sorted(st.objects) == ["done"]
    m.put_start("again", 10, upsert=True)
    m.put_end("again")
    assert st.pending == {}


def test_a_writer_s_own_puts_are_not_reported_back_to_it() -> None:
    """A batch put ended with `own` (the writer's segment) leaves its replicas there out of the
    owner's journal: the writer records them itself. Not when the journal still mentions the
    key, not for another segment, not while changes are collected (HA); and a client that does
    not follow that journal gets a snapshot holding them."""
    m = StoreMaster()
    m.mount_segment(Mount("seg", "client-1", "127.0.0.1", 1 << 20, 64 << 20))
    m.mount_segment(Mount("far", "client-2", "127.0.0.2", 1 << 20, 64 << 20))
    first = m.poll_holdings("client-1", "", 0)
    epoch, ack = first.epoch, first.upto

    def put(keys: list[str], own: str, preferred: str = "seg") -> None:
        cfg = ReplicateConfig(preferred_segment=preferred)
        assert all(not isinstance(r, Exception)
                   for r in m.batch_put_start(keys, [10] * len(keys), cfg))
        assert m.batch_put_end(keys, ["00"] * len(keys), own) == [None] * len(keys)

    def news() -> list[str]:
        nonlocal ack
        r = m.poll_holdings("client-1", epoch, ack)
        assert r.epoch == epoch and not r.reset
        ack = r.upto
        return sorted(h.key for h in r.added) + sorted(f"-{g.key}" for g in r.removed)

    put(["a", "b"], "seg")
    assert news() == []  # recorded by the writer: nothing comes back
    put(["c"], "far")  # written by another client (its own segment is "far"): the owner of
    assert news() == ["c"]  # the replica on "seg" is told, as before
    put(["d"], "")
    assert news() == ["d"]
    m.remove("a", force=True)
    put(["a"], "seg")  # the journal still mentions a (its removal, not acknowledged)
    assert news() in (["a"], ["a", "-a"])  # so the new replica is told too
    with m.objects.state.reports.collect():
        put(["e"], "seg")
    assert news() == ["e"]  # HA: every change goes to the owner, who confirms it
    again = m.poll_holdings("client-1", "", 0)  # a client that follows another journal
    assert again.reset and sorted(h.key for h in again.added) == ["a", "b", "c", "d", "e"]
