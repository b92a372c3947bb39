"""Replies decoded through wire/incoming.py: the same records as a plain msgspec decode of the
dataclasses, and refused where the records' own checks refuse."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from mooncake_cli.store.errors import StoreCode, StoreError
from mooncake_cli.store.records import Replica, ReplicaStatus, ReplicateConfig
from mooncake_cli.store.reports import Gone, Held, HoldingsReport
from mooncake_cli.store.wire import protocol as p

GOOD = {"segment": "seg", "offset": 64, "size": 4096}
DEFAULTS = {"tier": "dram", "host": "", "checksum": None, "status": "pending", "note_at": 0,
            "note_seq": 0}


def wire(replica: dict[str, Any]) -> list[Any]:
    """A replica as the wire carries it: its fields in order (an array-like Struct)."""
    fields = {**DEFAULTS, **replica}
    return [fields[f] for f in Replica.__struct_fields__]


def _reply(value: Any) -> p.Reply:
    return p.decode_reply(p.encode(p.ok(value)))


def test_replica_lists_and_reports_decode_to_the_records_they_were() -> None:
    rs = [Replica("seg", 64, 4096), Replica("b", 0, 1, "ssd", "h", "ab12", ReplicaStatus.COMPLETE,
                                            8, 3)]
    got = p.result(_reply(rs), list[Replica])
    assert got == rs and [type(r) for r in got] == [Replica, Replica]
    assert [(r.note_at, r.note_seq) for r in got] == [(0, 0), (8, 3)]  # not compared by ==
    assert got[1].status is ReplicaStatus.COMPLETE
    cfg = ReplicateConfig(2, "x", True, False, ("a", "b"), 3.5)
    report = HoldingsReport(True, "ep", 9, True, (Held("k", rs[0], cfg), Held("k2", rs[1])),
                            (Gone("g", 128),), 4)
    out = p.result(_reply(report), HoldingsReport)
    assert out == report
    assert out.added[0].config.preferred_segments == ("a", "b")
    assert msgspec.msgpack.Decoder(HoldingsReport).decode(p.encode(report)) == out


@pytest.mark.parametrize("bad", [
    {"segment": ""}, {"segment": 5}, {"offset": -1}, {"offset": True}, {"size": 0},
    {"size": (1 << 40) + 1}, {"tier": "nvme"}, {"status": "gone"}, {"checksum": 7},
    {"note_at": -1}, {"note_seq": -2}, {"host": None},
])
def test_a_replica_the_record_refuses_is_refused(bad: dict[str, Any]) -> None:
    assert p.result(p.Reply(True, result=msgspec.Raw(p.encode([wire(GOOD)]))),
                    list[Replica]) == [Replica("seg", 64, 4096)]
    raw = p.encode([wire({**GOOD, **bad})])
    with pytest.raises((msgspec.ValidationError, StoreError, TypeError, ValueError)):
        msgspec.msgpack.Decoder(list[Replica]).decode(raw)  # the dataclass's own checks
    with pytest.raises(StoreError) as e:
        p.result(p.Reply(True, result=msgspec.Raw(raw)), list[Replica])
    assert e.value.code == StoreCode.RPC_FAIL


@pytest.mark.parametrize("held", [
    {"key": "", "replica": GOOD},
    {"key": "é" * 2049, "replica": GOOD},  # 4098 UTF-8 bytes
    {"key": "k", "replica": {**GOOD, "size": 0}},
    {"key": "k", "replica": GOOD, "config": {"replica_num": 0}},
    {"key": "k", "replica": GOOD, "config": {"replica_num": 17}},
    {"key": "k", "replica": GOOD, "config": {"soft_pin": 1}},
    {"key": "k", "replica": GOOD, "config": {"soft_pin_ttl": -1.0}},
    {"key": "k", "replica": GOOD, "config": {"soft_pin_ttl": True}},
    {"key": "k", "replica": GOOD, "config": {"preferred_segments": ["s"] * 65}},
])
def test_a_holdings_report_with_a_bad_record_is_refused(held: dict[str, Any]) -> None:
    good = {"key": "k", "replica": wire(GOOD)}
    report = {"known": True, "epoch": "e", "upto": 1, "added": [good]}
    assert p.result(p.Reply(True, result=msgspec.Raw(p.encode(report))),
                    HoldingsReport).added[0].key == "k"
    raw = p.encode({**report, "added": [{**held, "replica": wire(held["replica"])}]})
    with pytest.raises(StoreError):
        p.result(p.Reply(True, result=msgspec.Raw(raw)), HoldingsReport)


def _started(*replicas: Replica | StoreError) -> list[Any]:
    return [r if isinstance(r, StoreError) else (r,) for r in replicas]


def test_a_batch_start_on_one_segment_is_answered_in_short_and_reads_back_the_same() -> None:
    from mooncake_cli.store.client.batch_puts import STARTED
    from mooncake_cli.store.master import StoreMaster
    from mooncake_cli.store.records import Mount

    m = StoreMaster()
    m.mount_segment(Mount("seg", "c", "h", 1 << 20, 1 << 24))
    keys = [f"k{i}" for i in range(4)]
    asked = p.BatchPutStart(keys, [4096] * 4, runs=True)
    short = p.result(p.decode_reply(p.encode(p.run(m, asked))), STARTED)
    assert type(short) is p.Run and (short.segment, short.host, short.size) == ("seg", "h", 4096)
    long = p.each(p.result(p.decode_reply(p.encode(p.run(
        m, p.BatchPutStart([f"x{i}" for i in range(4)], [4096] * 4)))), STARTED))
    assert [rs[0].status for rs in long] == [ReplicaStatus.PENDING] * 4  # not asked: per key
    made = [[Replica("seg", off, 4096, "dram", "h")] for off in short.offsets]
    assert short.replicas() == made  # copied from the first, each at its own offset
    assert [hash(rs[0]) for rs in short.replicas()] == [hash(rs[0]) for rs in made]
    assert len(set(short.offsets)) == 4 and all(o >= 1 << 20 for o in short.offsets)
    r = Replica("seg", 4096, 4096, host="h")
    assert p.Run.of(_started(r, Replica("seg", 8192, 4096, host="h"))) is not None
    for other in (Replica("two", 8192, 4096, host="h"), Replica("seg", 8192, 100, host="h"),
                  Replica("seg", 8192, 4096, host="h", note_at=64, note_seq=1),
                  StoreError("exists", StoreCode.OBJECT_ALREADY_EXISTS)):
        assert p.Run.of(_started(r, other)) is None  # anything else: the long answer
    assert p.Run.of(_started(r)) is None and p.Run.of([(r, r), (r,)]) is None


@pytest.mark.parametrize("bad", [{"offsets": [-1]}, {"size": 0}, {"segment": ""},
                                 {"tier": "tape"}])
def test_a_short_answer_out_of_bounds_is_refused(bad: dict[str, Any]) -> None:
    from mooncake_cli.store.client.batch_puts import STARTED

    run = {"segment": "seg", "host": "h", "tier": "dram", "size": 4096, "offsets": [0, 4096],
           **bad}
    with pytest.raises(StoreError, match="unexpected result") as e:
        p.result(p.Reply(True, 0, "", msgspec.Raw(msgspec.msgpack.encode(run))), STARTED)
    assert e.value.code == StoreCode.RPC_FAIL


def test_a_batch_get_of_one_segment_is_answered_in_short_with_each_checksum() -> None:
    from mooncake_cli.store.client.batch_reads import FOUND
    from mooncake_cli.store.master import StoreMaster
    from mooncake_cli.store.records import Mount

    m = StoreMaster()
    m.mount_segment(Mount("seg", "c", "h", 1 << 20, 1 << 24))
    sizes = {"a": 100, "b": 5000, "c": 64}
    for k, n in sizes.items():
        m.put_start(k, n)
        m.put_end(k, f"sum-{k}")
    got = p.result(p.decode_reply(p.encode(p.run(m, p.BatchGetReplicaList(list(sizes),
                                                                           runs=True)))), FOUND)
    assert type(got) is p.Found and got.sizes == [100, 5000, 64]
    assert got.replicas() == [list(m.get_replica_list(k)) for k in sizes]  # the same records
    assert all(rs[0].status is ReplicaStatus.COMPLETE and rs[0].checksum == f"sum-{k}"
               for k, rs in zip(sizes, got.replicas(), strict=True))
    m.put_start("pending", 10)
    for keys in (["a", "missing"], ["a", "pending"]):  # a key not found: per key, as before
        long = p.result(p.decode_reply(p.encode(p.run(
            m, p.BatchGetReplicaList(keys, runs=True)))), FOUND)
        assert type(long) is list and not long[1][0]
    with pytest.raises(StoreError, match="differ in length"):
        p.Found("seg", "h", "dram", [0, 64], [10], [None, None]).replicas()
