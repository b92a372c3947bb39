"""Reading many objects into the caller's buffers at once: each key's nearest replica, every
remote one in one engine batch (straight into a dest in memory registered with the engine,
else staged), ones this process maps (its own segment, a same-host peer's shared memory)
copied and verified as they go; a key whose first pick fails (a transfer error or a bad
checksum) then tries its other replicas alone (ReplicaIO.read).

    got = read_into(io, keys, replica_lists, [memoryview(b) for b in bufs], bufs)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mooncake_cli.store.client.replica_io import ReplicaIO
from mooncake_cli.store.errors import BufferOverflow, ObjectNotFound, StoreError
from mooncake_cli.store.records import Replica
from mooncake_cli.transfer.batch import Op, TransferRequest


def read_into(io: ReplicaIO, keys: Sequence[str], replicas: Sequence[Sequence[Replica]],
              dests: Sequence[memoryview], objs: Sequence[Any]) -> list[int | StoreError]:
    """Per key the bytes read into its dest, or the error it met (ObjectNotFound: no replica,
    BufferOverflow: the dest is too small)."""
    out: list[int | StoreError | None] = [None] * len(keys)
    remote: list[tuple[int, Replica]] = []
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
        elif io.copy_near(key, first, near, dests[i], []):
            out[i] = n
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
