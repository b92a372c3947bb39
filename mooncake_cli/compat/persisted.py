"""A store client whose objects are also persisted to the master's root_fs_dir (fs_tier.py), as
upstream's client does when its master has `--root_fs_dir`: every put is written to a file
after it is stored, and a key memory no longer holds (evicted, or a master that restarted) is
read, sized and found from its file, as is one whose memory replicas cannot be read (a holder
killed before the master noticed). A put of a key with a file is an existing object (0,
unchanged); an upsert replaces both; a removal removes both.

The compat store wraps its StoreClient in this only when the master names a directory
(`StoreClient.root_fs_dir`), so a store without one pays nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from mooncake_cli.compat.fs_tier import FileTier
from mooncake_cli.store.client.values import Gathered, readable
from mooncake_cli.store.errors import BufferOverflow, InvalidParams, StoreCode, StoreError
from mooncake_cli.store.records import ReplicateConfig

log = logging.getLogger("mooncake.compat")
NOT_FOUND = StoreCode.OBJECT_NOT_FOUND


def snapshot(value: Any) -> bytes:
    """The bytes of a value to put, copied (the caller may reuse its buffer)."""
    view = readable(value)
    return b"".join(view.parts) if isinstance(view, Gathered) else bytes(view)


Removals = list[StoreError | None]  # (inside PersistedClient `list` is the method)
UNREADABLE = (NOT_FOUND, StoreCode.TRANSFER_FAIL, StoreCode.INVALID_REPLICA)


def _missing(result: object) -> bool:
    """A read memory could not answer, which the file may: the object is gone from memory, or
    no replica of it could be read (its holder died and the master does not know yet, or the
    bytes failed their checksum)."""
    return isinstance(result, StoreError) and result.code in UNREADABLE


class PersistedClient:
    """`inner` (a StoreClient) with `files` behind it; every other attribute is inner's."""

    def __init__(self, inner: Any, files: FileTier) -> None:
        self._inner, self.files = inner, files
        files.on_fail = lambda key, e: log.error("persisting %r to %s failed: %s",
                                                 key, files.root, e)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    # -- puts ------------------------------------------------------------------------------------
    def put(self, key: str, data: Any, config: ReplicateConfig | None = None,
            upsert: bool = False) -> None:
        if not upsert and self.files.exists(key):
            raise StoreError(f"object {key!r} exists (persisted)", StoreCode.OBJECT_ALREADY_EXISTS)
        self._inner.put(key, data, config, upsert)
        self.files.write(key, snapshot(data))

    def batch_put(self, keys: Sequence[str], values: Sequence[Any],
                  config: ReplicateConfig | None = None,
                  upsert: bool = False) -> list[StoreError | None]:
        if len(keys) != len(values):
            raise InvalidParams(f"{len(keys)} keys but {len(values)} values")
        out: list[StoreError | None] = [None] * len(keys)
        todo = [i for i, k in enumerate(keys) if upsert or not self.files.exists(k)]
        for i in set(range(len(keys))) - set(todo):
            out[i] = StoreError(f"object {keys[i]!r} exists (persisted)",
                                StoreCode.OBJECT_ALREADY_EXISTS)
        if todo:
            got = self._inner.batch_put([keys[i] for i in todo], [values[i] for i in todo],
                                        config, upsert)
            for i, e in zip(todo, got, strict=True):
                out[i] = e
                if e is None:
                    self.files.write(keys[i], snapshot(values[i]))
        return out

    # -- reads -----------------------------------------------------------------------------------
    def _file(self, key: str, alloc: Callable[[int], Any] | None, found: Any) -> Any:
        try:
            return self.files.read(key, alloc)
        except StoreError as e:
            return found if e.code == NOT_FOUND else e

    def batch_get_buffers(self, keys: Sequence[str], alloc: Callable[[int], Any] = bytearray
                          ) -> list[Any]:
        """As the client's; a value read from its file is bytes when `alloc` is bytearray
        (read as it is, not zero-filled and copied)."""
        got = self._inner.batch_get_buffers(keys, alloc)
        from_file = None if alloc is bytearray else alloc
        return [self._file(k, from_file, g) if _missing(g) else g
                for k, g in zip(keys, got, strict=True)]

    def batch_get_into(self, keys: Sequence[str], buffers: Sequence[Any]) -> list[Any]:
        got = self._inner.batch_get_into(keys, buffers)
        out: list[Any] = []
        for key, buf, g in zip(keys, buffers, got, strict=True):
            if _missing(g):
                dest = memoryview(buf).cast("B")

                def into(n: int, key: str = key, dest: memoryview = dest) -> memoryview:
                    if n > len(dest):
                        raise BufferOverflow(f"{key!r} is {n} bytes; the buffer {len(dest)}")
                    return dest[:n]
                try:
                    g = len(self.files.read(key, into))
                except StoreError as e:
                    g = g if e.code == NOT_FOUND else e
            out.append(g)
        return out

    def exists(self, key: str) -> bool:
        return bool(self._inner.exists(key)) or self.files.exists(key)

    def batch_exists(self, keys: Sequence[str]) -> list[bool | StoreError]:
        return [v if v is True or isinstance(v, StoreError) else self.files.exists(k)
                for k, v in zip(keys, self._inner.batch_exists(keys), strict=True)]

    def size(self, key: str) -> int:
        try:
            return int(self._inner.size(key))
        except StoreError as e:
            n = self.files.size(key) if e.code == NOT_FOUND else None
            if n is None:
                raise
            return n

    def list(self, prefix: str = "") -> list[str]:
        known = self._inner.list(prefix)
        seen = set(known)
        return known + [k for k in self.files.keys() if k.startswith(prefix) and k not in seen]

    # -- removal ---------------------------------------------------------------------------------
    def remove(self, key: str, force: bool = False) -> None:
        try:
            self._inner.remove(key, force)
        except StoreError as e:
            if e.code != NOT_FOUND or not self.files.remove(key):
                raise
            return
        self.files.remove(key)

    def batch_remove(self, keys: Sequence[str], force: bool = False) -> Removals:
        """As the client's, the files of the keys removed too (a key only a file held counts
        as removed)."""
        return [None if (e is None or e.code == NOT_FOUND) and self.files.remove(k) else e
                for k, e in zip(keys, self._inner.batch_remove(keys, force), strict=True)]

    def remove_all(self, force: bool = False) -> int:
        before = set(self._inner.list())
        n = int(self._inner.remove_all(force))
        kept = set(self._inner.list())  # leased (or pinned) objects stay, with their files
        return n + sum(1 for k in list(self.files.keys())
                       if k not in kept and self.files.remove(k) and k not in before)

    def close(self) -> None:
        try:
            self.files.close()
        finally:
            self._inner.close()
