"""The client's side of adding replicas to complete objects (the master's: replicas_add.py).

    errors = add_replicas(call, io, holdings, own, keys, values, segment)

One batch start allocates a block per key on `segment` -> the values are written (a plain
memcpy into the client's own segment, the transfer engine otherwise) -> one batch end hands the
master each value's checksum, which it compares with the object's: a value with other bytes
never becomes a replica. A failed write is revoked. Replicas added on the client's own segment
join its holdings, so they are re-registered after a master failover like the ones it put.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from mooncake_cli.interfaces import MooncakeError
from mooncake_cli.store.client.holdings import Holdings
from mooncake_cli.store.client.replica_io import ReplicaIO
from mooncake_cli.store.client.values import checksum, readable
from mooncake_cli.store.errors import InvalidParams, StoreError, TransferFailed
from mooncake_cli.store.records import Replica
from mooncake_cli.store.wire import protocol as p

log = logging.getLogger("mooncake.store")
Call = Callable[..., Any]  # call(request, kind=None, meanwhile=None) -> the result


def add_replicas(call: Call, io: ReplicaIO, holdings: Holdings, own: str | None,
                 keys: Sequence[str], values: Sequence[Any],
                 segment: str | None = None) -> list[StoreError | None]:
    """Add a replica of each complete object `keys[i]`, whose bytes are `values[i]`, on transfer
    segment `segment` (default `own`, the client's own segment); per key None when added, else
    the error (ObjectAlreadyExists: the object has a replica there already)."""
    if len(keys) != len(values):
        raise InvalidParams(f"{len(keys)} keys but {len(values)} values")
    if segment is None:
        if own is None:
            raise InvalidParams("this client contributes no segment: name the segment to add "
                                "the replicas on")
        segment = own
    if not keys:
        return []
    views = [readable(v) for v in values]
    sums: list[str] = []  # computed while the master allocates
    starts = call(p.BatchAddReplicaStart(list(keys), segment, [len(v) for v in views]),
                  list[p.Reply], lambda: sums.extend(checksum(v) for v in views))
    got, out = p.results(starts, Replica)
    placed: list[list[Replica]] = [[r] if r is not None else [] for r in got]
    written: list[StoreError | None]
    try:
        written = io.write_batch(views, placed)
    except MooncakeError as e:  # the engine failed before any answer: none was written
        written = [TransferFailed(f"writing the batch: {e}")] * len(views)
    revoke = [k for k, e, w in zip(keys, out, written, strict=True) if e is None and w is not None]
    done = [i for i, (e, w) in enumerate(zip(out, written, strict=True))
            if e is None and w is None]
    for i, w in enumerate(written):
        if out[i] is None and w is not None:
            out[i] = w
    if revoke:
        try:
            call(p.BatchAddReplicaRevoke(revoke, segment))
        except StoreError as e:
            log.debug("revoking %d replica adds: %s", len(revoke), e)
    if done:
        ends = call(p.BatchAddReplicaEnd([keys[i] for i in done], segment,
                                         [sums[i] for i in done]), list[p.Reply])
        for i, item in zip(done, ends, strict=True):
            try:
                p.result(item, None)
            except StoreError as e:
                out[i] = e
                continue
            if segment == own:
                holdings.add(keys[i], placed[i][0], sums[i])
    return out
