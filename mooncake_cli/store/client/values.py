"""Values to put and the copies that verify them: a caller's value as a flat byte view
(`readable`; a `Gathered` one stays in its parts), its xxh3_64 checksum, and copies that hash
as they go (`copy_hashed`, `copy_checked`): streamed (`stream_copy`: non-temporal stores, see
mooncake_cli/native/streamcopy.c), the source hashed while its lines are still in the cache; a
part from HANDOFF bytes is copied by a helper thread while this one hashes it."""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import xxhash

from mooncake_cli.native import stream_copy
from mooncake_cli.store.errors import BufferOverflow, InvalidParams
from mooncake_cli.transfer.segment import host_view

FUSED = 64 << 10  # values from this size may be hashed as they are copied into the own segment
AHEAD = 2 << 20  # bytes of one put's values hashed while the master works on its start; past
# them a value from FUSED bytes is hashed as it is copied (the copy then finds it in no cache)
HANDOFF = 2 << 20  # a part from this size is copied by a helper thread while this one hashes
# it (16 MiB, 2 cores: copy then hash 2.4 ms, side by side 1.7-2.0; at 1 MiB the handoff costs
# what it saves)


class Gathered:
    """A value to put made of several buffers one after the other (a tensor's header and its
    data): stored as their concatenation, which is only built for a remote write."""

    def __init__(self, parts: Sequence[Any]) -> None:
        self.parts = [readable(part) for part in parts]
        self._n = sum(len(part) for part in self.parts)

    def __len__(self) -> int:
        return self._n

    def joined(self) -> memoryview:
        return memoryview(b"".join(self.parts))


def checksum(view: Any) -> str:
    if isinstance(view, Gathered):
        h = xxhash.xxh3_64()
        for part in view.parts:
            h.update(part)
        return h.hexdigest()
    return xxhash.xxh3_64_hexdigest(view)


def readable(data: Any) -> Any:
    """A flat byte view of a value to put: bytes-like, numpy array or CPU tensor (a Gathered
    value as it is)."""
    if type(data) is bytes:  # the common case: flat, contiguous, read-only bytes
        return memoryview(data)
    if isinstance(data, Gathered):
        return data
    if type(data).__module__.startswith("torch"):
        return host_view(data.detach().contiguous())[0]
    try:
        view = memoryview(data)
    except TypeError:
        raise InvalidParams(f"cannot store a {type(data).__name__}: not a buffer") from None
    if not view.c_contiguous:
        raise InvalidParams("value must be a C-contiguous buffer")
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


def copy_hashed(dest: memoryview, src: memoryview | Gathered) -> str:
    """Copy `src` (or each part of it, one after the other) into the start of `dest`; its
    checksum (of the source's bytes, as they were read for the copy)."""
    if len(src) > len(dest):
        raise BufferOverflow(f"{len(src)} bytes do not fit a buffer of {len(dest)}")
    if not isinstance(src, Gathered) and len(src) < HANDOFF:
        stream_copy(dest, src)
        return xxhash.xxh3_64_hexdigest(src)
    h = xxhash.xxh3_64()
    at = 0
    for part in src.parts if isinstance(src, Gathered) else [src]:
        n = len(part)
        if n < HANDOFF:
            stream_copy(dest[at:at + n], part)
            h.update(part)
        else:
            copied = _helper().submit(stream_copy, dest[at:at + n], part)
            try:
                h.update(part)  # xxhash lets go of the GIL too
            finally:
                copied.result()
        at += n
    return h.hexdigest()


_pool: tuple[int, ThreadPoolExecutor] | None = None  # (the pid that started it, the pool)
_pool_lock = threading.Lock()


def _helper() -> ThreadPoolExecutor:
    """The one thread that copies large values (started on first use, and again
    in a forked child, which inherits the pool but not its thread)."""
    global _pool
    pool = _pool
    if pool is None or pool[0] != os.getpid():
        with _pool_lock:
            pool = _pool
            if pool is None or pool[0] != os.getpid():
                pool = _pool = (os.getpid(),
                                ThreadPoolExecutor(1, thread_name_prefix="mooncake-copy"))
    return pool[1]


def copy_into(dest: memoryview, src: memoryview | Gathered) -> None:
    """Copy `src` (each part of a Gathered one in turn) into the start of `dest`."""
    at = 0
    for part in src.parts if isinstance(src, Gathered) else [src]:
        dest[at:at + len(part)] = part
        at += len(part)


def copy_checked(dest: memoryview, src: memoryview, want: str | None) -> bool:
    """Copy `src` into the start of `dest`; whether the copy matches checksum `want` (None:
    not checked), as `copy_hashed`."""
    if want is None:
        stream_copy(dest, src)
        return True
    return copy_hashed(dest, src) == want
