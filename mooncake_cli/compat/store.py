"""Upstream's `mooncake.store` API over this project's store: code written for it runs as is.

    from mooncake_cli.compat.store import MooncakeDistributedStore, ReplicateConfig
    store = MooncakeDistributedStore()
    rc = store.setup("localhost", "P2PHANDSHAKE", 512 << 20, 128 << 20, "tcp", "",
                     "127.0.0.1:50051")
    assert rc == 0 and store.put("k", b"v") == 0 and store.get("k") == b"v"

(`import mooncake.store` gives this module where upstream's wheel is not installed: the
`mooncake-compat` plugin, see plugins/mooncake-compat.) As upstream: calls return 0 / a count /
bytes read on success and a negative ErrorCode (mooncake_cli.store.errors) on failure, `get` b"",
`get_tensor` / `get_buffer` None, `is_exist` -1 (a store not set up, or closed, answers as
upstream's: closed.py); a put of a key that exists is a success (0, the object unchanged);
`upsert*` replace it. The bytes API (`put*`, `upsert*`, `get*`) copies through a local buffer
of `local_buffer_size` bytes: a call whose values do not fit fails with INVALID_PARAMS, as
upstream's (0 bytes: every such call). Pointers are integer addresses (numpy `arr.ctypes.data`),
read and written through ctypes: a bad address crashes, as upstream.
"""

from __future__ import annotations

import logging
import re
import secrets
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from mooncake_cli.compat import (
    buffers_api,
    closed,
    safetensors_api,
    sessions,
    tasks,
    tensor_api,
    tensor_buffers,
    zero_copy,
)
from mooncake_cli.compat.codes import BAD, NOT_READY, code_of, put_code
from mooncake_cli.compat.fs_tier import FileTier
from mooncake_cli.compat.persisted import PersistedClient, fs_dir_of
from mooncake_cli.compat.session import SetupArgs, master_reachable, ssd_size, start_engine
from mooncake_cli.compat.tasks import QueryTaskResponse, TaskStatus, TaskType
from mooncake_cli.compat.types import (
    BufferDescriptor,
    BufferHandle,
    DiskDescriptor,
    MemoryDescriptor,
    ObjectDataType,
    ReplicaDescriptor,
    ReplicaStatus,
    ReplicateConfig,
    SoftPinAction,
    native,
)
from mooncake_cli.http.auth import env_secret
from mooncake_cli.interfaces import MooncakeError
from mooncake_cli.registry import Registry
from mooncake_cli.store.errors import ErrorCode, StoreError
from mooncake_cli.store.wire import protocol as p
from mooncake_cli.transfer.engine import TransferEngine
from mooncake_cli.transfer.segment import Region

__all__ = ["MooncakeDistributedStore", "ReplicateConfig", "SoftPinAction", "ObjectDataType",
           "ReplicaStatus", "ReplicaDescriptor", "MemoryDescriptor", "DiskDescriptor",
           "BufferDescriptor", "BufferHandle", "TaskStatus", "TaskType", "QueryTaskResponse"]
log = logging.getLogger("mooncake.compat")
T = TypeVar("T")


