"""Raw memory for the compat store: views of caller addresses, and `get_into_ranges`."""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from typing import Any

from mooncake_cli.store.errors import StoreCode, StoreError

BAD, MISSING = int(StoreCode.INVALID_PARAMS), int(StoreCode.OBJECT_NOT_FOUND)


def view(ptr: int, size: int) -> memoryview:
    """A writable byte view of the `size` bytes at address `ptr`."""
    if not isinstance(ptr, int) or not isinstance(size, int) or not 0 < ptr < 1 << 64 \
            or not 0 < size < 1 << 48 or ptr + size > 1 << 64:
        raise StoreError(f"bad buffer {ptr!r}, {size!r}", StoreCode.INVALID_PARAMS)
    return memoryview((ctypes.c_ubyte * size).from_address(ptr)).cast("B")


def get_into_ranges(read: Callable[[list[str]], Sequence[Any]],
                    registered: Callable[[int], memoryview | None], buffer_ptrs: list[int],
                    all_keys: list[list[str]], dst_offsets: list[list[list[int]]],
                    src_offsets: list[list[list[int]]],
                    sizes: list[list[list[int]]]) -> list[list[list[int]]]:
    """Per buffer, per key, per range: the bytes copied from the object at the source offset
    to the buffer at the destination offset, or a negative code. The objects are read once
    each, in one batch (`read(keys)`: each one's bytes, or None); a range past the end of a
    registered buffer (`registered(ptr)`) is refused, one into any other is not checked."""
    shapes_ok = len(buffer_ptrs) == len(all_keys) == len(dst_offsets) == len(src_offsets) \
        == len(sizes) and all(
            len(ks) == len(d) == len(s) == len(n) and all(
                len(a) == len(b) == len(c) for a, b, c in zip(d, s, n, strict=True))
            for ks, d, s, n in zip(all_keys, dst_offsets, src_offsets, sizes, strict=True))
    if not shapes_ok:
        return [[[BAD] * len(r) for r in per] for per in sizes] if isinstance(sizes, list) \
            else []
    keys = sorted({k for ks in all_keys for k in ks})
    got = dict(zip(keys, read(keys), strict=True)) if keys else {}
    out: list[list[list[int]]] = []
    for ptr, ks, dsts, srcs, ns in zip(buffer_ptrs, all_keys, dst_offsets, src_offsets, sizes,
                                       strict=True):
        buf = registered(ptr)
        limit = None if buf is None else len(buf)
        per_key: list[list[int]] = []
        for key, d_list, s_list, n_list in zip(ks, dsts, srcs, ns, strict=True):
            data = got.get(key)
            codes: list[int] = []
            for d, s, n in zip(d_list, s_list, n_list, strict=True):
                if data is None:
                    codes.append(MISSING)
                elif min(d, s) < 0 or n <= 0 or s + n > len(data) or \
                        (limit is not None and d + n > limit):
                    codes.append(BAD)
                else:
                    view(ptr + d, n)[:] = memoryview(data)[s:s + n]
                    codes.append(n)
            per_key.append(codes)
        out.append(per_key)
    return out
