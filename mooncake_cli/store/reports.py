"""Telling each client what lives in its DRAM segment, so the owner of the bytes can rebuild a
master's index after a restart or a failover, whoever wrote them.

The master's state (master/state.py) tells the `ReportBook` of every change of an object's
complete DRAM replicas, which notes it in the `Journal` of the client whose segment holds it
(a `Held` when one appears: put ended, re-registered, promoted; a `Gone` when it goes: removed,
evicted, offloaded). A client polls with the journal's epoch and the last sequence number it applied
(`ack`); the reply carries every change after `ack` (at most MAX_REPORT), so a lost reply is
simply sent again. A journal starts at the client's first poll with a snapshot of what its
segment holds then (`reset`: the client replaces what it knew); changes to one slot (key,
offset) are coalesced, so a journal never holds more than one entry per slot. Not thread-safe:
the master's lock guards it.

Durable acknowledgements (store/ha/acks.py): a journal also remembers what its client has
acknowledged (`acked`), and `collect()` gathers, in the calling thread, the (journal, seq)
marks the changes made meanwhile produced, so a put or remove is answered only once the owner of
every replica it touched has taken in the change (and would re-register it, or not, after a
failover).
"""

from __future__ import annotations

import threading
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import msgspec

from mooncake_cli.store.master.placement import SegmentTable
from mooncake_cli.store.records import (
    DEFAULT_CONFIG,
    Mount,
    ObjectMeta,
    Replica,
    ReplicaStatus,
    ReplicateConfig,
    check_key,
    evolve,
)

MAX_REPORT = 2048  # changes in one reply; the rest come with the next poll


class Held(msgspec.Struct, frozen=True, gc=False, omit_defaults=True):
    """A complete replica of `key` (checksum included) and the config the object was put with.
    A Struct: a report carries thousands (the default config is left out of the wire)."""

    key: str
    replica: Replica
    config: ReplicateConfig = DEFAULT_CONFIG

    def __post_init__(self) -> None:
        check_key(self.key)


def _held(key: str, replica: Replica, config: ReplicateConfig) -> Held:
    """A Held of fields the master checked already."""
    return Held(key, replica, config)


class Gone(msgspec.Struct, frozen=True, gc=False):
    """The replica of `key` at `offset` of the client's segment is no longer the master's.
    (Like Held, never tracked by the garbage collector: journals hold many.)"""

    key: str
    offset: int


@dataclass(frozen=True)
class HoldingsReport:
    """The answer to a poll. `known` False: the master does not know the client (mount again).
    `upto`: the sequence number to acknowledge; `reset`: forget what you knew, `added` is all.
    `ledger`: the last put-ledger record (store/ledger.py) these changes supersede."""

    known: bool = True
    epoch: str = ""
    upto: int = 0
    reset: bool = False
    added: tuple[Held, ...] = ()
    removed: tuple[Gone, ...] = ()
    ledger: int = 0


def _dram(meta: ObjectMeta | None) -> dict[tuple[str, int], Replica]:
    """The complete DRAM replicas of `meta` by (segment, offset)."""
    if meta is None or not meta.complete:
        return {}
    return {(r.segment, r.offset): r for r in meta.replicas
            if r.tier == "dram" and r.status is ReplicaStatus.COMPLETE}


class Journal:
    """The changes one client has not acknowledged, oldest first."""

    def __init__(self) -> None:
        self.epoch = uuid.uuid4().hex
        self.seq = 1  # 1: the reset itself; a client that acknowledged it has the snapshot
        self.acked = 0  # the last sequence number the client acknowledged of this journal
        self._entries: OrderedDict[tuple[str, int], tuple[int, Held | Gone]] = OrderedDict()
        self._keys: dict[str, int] = {}  # key -> its entries (slots) in `_entries`
        self.partial = False  # a put its writer recorded was left out (ReportBook.note's own)
        self.ledger = 0  # the put-ledger seq every acknowledged change supersedes
        self.wanted = 0  # the last seq a held answer waits for the client to acknowledge
        self._notes: deque[tuple[int, int]] = deque()  # (seq, ledger seq) not yet acknowledged

    def noted(self, ledger_seq: int) -> None:
        """The change just noted told of the put whose ledger record is `ledger_seq`."""
        self._notes.append((self.seq, ledger_seq))

    def note(self, change: Held | Gone) -> None:
        key = change.key
        slot = (key, change.replica.offset if isinstance(change, Held) else change.offset)
        self.seq += 1
        if self._entries.pop(slot, None) is None:
            self._keys[key] = self._keys.get(key, 0) + 1
        self._entries[slot] = (self.seq, change)

    def mentions(self, key: str) -> bool:
        """Whether a change of `key` is not acknowledged yet (reported or not)."""
        return key in self._keys

    def report(self, epoch: str, ack: int) -> HoldingsReport:
        if epoch != self.epoch:
            ack = 0  # the client never saw this journal: all of it again
        self.acked = max(self.acked, min(ack, self.seq))
        entries, done = self._entries, 0
        for seq, _ in entries.values():  # oldest first: count what was acknowledged ...
            if seq > ack:
                break
            done += 1
        keys = self._keys
        for _ in range(done):  # ... and drop it from the front (no iterator made per entry)
            key = entries.popitem(last=False)[0][0]
            if (n := keys[key]) > 1:
                keys[key] = n - 1
            else:
                del keys[key]
        notes = self._notes
        while notes and notes[0][0] <= ack:
            self.ledger = max(self.ledger, notes.popleft()[1])
        added: list[Held] = []
        removed: list[Gone] = []
        upto = self.seq
        for n, (seq, change) in enumerate(entries.values()):
            if n == MAX_REPORT:
                upto = seq - 1
                break
            if isinstance(change, Held):
                added.append(change)
            else:
                removed.append(change)
        ledger = self.ledger
        for seq, lseq in notes:
            if seq > upto:
                break
            ledger = max(ledger, lseq)
        return HoldingsReport(True, self.epoch, upto, ack < 1, tuple(added), tuple(removed),
                              ledger)

    def __len__(self) -> int:
        return len(self._entries)


