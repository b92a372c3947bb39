"""The compat store's bytes API (upstream's put / get / upsert families, existence, sizes,
removal, replica descriptors): values are copied through the local buffer of
`local_buffer_size` bytes, and a call whose values do not fit fails with INVALID_PARAMS, as
upstream's. A put of a key that exists is a success (0, the object unchanged)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from mooncake_cli.compat.codes import BAD, code_of, put_code
from mooncake_cli.compat.connection import Client, Connection
from mooncake_cli.compat.persisted import PersistedClient
from mooncake_cli.compat.types import BufferHandle, ReplicaDescriptor, native
from mooncake_cli.store.errors import StoreError


class Objects:
    """Objects as bytes, over `conn`'s client."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn

    # -- puts ------------------------------------------------------------------------------------
    def puts(self, keys: list[str], values: Sequence[Any], config: Any,
             upsert: bool) -> list[int]:
        def go(c: Client) -> list[int]:
            self._conn.fits([memoryview(v).nbytes for v in values])
            return [put_code(e) for e in c.batch_put(keys, values, native(config), upsert)]
        return self._conn.run(go, lambda e: [e] * len(keys))

    def one(self, key: str, value: Any, config: Any, upsert: bool) -> int:
        def go(c: Client) -> int:
            self._conn.fits([memoryview(value).nbytes])
            return self._conn.put_one(c, key, value, config, upsert)
        return self._conn.run(go, int)

    def first_error(self, keys: list[str], values: Sequence[Any], config: Any,
                    upsert: bool) -> int:
        """A batch put's one code, as upstream's put_batch: the first error, or 0."""
        return next((e for e in self.puts(keys, values, config, upsert) if e), 0)

    def parts(self, key: str, parts: tuple[Any, ...], config: Any, upsert: bool) -> int:
        return self.one(key, b"".join(bytes(memoryview(x)) for x in parts), config, upsert)

    # -- reads -----------------------------------------------------------------------------------
    def _read(self, c: Client, keys: list[str]) -> list[bytearray | StoreError]:
        got = c.batch_get_buffers(keys)
        self._conn.fits([len(b) for b in got if isinstance(b, (bytes, bytearray))])
        return list(got)

    def get_batch(self, keys: list[str]) -> list[bytes]:
        return self._conn.run(lambda c: [bytes(v) if isinstance(v, (bytes, bytearray)) else b""
                                         for v in self._read(c, keys)],
                              lambda e: [b""] * len(keys))

    def batch_get_buffer(self, keys: list[str]) -> list[BufferHandle | None]:
        return self._conn.run(lambda c: [BufferHandle(v) if isinstance(v, (bytes, bytearray))
                                         else None for v in self._read(c, keys)],
                              lambda e: [None] * len(keys))

    def is_exist(self, key: str) -> int:
        return self._conn.run(lambda c: int(c.exists(key)), lambda e: -1)

    def batch_is_exist(self, keys: list[str]) -> list[int]:
        return self._conn.run(lambda c: [-1 if isinstance(v, StoreError) else int(v)
                                         for v in c.batch_exists(keys)],
                              lambda e: [-1] * len(keys))

    def get_size(self, key: str) -> int:
        return self._conn.run(lambda c: int(c.size(key)), int)

    # -- removal ---------------------------------------------------------------------------------
    def remove(self, key: str, force: bool) -> int:
        def go(c: Client) -> int:
            c.remove(key, force)
            return 0
        return self._conn.run(go, int)

    def batch_remove(self, keys: list[str], force: bool) -> list[int]:
        return self._conn.run(lambda c: [0 if e is None else code_of(e)
                                         for e in c.batch_remove(keys, force)],
                              lambda e: [e] * len(keys))

    def remove_by_regex(self, regex_pattern: str, force: bool) -> int:
        """How many keys matching `regex_pattern` (re.search) were removed."""
        try:
            pattern = re.compile(regex_pattern)
        except (re.error, TypeError):
            return BAD
        return self._conn.run(lambda c: sum(1 for rc in self.batch_remove(
            [k for k in c.list() if pattern.search(k)], force) if rc == 0), int)

    def remove_all(self, force: bool) -> int:
        return self._conn.run(lambda c: int(c.remove_all(force)), int)

    # -- replicas --------------------------------------------------------------------------------
    def batch_get_replica_desc(self, keys: list[str]) -> dict[str, list[ReplicaDescriptor]]:
        """The replicas of each key found (no lease granted); a persisted one (root_fs_dir)
        last, as a disk replica."""
        def go(c: Client) -> dict[str, list[ReplicaDescriptor]]:
            out = {k: [ReplicaDescriptor(r) for r in m.replicas]
                   for k, m in zip(keys, c.batch_describe(keys), strict=True)
                   if not isinstance(m, StoreError) and m.complete}
            if isinstance(c, PersistedClient):
                for k in keys:
                    if (n := c.files.size(k)) is not None:
                        out.setdefault(k, []).append(ReplicaDescriptor.file(c.files.path(k), n))
            return out
        return self._conn.run(go, lambda e: {})

    def batch_replica_clear(self, keys: list[str], segment_name: str) -> list[str]:
        return self._conn.run(lambda c: c.batch_replica_clear(keys, segment_name), lambda e: [])

    def offload_reads(self) -> int:
        return self._conn.run(lambda c: int(c.ssd_reads), lambda e: 0)
