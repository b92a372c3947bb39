"""The compat store's session forms (upstream's batch_put_session_* with
batch_put_from_multi_buffer_ranges, batch_get_session_* with
batch_get_into_multi_buffer_ranges): an object built from
byte ranges of caller buffers, then made readable at once; objects read once and their ranges
copied out as often as wanted.

A put session stages each object in this process until its end, which puts them all in one
batch: until then the master has not heard of them (is_exist 0 and get b"" as upstream's;
get_size -704 where upstream's says -703), and bytes no range wrote are zeros. A get session
holds the objects it read until it ends. Codes as upstream's: a session start of an existing
key -705, of a missing one (get) -704; ranges of a key with no session, or outside its object,
-600; a range call gives per key the bytes copied."""

from __future__ import annotations

from typing import Any

from mooncake_cli.compat import ranges
from mooncake_cli.compat.codes import BAD, EXISTS, code_of
from mooncake_cli.compat.connection import Connection
from mooncake_cli.compat.types import native
from mooncake_cli.store.errors import StoreError
from mooncake_cli.store.records import MAX_OBJECT_SIZE


def _copy_ranges(object_: Any, ptrs: list[int], sizes: list[int], offsets: list[int],
                 into_object: bool) -> int:
    if not isinstance(ptrs, list) or not len(ptrs) == len(sizes) == len(offsets) or not ptrs:
        return BAD
    try:
        views = [ranges.view(p, n) for p, n in zip(ptrs, sizes, strict=True)]
    except StoreError:
        return BAD
    obj = memoryview(object_).cast("B")
    if any(not isinstance(o, int) or o < 0 or o + len(v) > len(obj)
           for v, o in zip(views, offsets, strict=True)):
        return BAD
    for v, o in zip(views, offsets, strict=True):
        if into_object:
            obj[o:o + len(v)] = v
        else:
            v[:] = obj[o:o + len(v)]
    return sum(len(v) for v in views)


def _ranges(objects: dict[str, Any], keys: list[str], ptrs: list[list[int]],
            sizes: list[list[int]], offsets: list[list[int]], into_object: bool) -> list[int]:
    """Per key the bytes copied between its session object in `objects` and its buffers."""
    if not len(keys) == len(ptrs) == len(sizes) == len(offsets):
        return [BAD] * len(keys)
    return [_copy_ranges(objects[k], p, n, o, into_object) if k in objects else BAD
            for k, p, n, o in zip(keys, ptrs, sizes, offsets, strict=True)]


class Sessions:
    """The put and get sessions of one compat store, until they end (or the store closes)."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._puts: dict[str, tuple[bytearray, Any]] = {}  # key -> its object, its config
        self._gets: dict[str, Any] = {}  # key -> the bytes read

    def clear(self) -> None:
        self._puts.clear()
        self._gets.clear()

    def batch_put_session_start(self, keys: list[str], sizes: list[int],
                                config: Any = None) -> list[int]:
        puts = self._puts
        if len(keys) != len(sizes):
            return [BAD] * len(keys)
        found: list[bool | StoreError | int] = self._conn.run(
            lambda c: list(c.batch_exists(keys)), lambda e: [e] * len(keys))
        out: list[int] = []
        for key, size, there in zip(keys, sizes, found, strict=True):
            if isinstance(there, StoreError) or type(there) is int:
                out.append(code_of(there) if isinstance(there, StoreError) else there)
            elif there or key in puts:
                out.append(EXISTS)
            elif not isinstance(size, int) or isinstance(size, bool) \
                    or not 0 < size <= MAX_OBJECT_SIZE:
                out.append(BAD)
            else:
                puts[key] = (bytearray(size), native(config))
                out.append(0)
        return out

    def batch_put_from_multi_buffer_ranges(self, keys: list[str],
                                           all_buffer_ptrs: list[list[int]],
                                           all_sizes: list[list[int]],
                                           all_dst_offsets: list[list[int]]) -> list[int]:
        """Write each buffer to its key's session object at its destination offset."""
        staged = {k: data for k, (data, _) in self._puts.items()}
        return _ranges(staged, keys, all_buffer_ptrs, all_sizes, all_dst_offsets, True)

    def batch_put_session_end(self, keys: list[str]) -> list[int]:
        """Put the session objects of `keys` in one batch; per key 0 or its code."""
        puts = self._puts
        out = [BAD] * len(keys)
        ready = [(i, k) for i, k in enumerate(keys) if k in puts]
        by_config: dict[int, list[tuple[int, str]]] = {}
        for i, k in ready:
            by_config.setdefault(id(puts[k][1]), []).append((i, k))
        for group in by_config.values():
            names = [k for _, k in group]
            codes = self._put(names, [puts[k][0] for k in names], puts[names[0]][1])
            for (i, k), rc in zip(group, codes, strict=True):
                out[i] = rc
                puts.pop(k, None)
        return out

    def _put(self, keys: list[str], values: list[bytearray], config: Any) -> list[int]:
        return self._conn.run(lambda c: [0 if e is None else code_of(e)
                                         for e in c.batch_put(keys, values, config, False)],
                              lambda e: [e] * len(keys))

    def batch_put_session_revoke(self, keys: list[str]) -> list[int]:
        puts = self._puts
        return [0 if puts.pop(k, None) is not None else BAD for k in keys]

    def batch_get_session_start(self, keys: list[str]) -> list[int]:
        """Read each object once for the ranges to come; per key 0 or its code."""
        gets = self._gets
        got = self._conn.run(lambda c: list(c.batch_get_buffers(keys)), lambda e: [e] * len(keys))
        out: list[int] = []
        for key, data in zip(keys, got, strict=True):
            if isinstance(data, (bytes, bytearray)):
                gets[key] = data
                out.append(0)
            else:
                out.append(code_of(data) if isinstance(data, StoreError) else int(data))
        return out

    def batch_get_into_multi_buffer_ranges(self, keys: list[str],
                                           all_buffer_ptrs: list[list[int]],
                                           all_sizes: list[list[int]],
                                           all_src_offsets: list[list[int]]) -> list[int]:
        """Copy each range of its key's session object at its source offset into its buffer."""
        return _ranges(self._gets, keys, all_buffer_ptrs, all_sizes, all_src_offsets,
                       False)

    def batch_get_session_end(self, keys: list[str]) -> int:
        gets = self._gets
        for k in keys:
            gets.pop(k, None)
        return 0
