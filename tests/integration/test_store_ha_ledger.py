"""The put ledger (store/ledger.py, store/ha/notes.py): an HA leader gives the writer a ledger
slot per replica, answers its put_end without waiting for the owner, falls back to waiting
when the owner's ledger is full, and an owner re-mounting after a failover re-registers the
puts its ledger records that it was never told of, and none that it was told were removed."""

from __future__ import annotations

from typing import Any

import pytest
import xxhash

from mooncake_cli.store import Mount, StoreMaster, ledger
from mooncake_cli.store.client.holdings import Holdings
from mooncake_cli.store.client.keeper import HoldingsKeeper
from mooncake_cli.store.records import Replica, ReplicateConfig
from mooncake_cli.store.reports import HoldingsReport
from mooncake_cli.store.wire import protocol as p
from tests.integration.test_store_ha_acks import Peer

pytestmark = pytest.mark.timeout(60)
LEDGER = 1 << 20  # where the owner's ledger sits in its transfer segment, past the data


def _replicas(reply: p.Reply) -> list[Replica]:
    return list(p.result(reply, list[Replica]))


def test_a_noted_put_ends_without_the_owner_and_a_full_ledger_waits(durable: Any) -> None:
    service, ctx = durable
    owner, writer = Peer(ctx, service.address), Peer(ctx, service.address)
    seg = Mount("seg", "own", "h", 0, 1 << 20, ledger=LEDGER, ledger_slots=4)
    assert owner.ask(p.MountSegment(seg, ledger_next=11)).ok
    first = p.result(owner.ask(p.PollHoldings("own")), HoldingsReport)
    assert first.reset and first.ledger == 10  # the records before this mount are not ours
    owner.send(p.PollHoldings("own", first.epoch, first.upto, wait=5))

    (r,) = _replicas(writer.ask(p.PutStart("k0", 10, checksum="aa", notes=True)))
    assert (r.note_seq, r.note_at) == (11, LEDGER + 2 * ledger.SLOT)  # slot (11 - 1) % 4
    assert owner.answer(0.3) is None  # nobody waits for the owner: it is not woken
    assert writer.ask(p.PutEnd("k0", "aa")).ok  # answered at once: the record is the owner's

    seqs = []
    for i in (1, 2):
        (r,) = _replicas(writer.ask(p.PutStart(f"k{i}", 10, checksum="aa", notes=True)))
        seqs.append(r.note_seq)
    assert seqs == [12, 13]
    news = owner.answer(2)  # more than half of the slots wait: the owner is asked to take them in
    assert news is not None
    report = p.result(news, HoldingsReport)
    assert report.ledger == 13
    assert {"k0", "k1", "k2"} <= {h.key for h in report.added}

    (r,) = _replicas(writer.ask(p.PutStart("k3", 10, checksum="aa", notes=True)))
    assert r.note_seq == 14
    (full,) = _replicas(writer.ask(p.PutStart("k4", 10, checksum="aa", notes=True)))
    assert full.note_seq == 0  # seq 15 needs the slot of seq 11, not yet acknowledged
    writer.send(p.PutEnd("k4", "aa"))
    assert writer.answer(0.3) is None  # so this put waits for the owner, as without a ledger
    owner.send(p.PollHoldings("own", report.epoch, report.upto, wait=5))  # acknowledges 11-13
    news = owner.answer(2)  # and is answered at once: k4's answer waits for its change
    assert news is not None
    report = p.result(news, HoldingsReport)
    assert writer.answer(0.3) is None
    owner.send(p.PollHoldings("own", report.epoch, report.upto, wait=5))
    done = writer.answer(2)
    assert done is not None and done.ok
    (r,) = _replicas(writer.ask(p.PutStart("k5", 10, checksum="aa", notes=True)))
    assert r.note_seq == 15  # slots freed by the acknowledgements

    (plain,) = _replicas(writer.ask(p.PutStart("p", 10, checksum="bb")))
    assert plain.note_seq == 0  # a writer that leaves no records gets no slot


class _Direct:
    """The keeper's connection, straight into an in-process master (no socket to test here)."""

    def __init__(self, master: StoreMaster) -> None:
        self.master = master
        self.asked: list[Any] = []

    def call(self, request: Any, kind: Any = None) -> Any:
        self.asked.append(request)
        return p.result(p.run(self.master, request), kind)


def test_a_remount_registers_the_puts_only_its_ledger_knows() -> None:
    data = bytearray(1 << 16)
    book = bytearray(8 * ledger.SLOT)
    seg = Mount("seg", "own", "h", 0, len(data), ledger=LEDGER, ledger_slots=8)
    config = ReplicateConfig(replica_num=1, soft_pin=True)

    def write(seq: int, key: str, offset: int, value: bytes) -> None:
        data[offset:offset + len(value)] = value
        r = Replica("seg", offset, len(value), "dram", "h")
        rec = ledger.encode(seq, key, r, xxhash.xxh3_64_hexdigest(value), config)
        assert rec is not None
        at = ledger.slot_offset(0, 8, seq)
        book[at:at + len(rec)] = rec

    write(1, "removed", 0, b"gone" * 100)  # told to the owner, then removed (ledger 2 below)
    write(2, "told", 4096, b"told" * 100)
    write(3, "untold", 8192, b"new!" * 100)  # put_end answered, the owner not told yet
    write(4, "torn", 12288, b"torn" * 100)
    book[ledger.slot_offset(0, 8, 4) + 30] ^= 0xFF  # a record half written: skipped
    write(5, "overwritten", 16384, b"old." * 100)
    data[16384:16388] = b"NEW!"  # its bytes reused since: they fail the record's checksum

    holdings = Holdings()
    holdings.add("told", Replica("seg", 4096, 400, "dram", "h"),
                 xxhash.xxh3_64_hexdigest(b"told" * 100))
    holdings.ledger = 2  # the journal had told it up to record 2 (the remove of 1 included)

    def view(r: Replica) -> memoryview | None:
        return memoryview(data)[r.offset:r.offset + r.size] if r.segment == "seg" else None

    master = StoreMaster()
    conn = _Direct(master)
    keeper = HoldingsKeeper(conn, "own", seg, holdings, view, lambda: None,  # type: ignore[arg-type]
                            memoryview(book))
    assert keeper.beat() is True  # unknown to this master: re-mounts
    assert sorted(master.list()) == ["told", "untold"]
    assert master.describe("untold").config.soft_pin  # with the config it was put with
    remount = next(a for a in conn.asked if isinstance(a, p.Remount))
    assert remount.ledger_next == 5 + 1 + ledger.SLOTS  # past any seq the old leader gave out
    assert holdings.ledger == remount.ledger_next - 1


def test_scan_takes_intact_records_in_order() -> None:
    book = bytearray(4 * ledger.SLOT)
    for seq in (7, 5, 6):  # slots 2, 0, 1
        rec = ledger.encode(seq, f"k{seq}", Replica("s", seq, 1), "ff", None)
        assert rec is not None
        at = ledger.slot_offset(0, 4, seq)
        book[at:at + len(rec)] = rec
    assert [r.seq for r in ledger.scan(memoryview(book))] == [5, 6, 7]
    assert [r.key for r in ledger.scan(memoryview(book), after=5)] == ["k6", "k7"]
    assert ledger.encode(1, "x" * 600, Replica("s", 0, 1), "ff", None) is None  # too big
    assert not ledger.fits("x" * 600, None) and ledger.fits("x" * 100, None)
