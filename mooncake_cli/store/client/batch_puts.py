"""The client's puts. A batch: one batch start, every remote write (and, with HA, each
replica's ledger record, store/ledger.py) in one engine batch, one batch end; a failed write is
revoked. One: the same with a put's own requests (lighter than a batch of one).

    errors = batch_put(call, io, holdings, ha, keys, values, config, upsert)
    put(call, revoke, io, holdings, ha, key, value, config, upsert)  # raises the error it met
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from mooncake_cli.interfaces import MooncakeError
from mooncake_cli.store import ledger
from mooncake_cli.store.client.holdings import Holdings
from mooncake_cli.store.client.replica_adds import Call
from mooncake_cli.store.client.replica_io import ReplicaIO
from mooncake_cli.store.client.values import checksum, readable
from mooncake_cli.store.errors import (
    InvalidParams,
    RpcFailed,
    StoreError,
    TransferFailed,
    error_from_code,
)
from mooncake_cli.store.records import Replica, ReplicateConfig
from mooncake_cli.store.wire import protocol as p

log = logging.getLogger("mooncake.store")
STARTED = p.Run | p.batch(list[Replica])  # a batch start's answer: short or per key


def batch_put(call: Call, io: ReplicaIO, holdings: Holdings, ha: bool, keys: Sequence[str],
              values: Sequence[Any], config: ReplicateConfig | None = None,
              upsert: bool = False) -> list[StoreError | None]:
    """Put each value; per key None when stored, or the error it met. `ha`: the checksums go
    with the batch start and the writes leave ledger records (the leader answers at once)."""
    if len(keys) != len(values):
        raise InvalidParams(f"{len(keys)} keys but {len(values)} values")
    views = [readable(v) for v in values]
    sums: list[str | None] = [checksum(v) for v in views] if ha else []  # else: below
    later = io.fusing(views, ha)  # hashed as copied into our segment, else while the master
    # works

    def meanwhile() -> None:
        sums.extend(None if lt else checksum(v) for v, lt in zip(views, later, strict=True))
    starts = call(p.BatchPutStart(list(keys), [len(v) for v in views], config, upsert=upsert,
                                  checksums=sums or None, notes=ha, runs=True),  # type: ignore[arg-type]
                  STARTED, None if sums else meanwhile)
    out: list[StoreError | None]
    placed: list[list[Replica]]
    if type(starts) is p.Run:  # every key started, one replica each on one segment
        placed = starts.replicas()
        if len(placed) != len(keys):
            raise RpcFailed(f"the master started {len(placed)} puts of {len(keys)}")
        out = [None] * len(keys)
    else:
        out = [None if ok else error_from_code(code, msg) for ok, code, msg, _ in starts]
        placed = [rs or [] for _, _, _, rs in starts]
    written: list[StoreError | None]
    try:
        rest = list(placed)
        for i, (view, lt) in enumerate(zip(views, later, strict=True)):
            if lt and out[i] is None:
                sums[i], rest[i] = io.write_hashed(view, placed[i])
        notes = [ledger.notes(k, rs, c or "", config)
                 for k, rs, c in zip(keys, placed, sums, strict=True)] if ha else ()
        written = io.write_batch(views, rest, notes)  # remote writes in one batch
    except MooncakeError as e:  # the engine failed before any answer: none was written
        written = [TransferFailed(f"writing the batch: {e}")] * len(views)
    done: list[int] = []
    revoke: list[str] = []
    for i, key in enumerate(keys):
        if out[i] is not None:
            continue
        if written[i] is not None:
            out[i] = written[i]
            revoke.append(key)
            continue
        assert sums[i] is not None  # every started put was hashed above
        done.append(i)
    if revoke:
        _revoke(call, revoke)
    if done:
        name = io.engine.name
        own = "" if ha or io.region is None else name  # recorded here: no report back
        mine = {i: (keys[i], r, sums[i]) for i in done for r in placed[i] if r.segment == name}
        try:
            ends = call(p.BatchPutEnd([keys[i] for i in done], [sums[i] for i in done], own),
                        p.batch(None))
        except RpcFailed:  # sent, maybe applied: recorded (checked against the bytes before
            holdings.add_all(list(mine.values()), config)  # a re-registration), as no
            raise  # report will tell of them
        for i, (ok, code, msg, _) in zip(done, ends, strict=True):
            if not ok:
                out[i] = error_from_code(code, msg)
                mine.pop(i, None)
        holdings.add_all(list(mine.values()), config)
    return out


def put(call: Call, revoke: Callable[[Any], None], io: ReplicaIO, holdings: Holdings, ha: bool,
        key: str, data: Any, config: ReplicateConfig | None = None, upsert: bool = False) -> None:
    """Put one value (`revoke(request)` sends the revoke of a failed write)."""
    view = readable(data)
    sums: list[str] = [checksum(view)] if ha else []  # else while the master works
    fused = io.fusing([view], ha)[0]  # or as it is copied into our segment
    replicas = call(p.PutStart(key, len(view), config, upsert=upsert,
                               checksum=sums[0] if sums else None, notes=ha),
                    list[Replica], None if sums or fused else lambda: sums.append(checksum(view)))
    try:
        rest = replicas
        if fused:
            csum, rest = io.write_hashed(view, replicas)
            sums.append(csum)
        csum = sums[0]
        io.write(view, rest, ledger.notes(key, replicas, csum, config))
    except MooncakeError as e:  # a StoreError, or the transfer engine's own
        revoke(p.PutRevoke(key))
        if isinstance(e, StoreError):
            raise
        raise TransferFailed(f"writing {key!r}: {e}") from e
    call(p.PutEnd(key, csum))
    own = [r for r in replicas if r.segment == io.engine.name]
    if own:
        holdings.add(key, own[0], csum, config)


def _revoke(call: Call, keys: list[str]) -> None:
    try:
        call(p.BatchPutRevoke(keys))
    except StoreError as e:  # the master expires what is never ended anyway
        log.debug("BatchPutRevoke: %s", e)
