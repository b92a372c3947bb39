"""Moving object bytes between a caller's buffer and replicas, with checksums.

A replica on the client's own segment is copied with a plain memcpy; any other one goes through
the transfer engine (which picks shared memory for a same-host peer, TCP otherwise). Reads try
the nearest replica first (own segment, then same host) and move on when a transfer fails or the
bytes fail their xxh3_64 checksum: wrong bytes are never handed back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import xxhash

from mooncake_cli.interfaces import MooncakeError
from mooncake_cli.store.errors import (
    BufferOverflow,
    ChecksumMismatch,
    InvalidParams,
    ObjectNotFound,
    StoreError,
    TransferFailed,
)
from mooncake_cli.store.records import Replica
from mooncake_cli.transfer.batch import Op, TransferRequest
from mooncake_cli.transfer.engine import TransferEngine
from mooncake_cli.transfer.segment import Region, host_view


def checksum(view: memoryview) -> str:
    return xxhash.xxh3_64_hexdigest(view)


def readable(data: Any) -> memoryview:
    """A flat byte view of a value to put: bytes-like, numpy array or CPU tensor."""
    if type(data).__module__.startswith("torch"):
        return host_view(data.detach().contiguous())[0]
    try:
        view = memoryview(data)
    except TypeError:
        raise InvalidParams(f"cannot store a {type(data).__name__}: not a buffer") from None
    if not view.c_contiguous:
        raise InvalidParams("value must be a C-contiguous buffer")
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


class ReplicaIO:
    """Reads and writes replicas for one client: `engine`, and its own `region` (or None)."""

    def __init__(self, engine: TransferEngine, region: Region | None, host: str,
                 timeout: float) -> None:
        self.engine = engine
        self.region = region
        self.host = host
        self.timeout = timeout

    def local_view(self, r: Replica) -> memoryview | None:
        """The bytes of `r` when it lives in this client's own region."""
        region = self.region
        if region is None or region.view is None or r.segment != self.engine.name:
            return None
        start = r.offset - region.base
        if start < 0 or start + r.size > region.length:
            return None
        return region.view[start:start + r.size]

    def write(self, view: memoryview, replicas: Sequence[Replica]) -> None:
        """Write `view` to every replica; TransferFailed if any write fails."""
        remote = []
        for r in replicas:
            local = self.local_view(r)
            if local is not None:
                local[:] = view
            else:
                remote.append(r)
        if not remote:
            return
        staged = view if not view.readonly else memoryview(bytearray(view))
        region = self.engine.register(staged)
        try:
            reqs = [TransferRequest(Op.WRITE, region, 0, r.segment, r.offset, len(view))
                    for r in remote]
            statuses = self.engine.submit(reqs).wait(self.timeout * 2)
            for r, st in zip(remote, statuses, strict=True):
                if st.state.value != "completed":
                    raise TransferFailed(f"writing {r.segment}@{r.offset}: "
                                         f"{st.reason or 'timed out'}")
        finally:
            self.engine.unregister(region)

    def order(self, replicas: Sequence[Replica]) -> list[Replica]:
        return sorted(replicas, key=lambda r: (r.segment != self.engine.name, r.host != self.host))

    def read(self, key: str, replicas: Sequence[Replica], dest: memoryview, obj: Any) -> int:
        """Read a good replica of `key` into `dest`, the byte view of `obj` (registered with the
        engine only when a transfer is needed); the bytes read."""
        if not replicas:
            raise ObjectNotFound(f"object {key!r} has no replica")
        n = replicas[0].size
        if len(dest) < n:
            raise BufferOverflow(f"object {key!r} is {n} bytes; the buffer holds {len(dest)}")
        region: Region | None = None
        errors: list[StoreError] = []
        try:
            for r in self.order(replicas):
                local = self.local_view(r)
                if local is not None:
                    dest[:n] = local
                else:
                    try:
                        region = region or self.engine.register(obj)
                        self.engine.transfer(Op.READ, region, 0, r.segment, r.offset, n,
                                             self.timeout * 2)
                    except MooncakeError as e:
                        errors.append(TransferFailed(f"reading {r.segment}@{r.offset}: {e}"))
                        continue
                if r.checksum is None or checksum(dest[:n]) == r.checksum:
                    return n
                errors.append(ChecksumMismatch(f"replica of {key!r} on {r.segment} at "
                                               f"{r.offset} fails its checksum"))
        finally:
            if region is not None:
                self.engine.unregister(region)
        if any(isinstance(e, ChecksumMismatch) for e in errors):
            raise ChecksumMismatch("; ".join(map(str, errors)))
        raise TransferFailed("; ".join(map(str, errors)))
