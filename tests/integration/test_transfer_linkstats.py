"""The transfer engine's link statistics: per peer and direction, the bytes its batches moved
and the wall time they took (requests side by side count once), failures counting nothing."""

from __future__ import annotations

from mooncake_cli.transfer.batch import Op, State, TransferRequest
from mooncake_cli.transfer.linkstats import LinkStats, Traffic

MiB = 1 << 20
SECRET = "linkstats-secret"


def test_reads_and_writes_count_per_peer_and_direction(make_engine) -> None:
    target = make_engine(secret=SECRET, transport="tcp")
    initiator = make_engine(secret=SECRET, transport="tcp")
    remote = target.register(bytearray(b"\x07" * (8 * MiB)))
    local = initiator.register(bytearray(8 * MiB))
    before = initiator.links.snapshot()
    reads = [TransferRequest(Op.READ, local, o, target.name, remote.base + o, 2 * MiB)
             for o in range(0, 8 * MiB, 2 * MiB)]
    assert [s.state for s in initiator.submit(reads).wait(30)] == [State.COMPLETED] * 4
    write = TransferRequest(Op.WRITE, local, 0, target.name, remote.base, MiB)
    assert initiator.submit([write]).wait(30)[0].state is State.COMPLETED
    moved = LinkStats.since(before, initiator.links.snapshot())
    assert set(moved) == {(target.name, "read"), (target.name, "write")}
    read = moved[(target.name, "read")]
    assert (read.bytes, read.batches) == (8 * MiB, 1)
    assert read.seconds > 0 and read.bandwidth is not None and read.bandwidth > 0
    assert moved[(target.name, "write")].bytes == MiB
    assert target.links.snapshot() == {}  # the target served them: it moved nothing itself


def test_a_failed_request_counts_nothing(make_engine) -> None:
    target = make_engine(secret=SECRET, transport="tcp")
    initiator = make_engine(secret=SECRET, transport="tcp")
    remote = target.register(bytearray(MiB))
    local = initiator.register(bytearray(2 * MiB))
    bad = TransferRequest(Op.READ, local, 0, target.name, remote.base + MiB, MiB)  # past its end
    good = TransferRequest(Op.READ, local, MiB, target.name, remote.base, MiB)
    states = [s.state for s in initiator.submit([bad, good]).wait(30)]
    assert states == [State.FAILED, State.COMPLETED]
    assert initiator.links.snapshot()[(target.name, "read")].bytes == MiB


def test_traffic_between_snapshots() -> None:
    before = {("p", "read"): Traffic(100, 1.0, 1)}
    after = {("p", "read"): Traffic(600, 1.5, 2), ("q", "write"): Traffic(0, 0.0, 0)}
    assert LinkStats.since(before, after) == {("p", "read"): Traffic(500, 0.5, 1)}
    assert Traffic(500, 0.5, 1).bandwidth == 1000.0
    assert Traffic().bandwidth is None
