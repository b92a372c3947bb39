"""Durable acknowledgements of an HA master: a put or a remove is answered only once the owner
of every replica it touched has taken in the change, so a new leader, rebuilt from the owners'
holdings (master/rebuild.py), knows every acknowledged object and none that was removed.

How: while a request changes objects, the holdings journals (reports.py) collect the
(journal, seq) marks of the owners it touched; the answer to a PutEnd / BatchPutEnd / Remove /
BatchRemove / RemoveAll / BatchReplicaClear is held (a `Pending`) until each owner acknowledged
its mark with its next PollHoldings. Owners long-poll (PollHoldings.wait) over the same-host
lane when there is one: an empty poll is held until a change for them comes, and one report
carries every change that came meanwhile. A writer that sends its checksum with put_start (HA
clients do) has the owners told right then (`ReportBook.announce`): their confirmation runs
while the bytes are written, and the put_end waits only for what is left of it; one that also
asks for ledger notes (HA StoreClients do) gets a ledger slot per replica (notes.py), leaves its
record there with the bytes, and its put_end is answered at once. An owner that
does not confirm within DURABLE_TIMEOUT gets the writer an error; a leader that lost its term
meanwhile answers NotLeader, and the client sends the request again to the new leader.

A leader in its first WARM_UP seconds is still being refilled by the owners: a read that misses
answers NotLeader ("not ready, retry") rather than ObjectNotFound, and the client retries.

    acks = Acks()
    answer = acks.run(lambda: service.master, request)   # a Reply, or a Pending
    reply = answer if isinstance(answer, Reply) else acks.block(answer)
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from mooncake_cli.store.errors import StoreCode, StoreError
from mooncake_cli.store.ha.leader import NotLeader
from mooncake_cli.store.ha.notes import Notes
from mooncake_cli.store.master import StoreMaster
from mooncake_cli.store.records import DEFAULT_CONFIG, Replica
from mooncake_cli.store.reports import Journal, ReportBook
from mooncake_cli.store.wire import protocol as p

DURABLE_TIMEOUT = 2.0  # seconds an owner has to confirm a change (below clients' timeouts)
MAX_POLL_WAIT = 2.0  # the longest a PollHoldings is held
WARM_UP = 1.0  # seconds a new leader answers misses with "not ready, retry"
MAX_TOLD = 100_000  # put_start marks kept for puts under way
STARTS = (p.PutStart, p.BatchPutStart)
DURABLE = (p.PutEnd, p.BatchPutEnd, p.Remove, p.BatchRemove, p.RemoveAll, p.BatchReplicaClear)
READS = (p.GetReplicaList, p.BatchGetReplicaList, p.Exists, p.BatchExists, p.Describe,
         p.BatchDescribe)
_FALSE = msgspec.msgpack.encode(False)
# the same as sets of types, for the hot path (isinstance on a Struct costs 0.15 µs a class)
_STARTS, _DURABLE, _READS = frozenset(STARTS), frozenset(DURABLE), frozenset(READS)
_MOUNTS, _REVOKES = frozenset((p.MountSegment, p.Remount)), frozenset((p.PutRevoke,
                                                                       p.BatchPutRevoke))


@dataclass
class Pending:
    """An answer held back: sent once `ready()`, or at `deadline` (time.monotonic())."""

    ready: Callable[[], bool]
    reply: Callable[[], p.Reply]  # the answer to send (when ready, or at the deadline)
    deadline: float


class Acks:
    """Held answers of one MasterService. `durable` (set by HaMaster) turns durable puts and
    removes on; long polls are held either way. `fileno()` becomes readable after `poke()`."""

    def __init__(self, timeout: float = DURABLE_TIMEOUT) -> None:
        self.durable = False
        self.timeout = timeout
        self.warm_until = 0.0  # time.monotonic() until which misses answer "not ready"
        self._told: dict[str, tuple[ReportBook, list[tuple[Journal, int]]]] = {}
        self.notes = Notes()
        self._cond = threading.Condition()
        self.loop_holds = False  # whether the zmq loop holds answers (else no need to wake it)
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        os.set_blocking(self._w, False)

    def run(self, current: Callable[[], StoreMaster], request: p.Request) -> p.Reply | Pending:
        """Run `request` on `current()`: its reply, or a Pending to answer later."""
        master = current()
        kind, durable = type(request), self.durable
        polls = kind is p.PollHoldings
        if polls and isinstance(request, p.PollHoldings) and request.wait > 0:
            return self._poll(current, master, request)
        if durable and kind in _STARTS and isinstance(request, STARTS):
            return self._start(master, request)
        if kind in _MOUNTS and isinstance(request, (p.MountSegment, p.Remount)):
            return self._mount(master, request)
        if durable and kind in _REVOKES:
            self._take(master.state.reports, request)
        if not (durable and kind in _DURABLE):
            reply = p.run(master, request)
            if polls:
                self.poke()  # an owner's acknowledgement: held answers may be ready
            elif kind in _READS and self.warm_until and time.monotonic() < self.warm_until \
                    and _missing(request, reply):
                return p.error(NotLeader("the store leader was just elected and is rebuilding "
                                         "its index from the clients: not ready, retry"))
            return reply
        book = master.state.reports
        with book.collect() as marks:
            reply = p.run(master, request)
        if marks:
            self.poke()  # the owners' held polls have news
        marks += self._take(book, request)
        if not marks:
            return reply
        book.want(marks)

        def ready() -> bool:
            with master.state.lock:
                return current() is not master or all(book.confirmed(j, s) for j, s in marks)

        if ready():  # confirmed already (told at put_start)
            return reply

        def answer() -> p.Reply:
            if current() is not master:
                return p.error(NotLeader("this master lost the leadership before the owners "
                                         "confirmed the change: retry with the new leader"))
            if ready():
                return reply
            return p.error(StoreError(f"{type(request).__name__}: the owner of a replica did "
                                      f"not confirm the change within {self.timeout:g} s; it "
                                      f"may not survive a failover of the master",
                                      StoreCode.RPC_FAIL))
        return Pending(ready, answer, time.monotonic() + self.timeout)

    def _start(self, master: StoreMaster, request: p.PutStart | p.BatchPutStart) -> p.Reply:
        """Run a put_start and tell the owners of its replicas at once (with the checksum the
        writer sent); the marks wait for the put_end."""
        book = master.state.reports
        config = request.config or DEFAULT_CONFIG
        with master.state.lock:
            wants = book.wants
            try:
                value = request.call(master)
            except StoreError as e:
                return p.error(e)
            noted: dict[str, list[Replica]] = {}
            for key, replicas, checksum in _started(request, value):
                told = book.announce(key, replicas, checksum, config)
                if not told:
                    continue
                slots = self.notes.assign(book, key, replicas, told, request.config) \
                    if request.notes else None
                if slots is None:
                    marks = [(j, seq) for _, _, j, seq in told]
                    self._told[key] = (book, marks)
                    book.want(marks)  # confirmed while the bytes are written
                else:
                    noted[key] = slots
        if len(self._told) > MAX_TOLD:  # puts never ended nor revoked: their waits are moot
            self._told.clear()
        if book.wants != wants:
            self.poke()  # owners to wake
        if isinstance(request, p.PutStart):
            return p.ok(noted.get(request.key, value))
        return p.replies([v if isinstance(v, StoreError) else noted.get(k, v)
                          for k, v in zip(request.keys, value, strict=True)])

    def _mount(self, master: StoreMaster, request: p.MountSegment | p.Remount) -> p.Reply:
        """A (re)mount: its ledger numbers from the request's `ledger_next` from now on."""
        with master.state.lock:
            reply = p.run(master, request)
            if reply.ok:
                self.notes.mounted(request.segment, request.ledger_next, master.state.reports)
        return reply

    def _take(self, book: ReportBook, request: p.Request) -> list[tuple[Journal, int]]:
        """The put_start marks of the keys `request` ends or revokes (forgotten here)."""
        keys = request.keys if isinstance(request, (p.BatchPutEnd, p.BatchPutRevoke)) else \
            [request.key] if isinstance(request, (p.PutEnd, p.PutRevoke)) else []
        out: list[tuple[Journal, int]] = []
        for key in keys:
            told = self._told.pop(key, None)
            if told is not None and told[0] is book:
                out += told[1]
        return out

    def _poll(self, current: Callable[[], StoreMaster], master: StoreMaster,
              request: p.PollHoldings) -> p.Reply | Pending:
        try:
            report = master.poll_holdings(request.client_id, request.epoch, request.ack)
        except StoreError as e:
            return p.error(e)
        self.poke()
        if not report.known or report.reset or report.added or report.removed:
            return p.ok(report)
        again = p.PollHoldings(request.client_id, request.epoch, request.ack)
        book = master.state.reports

        def ready() -> bool:
            if current() is not master:
                return True
            if not self.durable:
                return False  # nothing waits on this owner: answer at the deadline
            with master.state.lock:
                return book.news(request.client_id, report.upto)
        return Pending(ready, lambda: p.run(current(), again),
                       time.monotonic() + min(request.wait, MAX_POLL_WAIT))

    def block(self, pending: Pending) -> p.Reply:
        """Wait in this thread until `pending` is ready or due; its reply."""
        with self._cond:
            while not pending.ready():
                left = pending.deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(min(left, 0.25))
        return pending.reply()

    def poke(self) -> None:
        """Something held may be ready now: wake the waiters and the zmq loop."""
        with self._cond:
            self._cond.notify_all()
        if not self.loop_holds:
            return
        try:
            os.write(self._w, b"\0")
        except BlockingIOError:
            pass  # the pipe is full: the loop is awake anyway

    def fileno(self) -> int:
        return self._r

    def drain(self) -> None:
        try:
            while os.read(self._r, 4096):
                pass
        except BlockingIOError:
            pass

    def close(self) -> None:
        for fd in (self._r, self._w):
            try:
                os.close(fd)
            except OSError:
                pass


