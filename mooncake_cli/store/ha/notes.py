"""An HA leader's side of the put ledgers (store/ledger.py): which ledger slot the writer of each
replica fills, and when a slot may be filled again.

Each owner's ledger numbers its records 1, 2, ... from the `ledger_next` its (re)mount named,
so a record left by a writer of an earlier leader is never mistaken for one of this leader. The
record of seq t goes in the slot of seq t - slots, which is free once the owner has acknowledged
the journal change that told it of that put (then its holdings cover it). A put that finds no
free slot (an owner that stopped polling), an owner without a ledger, or a record too big for a
slot gets no record: its put_end waits for the owner's confirmation instead (acks.py). Owners
are not woken for changes no answer waits on: they take them in with their next poll, or as
soon as half of their ledger's slots wait.
Not thread-safe: called under the master's lock.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from mooncake_cli.store import ledger
from mooncake_cli.store.records import Mount, Replica, ReplicateConfig, evolve
from mooncake_cli.store.reports import Journal, ReportBook


@dataclass
class _Ledger:
    base: int
    slots: int
    next: int
    waiting: deque[tuple[int, Journal, int]] = field(default_factory=deque)  # seq, journal, mark


class Notes:
    """The ledgers of the clients of one leader, by client id."""

    def __init__(self) -> None:
        self._ledgers: dict[str, _Ledger] = {}

    def mounted(self, segment: Mount, ledger_next: int, book: ReportBook) -> None:
        """A (re)mount of `segment` whose ledger numbers from `ledger_next`."""
        if segment.tier != "dram" or segment.ledger_slots == 0:
            return
        known = self._ledgers.get(segment.client_id)
        if known is not None and known.base == segment.ledger and known.next >= ledger_next:
            return  # a repeat of this mount: its records and slots stand
        start = max(ledger_next, known.next if known is not None else 1)
        self._ledgers[segment.client_id] = _Ledger(segment.ledger, segment.ledger_slots, start)
        journal = book.journal(segment.client_id)
        if journal is not None:
            journal.ledger = max(journal.ledger, start - 1)

    def assign(self, book: ReportBook, key: str, replicas: Sequence[Replica],
               told: Sequence[tuple[int, str, Journal, int]],
               config: ReplicateConfig | None) -> list[Replica] | None:
        """`replicas` with a ledger slot for the record of each one whose owner was `told`
        (ReportBook.announce: index, client id, journal, mark); None when one of them can have
        no record (then the put must wait for its owners)."""
        if not ledger.fits(key, config):
            return None
        out = list(replicas)
        for i, client_id, journal, mark in told:
            led = self._ledgers.get(client_id)
            if led is None:
                return None
            waiting = led.waiting
            while waiting and book.confirmed(*waiting[0][1:]):
                waiting.popleft()  # taken in by the owner: its slot is free
            seq = led.next
            if waiting and waiting[0][0] <= seq - led.slots:
                return None  # the ring is full of records the owner has not taken in
            led.next += 1
            waiting.append((seq, journal, mark))
            journal.noted(seq)
            if len(waiting) > led.slots // 2 and journal.wanted <= journal.acked:
                book.want([(journal, journal.seq)])  # have the owner take them in, once
            out[i] = evolve(out[i], note_at=ledger.slot_offset(led.base, led.slots, seq),
                            note_seq=seq)
        return out
