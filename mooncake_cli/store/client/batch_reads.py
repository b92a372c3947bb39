"""Reading many objects into the caller's buffers at once: each key's nearest replica, every
remote one in one engine batch (straight into a dest in memory registered with the engine,
else staged), ones this process maps (its own segment, a same-host peer's shared memory)
copied and verified as they go (on up to COPIERS threads when they add up to PARALLEL bytes:
one thread's copy is bound by what one core's loads and stores move, not by the memory); a key
whose first pick fails (a transfer error or a bad checksum) then tries its other replicas alone
(ReplicaIO.read).

    got = read_into(io, keys, replica_lists, [memoryview(b) for b in bufs], bufs)
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from mooncake_cli.store.client.replica_io import ReplicaIO
from mooncake_cli.store.client.values import Gathered
from mooncake_cli.store.errors import BufferOverflow, ObjectNotFound, StoreError
from mooncake_cli.store.records import Replica
from mooncake_cli.transfer.batch import Op, TransferRequest

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
