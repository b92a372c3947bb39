"""Reading many objects into the caller's buffers at once: each key's nearest replica, every
remote one in one engine batch (straight into a dest in memory registered with the engine,
else staged), ones this process maps (its own segment, a same-host peer's shared memory)
copied and verified as they go (on up to COPIERS threads when they add up to PARALLEL bytes:
one thread's copy is bound by what one core's loads and stores move, not by the memory); a key
whose first pick fails (a transfer error or a bad checksum) then tries its other replicas alone
(ReplicaIO.read).

    got = read_into(io, keys, replica_lists, [memoryview(b) for b in bufs], bufs)

The `read_*` forms over a master's answer (`read_found`, `read_into_buffers`, `read_into_new`)
are the store client's batch gets after their request: per key the value or the error it met.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from mooncake_cli.store.client.replica_io import ReplicaIO
from mooncake_cli.store.client.values import Gathered
from mooncake_cli.store.errors import (
    BufferOverflow,
    InvalidParams,
    ObjectNotFound,
    RpcFailed,
    StoreError,
)
from mooncake_cli.store.records import Replica
from mooncake_cli.store.wire import protocol as wire
from mooncake_cli.transfer.batch import Op, TransferRequest
from mooncake_cli.transfer.segment import host_view

FOUND = wire.Found | wire.batch(list[Replica])  # a batch get's answer: short or per key
COPIERS = min(4, os.cpu_count() or 1)
PARALLEL = 4 << 20  # bytes of near copies in one batch from which they are shared out
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _copiers() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(COPIERS, thread_name_prefix="mooncake-copy")
        return _pool


def copy_all(io: ReplicaIO, near: Sequence[tuple[str, Replica, memoryview, memoryview]]
             ) -> list[bool]:
    """Copy and verify each (key, replica, mapped source, dest); per copy whether it passed.
    Shared among COPIERS threads (the copies release the GIL) when there is enough to copy."""
    def one(job: tuple[str, Replica, memoryview, memoryview]) -> bool:
        key, r, src, dest = job
        return io.copy_near(key, r, src, dest, [])
    if COPIERS < 2 or len(near) < 2 or sum(len(j[2]) for j in near) < PARALLEL:
        return [one(job) for job in near]
    return list(_copiers().map(one, near))


def read_into(io: ReplicaIO, keys: Sequence[str], replicas: Sequence[Sequence[Replica]],
              dests: Sequence[memoryview], objs: Sequence[Any]) -> list[int | StoreError]:
    """Per key the bytes read into its dest, or the error it met (ObjectNotFound: no replica,
    BufferOverflow: the dest is too small)."""
    out: list[int | StoreError | None] = [None] * len(keys)
    remote: list[tuple[int, Replica]] = []
    mapped: list[tuple[int, tuple[str, Replica, memoryview, memoryview]]] = []
    for i, (key, rs) in enumerate(zip(keys, replicas, strict=True)):
        if not rs:
            out[i] = ObjectNotFound(f"object {key!r} has no replica")
            continue
        n = rs[0].size
        if len(dests[i]) < n:
            out[i] = BufferOverflow(f"object {key!r} is {n} bytes; the buffer holds "
                                    f"{len(dests[i])}")
            continue
        first = io.order(rs)[0]
        near = io.near(first)  # own segment or a same-host peer's mapped memory
        if near is None:
            remote.append((i, first))
        else:
            mapped.append((i, (key, first, near, dests[i])))
    for (i, job), ok in zip(mapped, copy_all(io, [job for _, job in mapped]), strict=True):
        if ok:
            out[i] = job[1].size
    landed = [(i, r, at) for i, r in remote
              if (at := io._landing.find(dests[i][:r.size])) is not None]
    if landed:  # dests in memory registered with the engine: read straight into them
        reqs = [TransferRequest(Op.READ, at[0], at[1], r.segment, r.offset, r.size)
                for _, r, at in landed]
        for (i, r, _), why in zip(landed, io._run(reqs), strict=True):
            if why is None and io._check(keys[i], r, dests[i][:r.size], []):
                out[i] = r.size
        tried = {i for i, _, _ in landed}  # a failed one tries its replicas alone, below
        remote = [(i, r) for i, r in remote if i not in tried]
    if remote:
        with io.staged(keys, remote) as got:
            for i, r, view in got:
                dests[i][:r.size] = view
                out[i] = r.size
    for i, value in enumerate(out):
        if value is None:  # the first pick failed (or was too big to stage): one by one
            try:
                out[i] = io.read(keys[i], replicas[i], dests[i], objs[i])
            except StoreError as e:
                out[i] = e
    return out  # type: ignore[return-value]


def read_scattered(io: ReplicaIO, keys: Sequence[str], replicas: Sequence[Sequence[Replica]],
                   parts: Sequence[Sequence[memoryview]]) -> list[int | None]:
    """Per key: its object read straight into its `parts` (views of memory registered with the
    engine, one after the other, exactly its size), every part of every key in one engine batch,
    verified over the parts; None where it was not read so (a part elsewhere, a replica this
    process maps, a failed read or checksum): the caller reads that key another way. No staging
    region and no copy: a vLLM KV block's layers land where they belong, and a fresh process
    faults in no memory of its own for them."""
    out: list[int | None] = [None] * len(keys)
    reqs: list[TransferRequest] = []
    spans: list[tuple[int, Replica, int, int]] = []
    for i, (rs, ps) in enumerate(zip(replicas, parts, strict=True)):
        ps = [p for p in ps if p.nbytes]
        if not rs or sum(p.nbytes for p in ps) != rs[0].size:
            continue
        r = io.order(rs)[0]
        where = [io._landing.find(p) for p in ps]
        if r.tier != "dram" or io.near(r) is not None:
            continue
        first, off = len(reqs), r.offset
        for found, p in zip(where, ps, strict=True):
            if found is None:
                del reqs[first:]
                break
            reqs.append(TransferRequest(Op.READ, found[0], found[1], r.segment, off, p.nbytes))
            off += p.nbytes
        else:
            spans.append((i, r, first, len(reqs)))
    whys = io._run(reqs) if reqs else []
    for i, r, a, b in spans:
        if all(w is None for w in whys[a:b]) and \
                io._check(keys[i], r, Gathered([p for p in parts[i] if p.nbytes]), []):
            out[i] = r.size
    return out


def only_on_ssd(lists: Sequence[Any]) -> int:
    """How many of these replica lists are of objects held only on SSD."""
    return sum(1 for rs in lists if isinstance(rs, list) and rs
               and all(r.tier == "ssd" for r in rs))


def read_found(io: ReplicaIO, keys: Sequence[str], items: Any) -> list[bytes | StoreError]:
    """The value of each key from its replicas in `items` (FOUND), or the error it met."""
    if type(items) is wire.Found:  # every key found, one replica each on one segment
        lists = items.replicas()
        if len(lists) != len(keys):
            raise RpcFailed(f"the master found {len(lists)} of {len(keys)} keys")
        return io.read_batch(keys, lists)
    found: list[tuple[int, list[Replica]]] = []
    out: list[bytes | StoreError] = []
    for i, item in enumerate(wire.each(items)):
        if isinstance(item, StoreError):
            out.append(item)
        else:
            found.append((i, item))
            out.append(b"")
    got = io.read_batch([keys[i] for i, _ in found], [rs for _, rs in found])
    for (i, _), value in zip(found, got, strict=True):
        out[i] = value
    return out


def read_into_buffers(io: ReplicaIO, keys: Sequence[str],
                      lists: Sequence[list[Replica] | StoreError],
                      buffers: Sequence[Any]) -> tuple[list[int | StoreError], int]:
    """Each key read into its buffer: the bytes read, or the error it met; and how many of
    those read were held only on SSD."""
    out: list[int | StoreError | None] = [None] * len(keys)
    todo: list[tuple[int, list[Replica], memoryview]] = []
    for i, (buf, item) in enumerate(zip(buffers, lists, strict=True)):
        if isinstance(item, StoreError):
            out[i] = item
            continue
        try:
            todo.append((i, item, host_view(buf)[0]))
        except ValueError as e:
            out[i] = InvalidParams(f"cannot read into {type(buf).__name__}: {e}")
    got = read_into(io, [keys[i] for i, _, _ in todo], [rs for _, rs, _ in todo],
                    [d for _, _, d in todo], [buffers[i] for i, _, _ in todo])
    for (i, _, _), value in zip(todo, got, strict=True):
        out[i] = value
    return out, only_on_ssd([rs for _, rs, _ in todo])  # type: ignore[return-value]


def read_into_new(io: ReplicaIO, keys: Sequence[str], lists: Sequence[list[Replica] | StoreError],
                  alloc: Callable[[int], Any]) -> list[Any]:
    """Each key read into a new buffer of its size, `alloc(size)`, or the error it met."""
    out: list[Any] = []
    found: list[tuple[int, list[Replica], Any]] = []
    for i, rs in enumerate(lists):
        if isinstance(rs, StoreError):
            out.append(rs)
            continue
        out.append(alloc(rs[0].size if rs else 0))
        found.append((i, rs, out[-1]))
    got = read_into(io, [keys[i] for i, _, _ in found], [rs for _, rs, _ in found],
                    [memoryview(b) for _, _, b in found], [b for _, _, b in found])
    for (i, _, _), value in zip(found, got, strict=True):
        if isinstance(value, StoreError):
            out[i] = value
    return out