class ReportBook:
    """The journals of the clients that poll, fed by the master's ObjectIndex."""

    def __init__(self, segments: SegmentTable) -> None:
        self._segments = segments
        self._journals: dict[str, Journal] = {}
        self._marks = threading.local()  # .found: {journal id: (journal, seq)} while collecting
        self._collecting = 0  # threads inside `collect` (none: a note marks nothing)
        self._collect_lock = threading.Lock()
        self.wants = 0
        # puts under way whose owners were told at put_start (announce): key -> {slot: replica}
        self._told: dict[str, dict[tuple[str, int], Replica]] = {}

    def note(self, old: ObjectMeta | None, new: ObjectMeta | None, own: str = "") -> None:
        """An object changed from `old` to `new` (None: absent): journal its DRAM replicas.
        A put that ended with `own`, the writer's segment: a replica there is recorded by the
        writer itself, so its journal is not told of it when it mentions nothing else of that
        key (an unacknowledged change of it could reach the writer after its own record and
        undo it). Never while changes are collected (HA: the owner confirms each). Likewise a
        removal with `own`, the remover's segment: the remover forgets its replica there."""
        if not self._journals:
            return
        key = new.key if new is not None else old.key if old is not None else ""
        told = self._told.get(key) if self._told else None
        if told is None and (old is None or old.put_deadline is not None):
            if new is None or new.put_deadline is not None:
                return  # no complete replica on either side (a put started or revoked)
            self._put_ended(new, own, self._owner)  # its complete DRAM replicas are news
            return
        before = _dram(old) if old is not None and old.put_deadline is None else {}
        after = _dram(new)
        for slot, r in before.items():
            if slot not in after and old is not None and (j := self._owner(r)) is not None:
                if new is None and self._own_record(j, key, r, own):
                    continue  # the remover's own: it forgets the replica itself
                j.note(Gone(key, r.offset))
                self._mark(j)
        for slot, r in after.items():
            if slot in before or new is None:
                continue
            if told is not None and slot in told and told[slot].checksum == r.checksum:
                continue  # its owner has it since put_start
            if (j := self._owner(r)) is not None:
                j.note(_held(key, r, new.config))  # the key was checked when the put started
                self._mark(j)
        if told is not None:
            self._settle(key, told, new)

    def note_ended(self, pairs: Sequence[tuple[ObjectMeta, ObjectMeta]], own: str = "") -> None:
        """`note(old, new, own)` of each put of a batch that ended; an owner looked up once
        per segment (of one mount) for the batch."""
        if not self._journals:
            return
        owners: dict[str, tuple[Mount, Journal]] = {}

        def owner(r: Replica) -> Journal | None:
            if (seen := owners.get(r.segment)) is not None and seen[0].holds(r.offset, r.size):
                return seen[1]
            seg = self._segments.locate(r)
            j = None if seg is None else self._journals.get(seg.client_id)
            if seg is not None and j is not None:
                owners[r.segment] = (seg, j)
            return j
        for old, new in pairs:
            if old.put_deadline is None or (self._told and new.key in self._told):
                self.note(old, new, own)  # not the plain end of a put
            else:
                self._put_ended(new, own, owner)

    def _put_ended(self, new: ObjectMeta, own: str,
                   owner: Callable[[Replica], Journal | None]) -> None:
        """The put of `new` ended: a Held for each of its complete DRAM replicas to the journal
        of its owner (found by `owner`), but for the writer's own record."""
        key, config, mark = new.key, new.config, self._mark
        for r in new.replicas:
            if r.tier == "dram" and r.status is ReplicaStatus.COMPLETE and \
                    (j := owner(r)) is not None and \
                    not (r.segment == own and self._own_record(j, key, r, own)):
                j.note(_held(key, r, config))  # the key was checked when the put started
                mark(j)

    def _own_record(self, j: Journal, key: str, r: Replica, own: str) -> bool:
        """Whether the writer (or remover) whose segment is `own` records this change of `r`
        itself, so that `j` is not told: when `r` is on `own`, nothing is collected (HA) and
        `j` mentions nothing else of `key` (marked partial then)."""
        if own and r.segment == own and not self._collecting and not j.mentions(key):
            j.partial = True
            return True
        return False

    def _settle(self, key: str, told: dict[tuple[str, int], Replica],
                new: ObjectMeta | None) -> None:
        """A put told at put_start ended, lost replicas or was dropped: a Gone for each told
        replica it no longer has; forgotten once it is complete or gone."""
        kept = {(r.segment, r.offset) for r in new.replicas} if new is not None else set()
        for slot, r in list(told.items()):
            if slot not in kept:
                if (j := self._owner(r)) is not None:
                    j.note(Gone(key, r.offset))
                    self._mark(j)
                del told[slot]
        if new is None or new.complete or not told:
            self._told.pop(key, None)

    def announce(self, key: str, replicas: Sequence[Replica], checksum: str,
                 config: ReplicateConfig) -> list[tuple[int, str, Journal, int]]:
        """A put of `key` started and its writer sent the checksum: tell the owners of its DRAM
        replicas now, as held (they re-register it only if the bytes match), so that their
        confirmation overlaps the write and put_end needs no round trip of its own. Per replica
        told: its index, its owner's client id, journal and the change's seq (the mark)."""
        out: list[tuple[int, str, Journal, int]] = []
        if not self._journals:
            return out
        told: dict[tuple[str, int], Replica] = {}
        for i, r in enumerate(replicas):
            if r.tier != "dram" or (seg := self._segments.locate(r)) is None or \
                    (j := self._journals.get(seg.client_id)) is None:
                continue
            held = evolve(r, checksum=checksum, status=ReplicaStatus.COMPLETE)
            j.note(_held(key, held, config))
            out.append((i, seg.client_id, j, j.seq))
            told[(r.segment, r.offset)] = held
        if told:
            self._told[key] = told
        return out

    def _mark(self, journal: Journal) -> None:
        if not self._collecting:
            return
        found = getattr(self._marks, "found", None)
        if found is not None:
            found[id(journal)] = (journal, journal.seq)

    @contextmanager
    def collect(self) -> Iterator[list[tuple[Journal, int]]]:
        """The (journal, seq) marks of the changes noted by this thread inside the block
        (filled in when it ends)."""
        marks: list[tuple[Journal, int]] = []
        self._marks.found = {}
        with self._collect_lock:
            self._collecting += 1
        try:
            yield marks
        finally:
            with self._collect_lock:
                self._collecting -= 1
            marks.extend(self._marks.found.values())
            self._marks.found = None

    def confirmed(self, journal: Journal, seq: int) -> bool:
        """Whether the client of `journal` acknowledged up to `seq`, or left (its journal was
        dropped: its segment, and the replicas on it, are gone anyway)."""
        return journal.acked >= seq or all(j is not journal for j in self._journals.values())

    def news(self, client_id: str, upto: int) -> bool:
        """Whether `client_id`'s journal has changes after `upto` that a held answer waits for
        (`want`), or is gone or replaced."""
        journal = self._journals.get(client_id)
        return journal is None or journal.wanted > upto

    def want(self, marks: Iterable[tuple[Journal, int]]) -> None:
        """Answers wait for these marks: their owners' held polls are answered now (`wants`
        counts the calls that asked for more than was asked before)."""
        for journal, seq in marks:
            if seq > journal.wanted:
                journal.wanted = seq
                self.wants += 1

    def open(self, client_id: str, objects: Iterable[ObjectMeta],
             epoch: str | None = None) -> Journal:
        """The journal of `client_id`, started (with a snapshot of every complete DRAM replica
        its segments hold) when it has none."""
        journal = self._journals.get(client_id)
        if journal is None or (journal.partial and epoch is not None and epoch != journal.epoch):
            # a client that does not follow a journal lacking the puts their writers recorded
            # themselves (note's `own`) starts from a snapshot instead
            journal = self._journals[client_id] = Journal()
            for meta in objects:
                for r in _dram(meta).values():
                    seg = self._segments.locate(r)
                    if seg is not None and seg.client_id == client_id:
                        journal.note(Held(meta.key, r, meta.config))
        return journal

    def journal(self, client_id: str) -> Journal | None:
        return self._journals.get(client_id)

    def _owner(self, r: Replica) -> Journal | None:
        client = self._segments.client_of(r)
        return None if client is None else self._journals.get(client)

    def report(self, client_id: str, epoch: str, ack: int,
               objects: Iterable[ObjectMeta]) -> HoldingsReport:
        """The changes for `client_id` after `ack`; its first poll starts its journal with a
        snapshot of every complete DRAM replica its segments hold."""
        return self.open(client_id, objects, epoch).report(epoch, ack)

    def drop(self, client_id: str) -> None:
        """Forget the journal of a client that left (its next poll starts a new one)."""
        self._journals.pop(client_id, None)