def _started(request: p.PutStart | p.BatchPutStart, value: Any
             ) -> list[tuple[str, Sequence[Replica], str]]:
    """(key, replicas, checksum) of each put a put_start began (its result `value`), where
    the writer sent the checksum."""
    if isinstance(request, p.PutStart):
        return [] if request.checksum is None else [(request.key, value, request.checksum)]
    if request.checksums is None or len(request.checksums) != len(request.keys):
        return []
    return [(key, v, checksum) for key, checksum, v in zip(request.keys, request.checksums, value,
                                                           strict=True)
            if not isinstance(v, StoreError)]


def _missing(request: p.Request, reply: p.Reply) -> bool:
    """Whether a read's reply says a key is absent (not found, or exists False)."""
    if not reply.ok:
        return reply.code == StoreCode.OBJECT_NOT_FOUND
    if isinstance(request, p.Exists):
        return bytes(reply.result) == _FALSE
    if isinstance(request, (p.BatchGetReplicaList, p.BatchExists, p.BatchDescribe)):
        try:
            items = msgspec.msgpack.decode(reply.result, type=list[p.Reply])
        except (msgspec.DecodeError, msgspec.ValidationError):
            return False
        return any(not i.ok and i.code == StoreCode.OBJECT_NOT_FOUND
                   or bytes(i.result) == _FALSE for i in items)
    return False
