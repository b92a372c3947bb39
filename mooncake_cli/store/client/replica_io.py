"""Moving object bytes between a caller's buffer and replicas, with checksums.

A replica on the client's own segment is copied with a plain memcpy; any other one goes through
the transfer engine (which picks shared memory for a same-host peer, TCP otherwise), staged
through one region registered once per client and reused (staging.py; an object too big for it
registers the caller's buffer for its one transfer); a read into memory the caller registered
with the engine goes straight there (landing.py). A batch moves every remote replica in one
engine batch. Reads try the nearest replica first (own segment, then same host) and move on
when a transfer fails or the bytes fail their xxh3_64 checksum: wrong bytes are never handed
back.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from itertools import accumulate
from typing import Any

from xxhash import xxh3_64_hexdigest

from mooncake_cli.interfaces import MooncakeError
from mooncake_cli.store.client.landing import Landing
from mooncake_cli.store.client.staging import Staging
from mooncake_cli.store.client.values import (
    AHEAD,
    FUSED,
    Gathered,
    checksum,
    copy_checked,
    copy_hashed,
    copy_into,
)
from mooncake_cli.store.errors import (
    BufferOverflow,
    ChecksumMismatch,
    ObjectNotFound,
    StoreError,
    TransferFailed,
)
from mooncake_cli.store.ledger import Note
from mooncake_cli.store.records import Replica
from mooncake_cli.transfer.batch import Op, State, TransferRequest
from mooncake_cli.transfer.engine import TransferEngine
from mooncake_cli.transfer.segment import Region


def _failed(what: str, reason: str | None) -> TransferFailed:
    return TransferFailed(f"{what}: {reason or 'timed out'}")


def _copy(dest: memoryview, view: memoryview) -> bool:
    dest[:len(view)] = view
    return True


class ReplicaIO:
    """Reads and writes replicas for one client: `engine`, and its own `region` (or None)."""

    def __init__(self, engine: TransferEngine, region: Region | None, host: str,
                 timeout: float) -> None:
        self.engine = engine
        self.region = region
        self.host = host
        self.timeout = timeout
        self._stage = Staging(engine)
        self.ledger: Region | None = None  # this client's put ledger (HA), see store/ledger.py
        self._landing = Landing(engine)

    def _span(self) -> tuple[memoryview | None, int, int, str]:
        """This client's own region as a batch tests its replicas against it inline (what
        `local_view` tests per replica): its view (None: no host region), [base, end), and
        the segment name."""
        region = self.region
        if region is None or region.view is None:
            return None, 0, 0, self.engine.name
        return region.view, region.base, region.base + region.length, self.engine.name

    def local_view(self, r: Replica) -> memoryview | None:
        """The bytes of `r` when it lives in this client's own region."""
        region = self.region
        if region is None or region.view is None or r.segment != self.engine.name:
            return None
        start = r.offset - region.base
        if start < 0 or start + r.size > region.length:
            return None
        return region.view[start:start + r.size]

    def fusing(self, views: Sequence[memoryview | Gathered], ha: bool) -> list[bool]:
        """Per value of a put, whether it is hashed as it is copied into this client's own
        region (`write_hashed`) instead of while the master works on the put's start: past the
        put's first AHEAD bytes, from FUSED bytes, with a region, without HA (whose checksums
        go with the put start)."""
        if ha or self.region is None:
            return [False] * len(views)
        out, total = [], 0
        for v in views:
            total += len(v)
            out.append(total > AHEAD and len(v) >= FUSED)
        return out

    def write_hashed(self, view: memoryview | Gathered,
                     replicas: Sequence[Replica]) -> tuple[str, list[Replica]]:
        """Copy `view` into the first of `replicas` in this client's own region while hashing
        it (one pass over the bytes instead of a hash and then a copy): its checksum and the
        replicas left to write (all of them, hashed alone, when none is there)."""
        for j, r in enumerate(replicas):
            local = self.local_view(r)
            if local is not None:
                return copy_hashed(local, view), [*replicas[:j], *replicas[j + 1:]]
        return checksum(view), list(replicas)

    def near(self, r: Replica) -> memoryview | None:
        """The bytes of `r` as this process maps them: in its own region, or in a same-host
        peer's memory that the engine maps (shm); None when only a transfer reaches them."""
        local = self.local_view(r)
        if local is not None or r.host != self.host or r.tier != "dram":
            return local
        return self.engine.mapped(r.segment, r.offset, r.size)

    def copy_near(self, key: str, r: Replica, src: memoryview, dest: memoryview,
                  errors: list[StoreError]) -> bool:
        """Copy mapped `src` (see `near`) into `dest`, verified as it goes; False (the error
        noted) when the bytes fail their checksum."""
        if copy_checked(dest, src, r.checksum):
            return True
        errors.append(ChecksumMismatch(f"replica of {key!r} on {r.segment} at {r.offset} "
                                       f"fails its checksum"))
        return False

    def close(self) -> None:
        """Release the staging region (the engine stays up)."""
        self._stage.close()

    def _run(self, reqs: list[TransferRequest]) -> list[str | None]:
        """Submit `reqs` as one batch; per request None when done, else why it failed."""
        if not reqs:
            return []
        statuses = self.engine.submit(reqs).wait(self.timeout * 2)
        return [None if st.state is State.COMPLETED else (st.reason or "timed out")
                for st in statuses]

    # -- writes ----------------------------------------------------------------------------------
    def write(self, view: memoryview | Gathered, replicas: Sequence[Replica],
              notes: Sequence[Note] = ()) -> None:
        """Write `view` to every replica (and its ledger `notes`); TransferFailed if any write
        fails."""
        err = self.write_batch([view], [replicas], [notes])[0]
        if err is not None:
            raise err

    def write_batch(self, views: Sequence[memoryview | Gathered],
                    replicas: Sequence[Sequence[Replica]],
                    notes: Sequence[Sequence[Note]] = ()) -> list[StoreError | None]:
        """Write each view to its replicas, and each view's ledger `notes` (store/ledger.py),
        every remote write in one engine batch; per view None when all of its writes were done,
        else the error."""
        out: list[StoreError | None] = [None] * len(views)
        remote: list[tuple[int, Replica]] = []
        mine, base, end, name = self._span()
        for i, (view, rs) in enumerate(zip(views, replicas, strict=True)):
            for r in rs:  # local_view's test, inline: a batch of small values is mostly this
                at = r.offset
                if mine is not None and r.segment == name and base <= at and at + r.size <= end:
                    if type(view) is memoryview and len(view) <= r.size:
                        mine[at - base:at - base + len(view)] = view
                    else:
                        copy_into(mine[at - base:at - base + r.size], view)
                else:
                    remote.append((i, r))
        far: list[tuple[int, Note]] = []
        for i, ns in enumerate(notes):
            far += [(i, note) for note in ns if not self._note_here(note)]
        if not remote and not far:
            return out
        firsts = sorted({i for i, _ in remote})
        staged = sum(len(views[i]) for i in firsts)
        with self._stage.hold(staged + sum(len(note[2]) for _, note in far)) as stage:
            temps: list[Region] = []
            where: dict[int, tuple[Region, int]] = {}
            try:
                pos = 0
                for i in firsts:
                    n = len(views[i])
                    if stage is not None:
                        assert stage.view is not None
                        copy_into(stage.view[pos:pos + n], views[i])
                        where[i] = (stage, pos)
                        pos += n
                    else:  # too big to stage: register the value (or a writable copy of it)
                        v = views[i]
                        v = v.joined() if isinstance(v, Gathered) else v
                        temps.append(self.engine.register(v if not v.readonly else bytearray(v)))
                        where[i] = (temps[-1], 0)
                reqs = [TransferRequest(Op.WRITE, where[i][0], where[i][1], r.segment, r.offset,
                                        len(views[i])) for i, r in remote]
                if far:  # the records go after the values in the stage (or a region of their own)
                    if stage is None:
                        size = sum(len(note[2]) for _, note in far)
                        temps.append(self.engine.register(bytearray(size)))
                    hold = stage or temps[-1]
                    assert hold.view is not None
                    for _, (seg, off, rec) in far:
                        hold.view[pos:pos + len(rec)] = rec
                        reqs.append(TransferRequest(Op.WRITE, hold, pos, seg, off, len(rec)))
                        pos += len(rec)
                reasons = self._run(reqs)
            finally:
                for t in temps:
                    self.engine.unregister(t)
        targets = [(i, r.segment, r.offset) for i, r in remote] + [(i, n[0], n[1]) for i, n in far]
        for (i, seg, off), why in zip(targets, reasons, strict=True):
            if why is not None and out[i] is None:
                out[i] = _failed(f"writing {seg}@{off}", why)
        return out

    def _note_here(self, note: Note) -> bool:
        """Copy a ledger record straight into memory this process maps, when it goes there:
        its own ledger, or a same-host owner's (shm); False when a transfer must take it."""
        seg, off, rec = note
        led = self.ledger
        if seg != self.engine.name:
            view = self.engine.mapped(seg, off, len(rec))
            if view is None:
                return False
            view[:] = rec
            return True
        if led is None or led.view is None:
            return False
        start = off - led.base
        if start < 0 or start + len(rec) > led.length:
            return False
        led.view[start:start + len(rec)] = rec
        return True

    # -- reads -----------------------------------------------------------------------------------
    def order(self, replicas: Sequence[Replica]) -> list[Replica]:
        if len(replicas) < 2:
            return list(replicas)
        return sorted(replicas, key=lambda r: (r.segment != self.engine.name, r.host != self.host))

    @contextmanager
    def staged(self, keys: Sequence[str], remote: list[tuple[int, Replica]]
               ) -> Iterator[list[tuple[int, Replica, Any]]]:
        """Read each (index, replica) of `remote` into one staging hold, in one engine batch:
        the (index, replica, view) of those read and verified, the views valid inside the
        `with` ([] when the batch is too big to stage: the caller reads one by one)."""
        with self._stage.hold(sum(r.size for _, r in remote)) as stage:
            if stage is None or stage.view is None:
                yield []
                return
            offs = list(accumulate((r.size for _, r in remote), initial=0))[:-1]
            reqs = [TransferRequest(Op.READ, stage, o, r.segment, r.offset, r.size)
                    for o, (_, r) in zip(offs, remote, strict=True)]
            got = []
            for o, (i, r), why in zip(offs, remote, self._run(reqs), strict=True):
                view = stage.view[o:o + r.size]
                if why is None and self._check(keys[i], r, view, []):
                    got.append((i, r, view))
            yield got

    def _check(self, key: str, r: Replica, data: Any, errors: list[StoreError]) -> bool:
        if r.checksum is None or checksum(data) == r.checksum:
            return True
        errors.append(ChecksumMismatch(f"replica of {key!r} on {r.segment} at {r.offset} "
                                       f"fails its checksum"))
        return False

    def _take(self, key: str, r: Replica, errors: list[StoreError], view: memoryview) -> bytes:
        """A copy of staged `view` when it passes its checksum, else b"" (error noted)."""
        return bytes(view) if self._check(key, r, view, errors) else b""

    @staticmethod
    def _raise(key: str, replicas: Sequence[Replica], errors: list[StoreError]) -> None:
        if not replicas:
            raise ObjectNotFound(f"object {key!r} has no replica")
        if any(isinstance(e, ChecksumMismatch) for e in errors):
            raise ChecksumMismatch("; ".join(map(str, errors)))
        raise TransferFailed("; ".join(map(str, errors)))

    def _fetch(self, r: Replica, n: int, use: Callable[[memoryview], Any]) -> Any:
        """Read `n` bytes of remote replica `r` into staging and return `use(view)` of them;
        None when the object is too big to stage."""
        with self._stage.hold(n) as stage:
            if stage is None or stage.view is None:
                return None
            self.engine.transfer(Op.READ, stage, 0, r.segment, r.offset, n, self.timeout * 2)
            return use(stage.view[:n])

    def read_bytes(self, key: str, replicas: Sequence[Replica]) -> bytes:
        """The bytes of a good replica of `key` (one copy for a replica this process maps)."""
        errors: list[StoreError] = []
        for r in self.order(replicas):
            local = self.near(r)
            try:
                if local is not None:
                    data = bytes(local)
                else:  # b"": staged, failed its checksum; None: too big to stage
                    staged = self._fetch(r, r.size, partial(self._take, key, r, errors))
                    if staged is None:
                        buf = bytearray(r.size)
                        self.read(key, [r], memoryview(buf), buf)
                        return bytes(buf)
                    if staged:
                        return bytes(staged)
                    continue
            except MooncakeError as e:
                errors.append(_failed(f"reading {r.segment}@{r.offset}", str(e)))
                continue
            if self._check(key, r, data, errors):
                return data
        self._raise(key, replicas, errors)
        raise AssertionError("unreachable")

    def read(self, key: str, replicas: Sequence[Replica], dest: memoryview, obj: Any) -> int:
        """Read a good replica of `key` into `dest`, the byte view of `obj`: straight into it
        when it lies in memory registered with the engine, else staged (or `obj` registered for
        the read when too big to stage); the bytes read."""
        if not replicas:
            raise ObjectNotFound(f"object {key!r} has no replica")
        n = replicas[0].size
        if len(dest) < n:
            raise BufferOverflow(f"object {key!r} is {n} bytes; the buffer holds {len(dest)}")
        region: Region | None = None
        errors: list[StoreError] = []
        try:
            for r in self.order(replicas):
                near = self.near(r)
                if near is not None:
                    if self.copy_near(key, r, near, dest, errors):
                        return n
                    continue
                try:
                    if (into := self._landing.find(dest[:n])) is not None:
                        self.engine.transfer(Op.READ, into[0], into[1], r.segment, r.offset, n,
                                             self.timeout * 2)
                    elif not self._fetch(r, n, lambda v: _copy(dest, v)):
                        region = region or self.engine.register(obj)
                        self.engine.transfer(Op.READ, region, 0, r.segment, r.offset, n,
                                             self.timeout * 2)
                except MooncakeError as e:
                    errors.append(_failed(f"reading {r.segment}@{r.offset}", str(e)))
                    continue
                if self._check(key, r, dest[:n], errors):
                    return n
        finally:
            if region is not None:
                self.engine.unregister(region)
        self._raise(key, replicas, errors)
        raise AssertionError("unreachable")

    def read_batch(self, keys: Sequence[str],
                   replicas: Sequence[Sequence[Replica]]) -> list[bytes | StoreError]:
        """The bytes of each key: local replicas copied, the nearest remote replica of every
        other key read in one engine batch; a key whose first pick fails tries the rest."""
        out: list[bytes | StoreError | None] = [None] * len(keys)
        remote: list[tuple[int, Replica]] = []
        mine, base, end, name = self._span()
        for i, rs in enumerate(replicas):
            if not rs:
                out[i] = ObjectNotFound(f"object {keys[i]!r} has no replica")
                continue
            first = rs[0] if len(rs) == 1 else self.order(rs)[0]
            at = first.offset  # local_view's test, inline (as in write_batch)
            if mine is None or first.segment != name or at < base or at + first.size > end:
                remote.append((i, first))
                continue
            data = bytes(mine[at - base:at - base + first.size])
            if first.checksum is None or xxh3_64_hexdigest(data) == first.checksum:
                out[i] = data  # else read_bytes tries every replica (and says why they fail)
        if remote:
            with self.staged(keys, remote) as got:
                for i, _, view in got:
                    out[i] = bytes(view)
        for i, rs in enumerate(replicas):
            if out[i] is None:
                try:
                    out[i] = self.read_bytes(keys[i], rs)
                except StoreError as e:
                    out[i] = e
        return out  # type: ignore[return-value]
