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
"""

from __future__ import annotations

import uuid
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

from mooncake_cli.store.master.placement import SegmentTable
from mooncake_cli.store.records import (
    ObjectMeta,
    Replica,
    ReplicaStatus,
    ReplicateConfig,
    check_key,
)

MAX_REPORT = 2048  # changes in one reply; the rest come with the next poll


@dataclass(frozen=True)
class Held:
    """A complete replica of `key` (checksum included) and the config the object was put with."""

    key: str
    replica: Replica
    config: ReplicateConfig = ReplicateConfig()

    def __post_init__(self) -> None:
        check_key(self.key)


@dataclass(frozen=True)
class Gone:
    """The replica of `key` at `offset` of the client's segment is no longer the master's."""

    key: str
    offset: int


@dataclass(frozen=True)
class HoldingsReport:
    """The answer to a poll. `known` False: the master does not know the client (mount again).
    `upto`: the sequence number to acknowledge; `reset`: forget what you knew, `added` is all."""

    known: bool = True
    epoch: str = ""
    upto: int = 0
    reset: bool = False
    added: tuple[Held, ...] = ()
    removed: tuple[Gone, ...] = ()


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
        self._entries: OrderedDict[tuple[str, int], tuple[int, Held | Gone]] = OrderedDict()

    def note(self, change: Held | Gone) -> None:
        slot = (change.key, change.replica.offset if isinstance(change, Held) else change.offset)
        self.seq += 1
        self._entries.pop(slot, None)
        self._entries[slot] = (self.seq, change)

    def report(self, epoch: str, ack: int) -> HoldingsReport:
        if epoch != self.epoch:
            ack = 0  # the client never saw this journal: all of it again
        while self._entries:
            slot, (seq, _) = next(iter(self._entries.items()))
            if seq > ack:
                break
            del self._entries[slot]
        added: list[Held] = []
        removed: list[Gone] = []
        upto = self.seq
        for n, (seq, change) in enumerate(self._entries.values()):
            if n == MAX_REPORT:
                upto = seq - 1
                break
            if isinstance(change, Held):
                added.append(change)
            else:
                removed.append(change)
        return HoldingsReport(True, self.epoch, upto, ack < 1, tuple(added), tuple(removed))

    def __len__(self) -> int:
        return len(self._entries)


class ReportBook:
    """The journals of the clients that poll, fed by the master's ObjectIndex."""

    def __init__(self, segments: SegmentTable) -> None:
        self._segments = segments
        self._journals: dict[str, Journal] = {}

    def note(self, old: ObjectMeta | None, new: ObjectMeta | None) -> None:
        """An object changed from `old` to `new` (None: absent): journal its DRAM replicas."""
        if not self._journals:
            return
        before, after = _dram(old), _dram(new)
        for slot, r in before.items():
            if slot not in after and old is not None and (j := self._owner(r)) is not None:
                j.note(Gone(old.key, r.offset))
        for slot, r in after.items():
            if slot not in before and new is not None and (j := self._owner(r)) is not None:
                j.note(Held(new.key, r, new.config))

    def _owner(self, r: Replica) -> Journal | None:
        seg = self._segments.locate(r)
        return None if seg is None else self._journals.get(seg.client_id)

    def report(self, client_id: str, epoch: str, ack: int,
               objects: Iterable[ObjectMeta]) -> HoldingsReport:
        """The changes for `client_id` after `ack`; its first poll starts its journal with a
        snapshot of every complete DRAM replica its segments hold."""
        journal = self._journals.get(client_id)
        if journal is None:
            journal = self._journals[client_id] = Journal()
            for meta in objects:
                for r in _dram(meta).values():
                    seg = self._segments.locate(r)
                    if seg is not None and seg.client_id == client_id:
                        journal.note(Held(meta.key, r, meta.config))
        return journal.report(epoch, ack)

    def drop(self, client_id: str) -> None:
        """Forget the journal of a client that left (its next poll starts a new one)."""
        self._journals.pop(client_id, None)
