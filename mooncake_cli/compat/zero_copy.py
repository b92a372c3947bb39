"""The compat store's caller buffers (upstream's "zero-copy" register_buffer / put_from /
get_into family and get_into_ranges): buffers are integer addresses viewed through ctypes
(ranges.py). A get lands straight in a buffer registered with register_buffer; into one that is
not, it is staged and copied. A put copies the bytes once, into the own segment or into the
staging region on the way to a remote one."""

from __future__ import annotations

from typing import Any

from mooncake_cli.compat import ranges
from mooncake_cli.compat.codes import BAD, NOT_READY, code_of, put_code
from mooncake_cli.compat.connection import Client, Connection
from mooncake_cli.compat.objects import Objects
from mooncake_cli.compat.types import native
from mooncake_cli.interfaces import MooncakeError
from mooncake_cli.store.errors import StoreError
from mooncake_cli.transfer.segment import Region


class CallerBuffers:
    """The buffers registered with `conn`'s engine, and the calls that read and write buffers."""

    def __init__(self, conn: Connection, objects: Objects) -> None:
        self._conn, self._objects = conn, objects
        self._buffers: dict[int, tuple[Region | None, memoryview]] = {}  # address -> its view

    def registered(self, ptr: int) -> memoryview | None:
        """The registered buffer at address `ptr`, or None."""
        entry = self._buffers.get(ptr)
        return None if entry is None else entry[1]

    def unregister_all(self) -> None:
        for ptr in list(self._buffers):
            self.unregister_buffer(ptr)

    def register_buffer(self, buffer_ptr: int, size: int) -> int:
        """Register `size` bytes at `buffer_ptr` with the engine; kept until unregistered."""
        if self._conn.engine is None:
            return NOT_READY
        if buffer_ptr in self._buffers:
            return BAD
        try:
            view = ranges.view(buffer_ptr, size)
            self._buffers[buffer_ptr] = (self._conn.engine.register(view), view)
        except (MooncakeError, ValueError) as e:
            return code_of(e)
        return 0

    def unregister_buffer(self, buffer_ptr: int) -> int:
        entry = self._buffers.pop(buffer_ptr, None)
        if entry is None or self._conn.engine is None:
            return BAD
        if entry[0] is not None:
            self._conn.engine.unregister(entry[0])
        return 0

    def put_from(self, key: str, buffer_ptr: int, size: int, config: Any = None) -> int:
        return self.batch_put_from([key], [buffer_ptr], [size], config)[0]

    def upsert_from(self, key: str, buffer_ptr: int, size: int, config: Any = None) -> int:
        return self.batch_upsert_from([key], [buffer_ptr], [size], config)[0]

    def _put_from(self, keys: list[str], ptrs: list[int], sizes: list[int], config: Any,
                  upsert: bool) -> list[int]:
        if not len(keys) == len(ptrs) == len(sizes):
            return [BAD] * len(keys)
        return self._conn.run(lambda c: [put_code(e) for e in c.batch_put(
            keys, [ranges.view(a, n) for a, n in zip(ptrs, sizes, strict=True)],
            native(config), upsert)], lambda e: [e] * len(keys))

    def batch_put_from(self, keys: list[str], buffer_ptrs: list[int], sizes: list[int],
                       config: Any = None) -> list[int]:
        return self._put_from(keys, buffer_ptrs, sizes, config, False)

    def batch_upsert_from(self, keys: list[str], buffer_ptrs: list[int], sizes: list[int],
                          config: Any = None) -> list[int]:
        return self._put_from(keys, buffer_ptrs, sizes, config, True)

    def get_into(self, key: str, buffer_ptr: int, size: int) -> int:
        """Bytes read into the buffer, or a negative code (-600 when it is too small)."""
        return self.batch_get_into([key], [buffer_ptr], [size])[0]

    def batch_get_into(self, keys: list[str], buffer_ptrs: list[int],
                       sizes: list[int]) -> list[int]:
        """Bytes read per key, or its negative code; remote reads in one engine batch."""
        if not len(keys) == len(buffer_ptrs) == len(sizes):
            return [BAD] * len(keys)

        def go(c: Client) -> list[int]:
            views = [ranges.view(a, n) for a, n in zip(buffer_ptrs, sizes, strict=True)]
            return [code_of(v) if isinstance(v, StoreError) else int(v)
                    for v in c.batch_get_into(keys, views)]
        return self._conn.run(go, lambda e: [e] * len(keys))

    def get_into_ranges(self, buffer_ptrs: list[int], all_keys: list[list[str]],
                        all_dst_offsets: list[list[list[int]]],
                        all_src_offsets: list[list[list[int]]],
                        all_sizes: list[list[list[int]]]) -> list[list[list[int]]]:
        """Byte ranges of objects into buffers: per buffer, per key, per range the bytes
        copied or a negative code (-704 no such key, -600 a range outside it)."""
        return ranges.get_into_ranges(self._objects.batch_get_buffer, self.registered,
                                      buffer_ptrs, all_keys, all_dst_offsets, all_src_offsets,
                                      all_sizes)
