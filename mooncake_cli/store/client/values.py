"""Values to put and the copies that verify them: a caller's value as a flat byte view
(`readable`; a `Gathered` one stays in its parts), its xxh3_64 checksum, and copies that hash
as they go (`copy_hashed`, `copy_checked`), BLOCK bytes at a time without the GIL (a small
value in one go, with it)."""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import xxhash

from mooncake_cli.store.errors import BufferOverflow, InvalidParams
from mooncake_cli.transfer.segment import host_view

BLOCK = 1 << 20  # bytes copied, then hashed, at a time (copy_hashed). Not less: on an AMD EPYC
# VM, glibc's memmove of 256 KiB blocks out of a memfd mapping ran at a third of the speed of
# 1 MiB ones (its `rep movsb` range, it seems; scripts/bench_copy_hashed.py)
FUSED = 64 << 10  # values from this size may be hashed as they are copied into the own segment
AHEAD = 2 << 20  # bytes of one put's values hashed while the master works on its start; past
# them a value from FUSED bytes is hashed as it is copied (the copy then finds it in no cache)
SPLIT = 2 << 20  # a part from this size is copied by two threads: the tail (TAIL of it) by a
# helper while this one copies and hashes the head, then hashes the tail (16 MiB, 2 cores:
# 2.2 -> 1.5 ms; one thread's memmove does not reach the memory's bandwidth here)
TAIL = 0.75
SMALL = 128 << 10  # values up to this size are copied in one slice assignment, GIL held: for
# 4 KiB, 0.35 µs copied and hashed against 6.4 µs through ctypes (numpy finds the addresses)


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


def address(view: memoryview) -> int:
    """Where `view`'s bytes start (read-only views included)."""
    return int(np.frombuffer(view, dtype=np.uint8).ctypes.data) if len(view) else 0


def copy_hashed(dest: memoryview, src: memoryview | Gathered) -> str:
    """Copy `src` (or each part of it, one after the other) into the start of `dest`; its
    checksum. Copied and hashed BLOCK bytes at a time, so the hash reads what the copy just
    left in the cache instead of going to memory a second time; the copies run without the GIL
    (ctypes.memmove), so concurrent ones copy side by side."""
    if len(src) > len(dest):
        raise BufferOverflow(f"{len(src)} bytes do not fit a buffer of {len(dest)}")
    if len(src) <= SMALL and not isinstance(src, Gathered) and _slice_copy(dest, src):
        return xxhash.xxh3_64_hexdigest(dest[:len(src)])
    parts = src.parts if isinstance(src, Gathered) else [src]
    h = xxhash.xxh3_64()
    at = 0
    for part in parts:
        n = len(part)
        to, frm = address(dest[at:at + n]), address(part)
        head = n - (int(n * TAIL) & ~0xFFFF) if n >= SPLIT else n
        tail: Future[object] | None = None
        if head < n:
            tail = _helper().submit(ctypes.memmove, to + head, frm + head, n - head)
        try:
            for off in range(0, head, BLOCK):
                end = min(head, off + BLOCK)
                ctypes.memmove(to + off, frm + off, end - off)
                h.update(dest[at + off:at + end])
            if head < n:
                h.update(part[head:])  # the same bytes the helper is copying
        finally:
            if tail is not None:
                tail.result()
        at += n
    return h.hexdigest()


_pool: tuple[int, ThreadPoolExecutor] | None = None  # (the pid that started it, the pool)
_pool_lock = threading.Lock()


def _helper() -> ThreadPoolExecutor:
    """The one thread that copies the tails of large values (started on first use, and again
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
        if len(src) and not (len(src) <= SMALL and _slice_copy(dest, src)):
            ctypes.memmove(address(dest), address(src), len(src))
        return True
    return copy_hashed(dest, src) == want


def _slice_copy(dest: memoryview, src: memoryview) -> bool:
    """Copy `src` into the start of `dest` with the GIL held (for a small value, a fraction
    of the ctypes call's cost); False when the views do not allow it (read-only, formats)."""
    try:
        dest[:len(src)] = src
    except (TypeError, ValueError):
        return False
    return True
