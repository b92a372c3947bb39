"""The compat store's multi-buffer calls (upstream's batch_put_from_multi_buffers,
batch_get_into_multi_buffers, put_from_with_metadata): an object is the concatenation of
several caller buffers (integer addresses, ranges.py), put without joining them first and read
back by scattering it over them, as upstream does.

Codes as upstream's: per key 0 (put) or the object's size (get); -600 for buffers and sizes of
different lengths, no buffer, or buffers smaller than the object; -800 for buffers larger than
it (nothing is written); -704 for a missing key."""

from __future__ import annotations

from typing import Any

from mooncake_cli.compat import ranges
from mooncake_cli.compat.codes import BAD, code_of, put_code
from mooncake_cli.compat.connection import Client, Connection
from mooncake_cli.compat.tensor_api import uninitialised
from mooncake_cli.compat.types import native
from mooncake_cli.interfaces import MooncakeError
from mooncake_cli.store.client.values import Gathered
from mooncake_cli.store.errors import StoreCode, StoreError

TOO_LARGE = int(StoreCode.TRANSFER_FAIL)


def _parts(ptrs: Any, sizes: Any) -> list[memoryview] | None:
    if not isinstance(ptrs, list) or not isinstance(sizes, list) or not ptrs \
            or len(ptrs) != len(sizes):
        return None
    try:
        return [ranges.view(p, n) for p, n in zip(ptrs, sizes, strict=True)]
    except (StoreError, ValueError, TypeError, OverflowError):
        return None


class MultiBuffers:
    """Objects put from, and read into, several caller buffers each."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn

    def batch_put_from_multi_buffers(self, keys: list[str], all_buffer_ptrs: list[list[int]],
                                     all_sizes: list[list[int]], config: Any = None) -> list[int]:
        """Each key's object is its buffers one after the other; per key 0 or its code (a key
        that exists is 0, unchanged)."""
        if len(keys) != len(all_buffer_ptrs) or len(keys) != len(all_sizes):
            return [BAD] * len(keys)
        out = [BAD] * len(keys)
        todo = [(i, parts) for i, (p, n) in enumerate(zip(all_buffer_ptrs, all_sizes, strict=True))
                if (parts := _parts(p, n)) is not None]
        if not todo:
            return out
        values = [parts[0] if len(parts) == 1 else Gathered(parts) for _, parts in todo]
        codes = self._conn.run(lambda c: [put_code(e) for e in c.batch_put(
            [keys[i] for i, _ in todo], values, native(config), False)], lambda e: [e] * len(todo))
        for (i, _), rc in zip(todo, codes, strict=True):
            out[i] = rc
        return out

    def batch_get_into_multi_buffers(self, keys: list[str], all_buffer_ptrs: list[list[int]],
                                     all_sizes: list[list[int]],
                                     prefer_alloc_in_same_node: bool = False) -> list[int]:
        """Scatter each key's object over its buffers in order; per key the object's size or a
        code. (`prefer_alloc_in_same_node`: upstream's hint for its staging memory; none here.)"""
        if len(keys) != len(all_buffer_ptrs) or len(keys) != len(all_sizes):
            return [BAD] * len(keys)
        views = [_parts(p, n) for p, n in zip(all_buffer_ptrs, all_sizes, strict=True)]
        direct = self._scattered(keys, views)  # straight into registered buffers, where it can
        wanted = [k for k, v, d in zip(keys, views, direct, strict=True)
                  if v is not None and d is None]

        def go(c: Client) -> list[Any]:
            return list(c.batch_get_buffers(wanted, uninitialised)) if wanted else []
        got = iter(self._conn.run(go, lambda e: [e] * len(wanted)))  # a code each when it failed
        out: list[int] = []
        for parts, done in zip(views, direct, strict=True):
            if parts is None:
                out.append(BAD)
                continue
            if done is not None:
                out.append(done)
                continue
            data = next(got)
            if isinstance(data, (StoreError, int)):
                out.append(code_of(data) if isinstance(data, StoreError) else data)
                continue
            room = sum(len(p) for p in parts)
            if room != len(data):
                out.append(BAD if room < len(data) else TOO_LARGE)
                continue
            src, at = memoryview(data).cast("B"), 0
            for part in parts:
                part[:] = src[at:at + len(part)]
                at += len(part)
            out.append(len(data))
        return out

    def _scattered(self, keys: list[str], views: list[list[memoryview] | None]
                   ) -> list[int | None]:
        """Per key the bytes read straight into its parts (all in buffers registered with
        `register_buffer`: no staging, no copy), or None: read it the staged way."""
        client = self._conn.client
        todo = [i for i, v in enumerate(views) if v and all(p.nbytes for p in v)]
        out: list[int | None] = [None] * len(keys)
        if not todo or client is None or self._conn.engine is None:
            return out
        try:
            got = client.batch_get_scattered([keys[i] for i in todo],
                                             [views[i] or [] for i in todo])
        except MooncakeError:
            return out
        for i, n in zip(todo, got, strict=True):
            out[i] = n
        return out

    def put_from_with_metadata(self, key: str, buffer_ptr: int, metadata_buffer_ptr: int,
                               size: int, metadata_size: int, config: Any = None) -> int:
        """Put the object `metadata_size` bytes at `metadata_buffer_ptr` followed by `size` bytes
        at `buffer_ptr` (upstream's order)."""
        return self.batch_put_from_multi_buffers([key], [[metadata_buffer_ptr, buffer_ptr]],
                                            [[metadata_size, size]], config)[0]
