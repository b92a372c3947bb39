"""Replies decoded through wire/incoming.py: the same records as a plain msgspec decode of the
dataclasses, and refused where the records' own checks refuse."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from mooncake_cli.store.errors import ErrorCode, StoreError
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
    assert e.value.code == ErrorCode.RPC_FAIL


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