class MooncakeDistributedStore:
    """A store client with upstream's method names, arguments and integer return codes."""

    def __init__(self, timeout: float = 5.0) -> None:
        self.timeout = timeout  # seconds per master request (not an upstream argument)
        self._engine: TransferEngine | None = None
        self._own_engine = self._own_client = True
        self._client: Any = None  # mooncake_cli.store.client.StoreClient once set up
        self._hostname = ""
        self._buffer = 0  # local_buffer_size
        self._buffers: dict[int, tuple[Region | None, memoryview]] = {}
        self._put_sessions: dict[str, tuple[bytearray, Any]] = {}  # compat/sessions.py
        self._get_sessions: dict[str, Any] = {}
        self._tasks: dict[tuple[int, int], QueryTaskResponse] = {}  # compat/tasks.py
        self._client_uuid = (secrets.randbits(64), secrets.randbits(64))

    @classmethod
    def over(cls, client: Any, local_buffer_size: int = 1 << 40) -> MooncakeDistributedStore:
        """This API over a StoreClient set up elsewhere (close() leaves it and its engine)."""
        store = cls(client.timeout)
        store._client, store._engine = client, client.engine
        store._own_engine = store._own_client = False
        store._buffer, store._hostname = local_buffer_size, client.engine.name
        return store

    # -- setup / teardown ------------------------------------------------------------------------
    def setup(self, *args: Any, **kwargs: Any) -> int:
        """setup(local_hostname, metadata_server, global_segment_size, local_buffer_size,
        protocol, rdma_devices, master_server_addr, engine=None, enable_ssd_offload=False,
        ssd_offload_path="", tenant_id="default", enable_client_http_server=False,
        client_http_port=9300), or setup(dict); 0 or an error code."""
        if self._client is not None:
            return NOT_READY
        try:
            a = SetupArgs.parse(args, kwargs)
            if not master_reachable(a.master, min(self.timeout, 2.0)):
                log.error("setup: no master answers at %s", a.master)
                return int(ErrorCode.RPC_FAIL)
            from mooncake_cli.store.client import StoreClient

            if a.engine is not None and not isinstance(a.engine, TransferEngine):
                raise StoreError("setup: engine must be a mooncake_cli TransferEngine",
                                 ErrorCode.INVALID_PARAMS)
            self._own_engine = a.engine is None
            self._engine = a.engine or start_engine(a, Registry.from_env(), self.timeout)
            self._client = StoreClient(a.master, self._engine, a.segment, timeout=self.timeout,
                                       ssd_dir=a.ssd_dir, ssd_size=ssd_size(a),
                                       secret=env_secret() or None)
            fs_dir = fs_dir_of(self._client)
            if fs_dir:  # the master's root_fs_dir: objects persisted there too (persisted.py)
                self._client = PersistedClient(self._client, FileTier(fs_dir))
        except (MooncakeError, OSError, ValueError) as e:  # a code, as upstream: never raises
            log.error("setup: %s", e)
            self.close()
            return code_of(e)
        self._buffer = a.buffer
        self._hostname = self._engine.name
        return 0

    def close(self) -> int:
        self._put_sessions.clear()
        self._get_sessions.clear()
        for ptr in list(self._buffers):
            self.unregister_buffer(ptr)
        client, engine, self._client, self._engine = self._client, self._engine, None, None
        if client is not None and self._own_client:
            client.close()
        if engine is not None and self._own_engine:
            engine.close()
        return 0

    def get_hostname(self) -> str:
        """This client's segment name (HOST:PORT), what `preferred_segment` takes."""
        return self._hostname

    def health_check(self) -> int:
        """0 healthy, 1 not set up (or closed), 2 the master does not answer."""
        if self._client is None:
            return 1
        try:
            self._client.stats()
        except MooncakeError:
            return 2
        return 0

    # -- plumbing --------------------------------------------------------------------------------
    def _run(self, fn: Callable[[Any], T], fail: Callable[[int], T]) -> T:
        if self._client is None:
            return fail(NOT_READY)
        try:
            return fn(self._client)
        except (MooncakeError, ValueError, TypeError, OverflowError) as e:
            log.debug("store call failed: %s", e)
            return fail(code_of(e))

    def _fits(self, sizes: Sequence[int]) -> None:
        """The bytes API stages through local_buffer_size bytes, as upstream."""
        if sum(sizes) > self._buffer:
            raise StoreError(f"{sum(sizes)} bytes do not fit the local buffer of "
                             f"{self._buffer}", ErrorCode.INVALID_PARAMS)

    def _puts(self, keys: list[str], values: Sequence[Any], config: Any,
              upsert: bool) -> list[int]:
        def go(c: Any) -> list[int]:
            self._fits([memoryview(v).nbytes for v in values])
            return [put_code(e) for e in c.batch_put(keys, values, native(config), upsert)]
        return self._run(go, lambda e: [e] * len(keys))

    def _one(self, key: str, value: Any, config: Any, upsert: bool) -> int:
        def go(c: Any) -> int:
            self._fits([memoryview(value).nbytes])
            return self._put_one(c, key, value, config, upsert)
        return self._run(go, int)

    @staticmethod
    def _put_one(c: Any, key: str, value: Any, config: Any, upsert: bool) -> int:
        """One put by client `c`: its code (an existing key is 0, as upstream)."""
        try:
            c.put(key, value, native(config), upsert)
        except StoreError as e:
            return put_code(e)
        return 0

    # -- objects ---------------------------------------------------------------------------------
    def put(self, key: str, value: Any, config: Any = None) -> int:
        return self._one(key, value, config, False)

    def upsert(self, key: str, value: Any, config: Any = None) -> int:
        return self._one(key, value, config, True)

    def put_batch(self, keys: list[str], values: list[Any], config: Any = None) -> int:
        return next((e for e in self._puts(keys, values, config, False) if e), 0)

    def upsert_batch(self, keys: list[str], values: list[Any], config: Any = None) -> int:
        return next((e for e in self._puts(keys, values, config, True) if e), 0)

    def put_parts(self, key: str, *parts: Any, config: Any = None) -> int:
        return self.put(key, b"".join(bytes(memoryview(x)) for x in parts), config)

    def upsert_parts(self, key: str, *parts: Any, config: Any = None) -> int:
        return self.upsert(key, b"".join(bytes(memoryview(x)) for x in parts), config)

    def _read(self, c: Any, keys: list[str]) -> list[bytearray | StoreError]:
        got = c.batch_get_buffers(keys)
        self._fits([len(b) for b in got if isinstance(b, (bytes, bytearray))])
        return list(got)

    def get(self, key: str) -> bytes:
        return self.get_batch([key])[0]

    def get_batch(self, keys: list[str]) -> list[bytes]:
        return self._run(lambda c: [bytes(v) if isinstance(v, (bytes, bytearray)) else b""
                                    for v in self._read(c, keys)], lambda e: [b""] * len(keys))

    def get_buffer(self, key: str) -> BufferHandle | None:
        return self.batch_get_buffer([key])[0]

    def batch_get_buffer(self, keys: list[str]) -> list[BufferHandle | None]:
        return self._run(lambda c: [BufferHandle(v) if isinstance(v, (bytes, bytearray)) else None
                                    for v in self._read(c, keys)], lambda e: [None] * len(keys))

    def is_exist(self, key: str) -> int:
        return self._run(lambda c: int(c.exists(key)), lambda e: -1)

    def batch_is_exist(self, keys: list[str]) -> list[int]:
        return self._run(lambda c: [-1 if isinstance(v, StoreError) else int(v)
                                    for v in c.batch_exists(keys)],
                         lambda e: [-1] * len(keys))

    def get_size(self, key: str) -> int:
        return self._run(lambda c: int(c.size(key)), int)

    def remove(self, key: str, force: bool = False) -> int:
        return self._run(lambda c: c.remove(key, force) or 0, int)

    def batch_remove(self, keys: list[str], force: bool = False) -> list[int]:
        def go(c: Any) -> list[int]:
            items = c._rpc.call(p.BatchRemove(list(keys), force), list[p.Reply])
            out = [code_of(e) if isinstance(e := c._value(i, None), StoreError) else 0
                   for i in items]
            if isinstance(c, PersistedClient):
                out = c.removed(keys, out)
            for k, rc in zip(keys, out, strict=True):
                if rc == 0:
                    c.holdings.discard(k)
            return out
        return self._run(go, lambda e: [e] * len(keys))

    def remove_by_regex(self, regex_pattern: str, force: bool = False) -> int:
        """How many keys matching `regex_pattern` (re.search) were removed."""
        try:
            pattern = re.compile(regex_pattern)
        except (re.error, TypeError):
            return BAD
        return self._run(lambda c: sum(1 for rc in self.batch_remove(
            [k for k in c.list() if pattern.search(k)], force) if rc == 0), int)

    def remove_all(self, force: bool = False) -> int:
        return self._run(lambda c: int(c.remove_all(force)), int)

    def get_replica_desc(self, key: str) -> list[ReplicaDescriptor]:
        return self.batch_get_replica_desc([key]).get(key, [])

    def batch_get_replica_desc(self, keys: list[str]) -> dict[str, list[ReplicaDescriptor]]:
        """The replicas of each key found (no lease granted); a persisted one (root_fs_dir)
        last, as a disk replica."""
        def go(c: Any) -> dict[str, list[ReplicaDescriptor]]:
            out = {k: [ReplicaDescriptor(r) for r in m.replicas]
                   for k, m in zip(keys, c.batch_describe(keys), strict=True)
                   if not isinstance(m, StoreError) and m.complete}
            if isinstance(c, PersistedClient):
                for k in keys:
                    if (n := c.files.size(k)) is not None:
                        out.setdefault(k, []).append(ReplicaDescriptor.file(c.files.path(k), n))
            return out
        return self._run(go, lambda e: {})

    def batch_replica_clear(self, keys: list[str], segment_name: str = "") -> list[str]:
        """Drop the replicas (on `segment_name` only, when given) of the keys whose lease has
        expired; the keys cleared."""
        return self._run(lambda c: c.batch_replica_clear(keys, segment_name), lambda e: [])

    def get_offload_rpc_read_count(self) -> int:
        """Reads of objects held only on SSD (batch forms and get_into / get)."""
        return self._run(lambda c: int(c.ssd_reads), lambda e: 0)

    # -- zero copy (compat/zero_copy.py) ---------------------------------------------------------
    register_buffer = zero_copy.register_buffer
    unregister_buffer = zero_copy.unregister_buffer
    put_from = zero_copy.put_from
    upsert_from = zero_copy.upsert_from
    batch_put_from = zero_copy.batch_put_from
    batch_upsert_from = zero_copy.batch_upsert_from
    get_into = zero_copy.get_into
    batch_get_into = zero_copy.batch_get_into
    get_into_ranges = zero_copy.get_into_ranges
    batch_put_from_multi_buffers = buffers_api.batch_put_from_multi_buffers
    batch_get_into_multi_buffers = buffers_api.batch_get_into_multi_buffers
    put_from_with_metadata = buffers_api.put_from_with_metadata

    # -- sessions (compat/sessions.py) -----------------------------------------------------------
    batch_put_session_start = sessions.batch_put_session_start
    batch_put_from_multi_buffer_ranges = sessions.batch_put_from_multi_buffer_ranges
    batch_put_session_end = sessions.batch_put_session_end
    batch_put_session_revoke = sessions.batch_put_session_revoke
    batch_get_session_start = sessions.batch_get_session_start
    batch_get_into_multi_buffer_ranges = sessions.batch_get_into_multi_buffer_ranges
    batch_get_session_end = sessions.batch_get_session_end

    # -- replica tasks (compat/tasks.py) ---------------------------------------------------------
    create_copy_task = tasks.create_copy_task
    create_move_task = tasks.create_move_task
    query_task = tasks.query_task

    # -- tensors (compat/tensor_api.py) -----------------------------------------------------------
    put_tensor = tensor_api.put_tensor
    upsert_tensor = tensor_api.upsert_tensor
    pub_tensor = tensor_api.pub_tensor
    upsert_pub_tensor = tensor_api.upsert_pub_tensor
    get_tensor = tensor_api.get_tensor
    batch_put_tensor = tensor_api.batch_put_tensor
    batch_upsert_tensor = tensor_api.batch_upsert_tensor
    batch_pub_tensor = tensor_api.batch_pub_tensor
    batch_get_tensor = tensor_api.batch_get_tensor
    put_tensor_with_tp = tensor_api.put_tensor_with_tp
    get_tensor_with_tp = tensor_api.get_tensor_with_tp
    batch_put_tensor_with_tp = tensor_api.batch_put_tensor_with_tp
    batch_get_tensor_with_tp = tensor_api.batch_get_tensor_with_tp
    pub_tensor_with_tp = tensor_buffers.pub_tensor_with_tp
    batch_pub_tensor_with_tp = tensor_buffers.batch_pub_tensor_with_tp
    batch_upsert_pub_tensor = tensor_buffers.batch_upsert_pub_tensor
    save_tensor_to_safetensor = safetensors_api.save_tensor_to_safetensor
    load_tensor_from_safetensor = safetensors_api.load_tensor_from_safetensor

    # -- tensors in caller buffers (compat/tensor_buffers.py) ------------------------------------
    get_tensor_into = tensor_buffers.get_tensor_into
    batch_get_tensor_into = tensor_buffers.batch_get_tensor_into
    put_tensor_from = tensor_buffers.put_tensor_from
    batch_put_tensor_from = tensor_buffers.batch_put_tensor_from
    upsert_tensor_from = tensor_buffers.upsert_tensor_from
    batch_upsert_tensor_from = tensor_buffers.batch_upsert_tensor_from
    put_tensor_with_tp_from = tensor_buffers.put_tensor_with_tp_from
    batch_put_tensor_with_tp_from = tensor_buffers.batch_put_tensor_with_tp_from
    get_tensor_with_tp_into = tensor_buffers.get_tensor_with_tp_into
    batch_get_tensor_with_tp_into = tensor_buffers.batch_get_tensor_with_tp_into


closed.guard(MooncakeDistributedStore)  # upstream's answers when not set up (closed.py)
