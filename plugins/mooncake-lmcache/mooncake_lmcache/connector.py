"""`MooncakeStoreConnector`: LMCache's remote connector for the mooncake-cli store.

LMCache builds it as `cls(loop=..., local_cpu_backend=..., config=...)` once
`remote_storage_plugins` names it (see settings.py for the keys). Chunks travel without extra
copies: a put hands LMCache's CPU buffer itself to `StoreClient.batch_put`, a get reads straight
into a buffer from `local_cpu_backend.allocate` with `batch_get_into` (LMCache's whole CPU buffer
is registered with the transfer engine once, so a remote replica is copied into it directly).
A chunk is stored as its raw KV bytes under `key_prefix + key.to_string()`; its shape comes from
the engine's own layout (the key already names the model, world size, worker and dtype), and a
partial last chunk is recognised by its size. Lookups take the store's lease (`--lease-ttl`),
so a chunk found by a lookup is not evicted before the retrieve that follows. An unreachable
store gives misses (see link.py); one that is unreachable at start-up raises StoreUnreachable,
which LMCache logs before running without this backend.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, TypeVar

from lmcache.utils import CacheEngineKey
from lmcache.v1.memory_management import MemoryObj
from lmcache.v1.storage_backend.connector.base_connector import RemoteConnector
from mooncake_cli.interfaces import ConfigError
from mooncake_cli.store import StoreCode, StoreError

from mooncake_lmcache.link import StoreLink
from mooncake_lmcache.settings import load

log = logging.getLogger("mooncake_lmcache")
T = TypeVar("T")


def _prefix_hits(found: Sequence[object]) -> int:
    """How many leading entries are True (an error or False ends the prefix)."""
    n = 0
    for hit in found:
        if hit is not True:
            break
        n += 1
    return n


class MooncakeStoreConnector(RemoteConnector):
    """An LMCache remote connector over one StoreClient (see the module's docstring)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, local_cpu_backend: Any,
                 config: Any) -> None:
        super().__init__(config, local_cpu_backend.metadata)
        if config.use_layerwise:
            raise ConfigError("the mooncake connector stores whole chunks: set "
                              "use_layerwise: false")
        if (config.remote_serde or "naive") != "naive":
            raise ConfigError(f"the mooncake connector stores raw KV bytes: set remote_serde: "
                              f"naive, not {config.remote_serde!r}")
        self.settings = load(config.extra_config, config.remote_storage_plugins)
        self.loop = loop
        self.local_cpu_backend = local_cpu_backend
        self.link = StoreLink(self.settings)
        # two: a lookup or a put need not wait behind a get
        self._pool = ThreadPoolExecutor(2, thread_name_prefix="mooncake-lmcache")
        allocator = getattr(local_cpu_backend, "memory_allocator", None)
        self.direct = self.link.land_reads_in(getattr(allocator, "buffer", None))
        log.info("mooncake store connector: master %s, segment %d bytes, %d replica(s)",
                 self.settings.master, self.settings.segment_size, self.settings.replica_num)

    # -- helpers ---------------------------------------------------------------------------------
    def _name(self, key: CacheEngineKey) -> str:
        return self.settings.key_prefix + key.to_string()

    async def _off_loop(self, fn: Callable[[], T]) -> T:
        """Run a blocking store call on the connector's thread, not on LMCache's event loop."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn)

    def _count(self, keys: Sequence[CacheEngineKey]) -> int:
        if not keys:
            return 0
        names = [self._name(k) for k in keys]
        return self.link.guard("lookup", lambda: _prefix_hits(self.link.client.batch_exists(names)),
                               0)

    # -- lookups ---------------------------------------------------------------------------------
    async def exists(self, key: CacheEngineKey) -> bool:
        return await self._off_loop(lambda: self.exists_sync(key))

    def exists_sync(self, key: CacheEngineKey) -> bool:
        return self.link.guard("exists", lambda: self.link.client.exists(self._name(key)), False)

    def support_batched_contains(self) -> bool:
        return True

    def batched_contains(self, keys: list[CacheEngineKey]) -> int:
        """How many leading keys the store holds, in one request (each found one leased)."""
        return self._count(keys)

    def support_batched_async_contains(self) -> bool:
        return True

    async def batched_async_contains(self, lookup_id: str, keys: list[CacheEngineKey],
                                     pin: bool = False) -> int:
        return await self._off_loop(lambda: self._count(keys))

    # -- reads -----------------------------------------------------------------------------------
    def _allocate(self, n: int) -> list[MemoryObj | None]:
        return [self.local_cpu_backend.allocate(self.meta_shapes, self.meta_dtypes, self.meta_fmt)
                for _ in range(n)]

    def _read(self, keys: Sequence[CacheEngineKey],
              objs: list[MemoryObj | None]) -> list[MemoryObj | None]:
        """Read each key into its buffer; per key the buffer, shaped to what was read, or None
        (its buffer released) on a miss."""
        out: list[MemoryObj | None] = [None] * len(keys)
        want = [i for i, o in enumerate(objs) if o is not None and o.raw_tensor is not None]
        names = [self._name(keys[i]) for i in want]
        bufs = [objs[i].raw_tensor for i in want]  # type: ignore[union-attr]
        none: list[int | StoreError] = []
        got = self.link.guard("get", lambda: self.link.client.batch_get_into(names, bufs), none)
        for j, i in enumerate(want):
            obj = objs[i]
            assert obj is not None
            n = got[j] if j < len(got) else None
            if isinstance(n, int):
                try:
                    out[i] = self.reshape_partial_chunk(obj, n)
                    continue
                except ValueError as e:
                    log.warning("mooncake store: %s is %d bytes, not whole tokens of this "
                                "engine's layout (%s); treated as a miss", names[j], n, e)
            elif isinstance(n, StoreError) and n.code != StoreCode.OBJECT_NOT_FOUND:
                log.warning("mooncake store get %s: %s", names[j], n)
            obj.ref_count_down()
        for i, o in enumerate(objs):
            if o is not None and i not in want:
                o.ref_count_down()
        return out

    async def get(self, key: CacheEngineKey) -> MemoryObj | None:
        return (await self.batched_get([key]))[0]

    def support_batched_get(self) -> bool:
        return True

    async def batched_get(self, keys: list[CacheEngineKey]) -> list[MemoryObj | None]:
        """Every key read straight into a buffer LMCache allocated, in one master request; None
        for each miss. (Split into two concurrent batches it was no faster here: the copies
        release the GIL but are bound by memory bandwidth, and it asked the master twice.)"""
        if not keys or not self.link.up:
            return [None] * len(keys)
        objs = self._allocate(len(keys))  # on the event loop, as LMCache's own connectors do
        return await self._off_loop(partial(self._read, keys, objs))

    def support_batched_get_non_blocking(self) -> bool:
        return True

    async def batched_get_non_blocking(self, lookup_id: str,
                                       keys: list[CacheEngineKey]) -> list[MemoryObj]:
        """The leading run of keys found; buffers after the first miss are released."""
        got = await self.batched_get(keys)
        out: list[MemoryObj] = []
        for obj in got:
            if obj is None:
                break
            out.append(obj)
        for obj in got[len(out):]:
            if obj is not None:
                obj.ref_count_down()
        return out

    # -- writes ----------------------------------------------------------------------------------
    def _write(self, keys: Sequence[CacheEngineKey], objs: Sequence[MemoryObj]) -> None:
        names: list[str] = []
        views: list[Any] = []
        for key, obj in zip(keys, objs, strict=True):
            raw = obj.raw_tensor
            if raw is None:
                continue
            names.append(self._name(key))
            views.append(raw[:obj.get_size()])  # LMCache's buffer itself, no copy
        if not names:
            return
        none: list[StoreError | None] = []
        errors = self.link.guard(
            "put", lambda: self.link.client.batch_put(names, views, self.link.replicate), none)
        for name, err in zip(names, errors, strict=False):
            if err is not None and err.code != StoreCode.OBJECT_ALREADY_EXISTS:
                log.warning("mooncake store put %s: %s", name, err)

    async def put(self, key: CacheEngineKey, memory_obj: MemoryObj) -> None:
        await self.batched_put([key], [memory_obj])

    def support_batched_put(self) -> bool:
        return True

    async def batched_put(self, keys: list[CacheEngineKey], memory_objs: list[MemoryObj]) -> None:
        """Store every chunk in one master request and one transfer batch. LMCache releases the
        buffers once this returns; a chunk the store already holds is left as it is."""
        if keys and self.link.up:
            await self._off_loop(lambda: self._write(keys, memory_objs))

    # -- management ------------------------------------------------------------------------------
    def remove_sync(self, key: CacheEngineKey) -> bool:
        """Remove the chunk; False when absent, leased by a recent lookup, or unreachable."""
        def remove() -> bool:
            self.link.client.remove(self._name(key))
            return True
        return self.link.guard("remove", remove, False)

    async def list(self) -> list[str]:
        """LMCache's key strings the store holds under this connector's prefix."""
        prefix = self.settings.key_prefix
        none: list[str] = []
        names = await self._off_loop(
            lambda: self.link.guard("list", lambda: self.link.client.list(prefix), none))
        return [n[len(prefix):] for n in names]

    def support_ping(self) -> bool:
        return True

    async def ping(self) -> int:
        """0 when the master answers, else the store's (negative) error code."""
        def ask() -> int:
            try:
                self.link.client.leader()
            except StoreError as e:
                return int(e.code)
            return 0
        return await self._off_loop(ask)

    async def close(self) -> None:
        await self._off_loop(self.link.close)
        self._pool.shutdown(wait=False)

    def __repr__(self) -> str:
        return f"<MooncakeStoreConnector master={self.settings.master}>"
