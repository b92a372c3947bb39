"""Upstream's `mooncake.store` API over this project's store: code written for it runs as is.

    from mooncake_cli.compat.store import MooncakeDistributedStore, ReplicateConfig
    store = MooncakeDistributedStore()
    rc = store.setup("localhost", "P2PHANDSHAKE", 512 << 20, 128 << 20, "tcp", "",
                     "127.0.0.1:50051")
    assert rc == 0 and store.put("k", b"v") == 0 and store.get("k") == b"v"

(`import mooncake.store` gives this module where upstream's wheel is not installed: the
`mooncake-compat` plugin, see plugins/mooncake-compat.) As upstream: calls return 0 / a count /
bytes read on success and a negative StoreCode (mooncake_cli.store.errors) on failure, `get` b"",
`get_tensor` / `get_buffer` None, `is_exist` -1 (a store not set up, or closed, answers as
upstream's: closed.py); a put of a key that exists is a success (0, the object unchanged);
`upsert*` replace it. The bytes API (`put*`, `upsert*`, `get*`) copies through a local buffer
of `local_buffer_size` bytes: a call whose values do not fit fails with INVALID_PARAMS, as
upstream's (0 bytes: every such call). Pointers are integer addresses (numpy `arr.ctypes.data`),
read and written through ctypes: a bad address crashes, as upstream.
"""

from __future__ import annotations

from typing import Any

from mooncake_cli.compat import closed
from mooncake_cli.compat.buffers_api import MultiBuffers
from mooncake_cli.compat.connection import Connection
from mooncake_cli.compat.objects import Objects
from mooncake_cli.compat.safetensors_api import SafeTensors
from mooncake_cli.compat.sessions import Sessions
from mooncake_cli.compat.tasks import QueryTaskResponse, ReplicaTasks, TaskStatus, TaskType
from mooncake_cli.compat.tensor_api import Tensors
from mooncake_cli.compat.tensor_buffers import TensorBuffers
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
)
from mooncake_cli.compat.zero_copy import CallerBuffers
from mooncake_cli.interfaces import MooncakeError
from mooncake_cli.store.client import StoreClient

__all__ = ["MooncakeDistributedStore", "ReplicateConfig", "SoftPinAction", "ObjectDataType",
           "ReplicaStatus", "ReplicaDescriptor", "MemoryDescriptor", "DiskDescriptor",
           "BufferDescriptor", "BufferHandle", "TaskStatus", "TaskType", "QueryTaskResponse"]


class MooncakeDistributedStore:
    """A store client with upstream's method names, arguments and integer return codes: each
    call goes to the part that owns its state (the modules named in the sections below), and
    those decorated `closed.*` answer as upstream's when the store is not set up (closed.py)."""

    def __init__(self, timeout: float = 5.0) -> None:
        self._conn = Connection(timeout)  # timeout: seconds per master request (ours only)
        self._objects = Objects(self._conn)
        self._buffers = CallerBuffers(self._conn, self._objects)
        self._multi = MultiBuffers(self._conn)
        self._sessions = Sessions(self._conn)
        self._tasks = ReplicaTasks(self._conn)
        self._tensors = Tensors(self._conn)
        self._tensor_buffers = TensorBuffers(self._conn, self._tensors)
        self._files = SafeTensors(self._tensors)

    @classmethod
    def over(cls, client: StoreClient, local_buffer_size: int = 1 << 40
             ) -> MooncakeDistributedStore:
        """This API over a StoreClient set up elsewhere (close() leaves it and its engine)."""
        store = cls(client.timeout)
        store._conn.attach(client, local_buffer_size)
        return store

    @property
    def timeout(self) -> float:
        return self._conn.timeout

    # -- setup / teardown (connection.py) --------------------------------------------------------
    def setup(self, *args: Any, **kwargs: Any) -> int:
        """setup(local_hostname, metadata_server, global_segment_size, local_buffer_size,
        protocol, rdma_devices, master_server_addr, engine=None, enable_ssd_offload=False,
        ssd_offload_path="", tenant_id="default", enable_client_http_server=False,
        client_http_port=9300), or setup(dict); 0 or an error code."""
        return self._conn.setup(args, kwargs)

    def close(self) -> int:
        self._sessions.clear()
        self._buffers.unregister_all()
        self._conn.close()
        return 0

    def get_hostname(self) -> str:
        """This client's segment name (HOST:PORT), what `preferred_segment` takes."""
        return self._conn.hostname

    def health_check(self) -> int:
        """0 healthy, 1 not set up (or closed), 2 the master does not answer."""
        if self._conn.client is None:
            return 1
        try:
            self._conn.client.stats()
        except MooncakeError:
            return 2
        return 0

    # -- objects as bytes (objects.py) -----------------------------------------------------------
    def put(self, key: str, value: Any, config: Any = None) -> int:
        return self._objects.one(key, value, config, False)
    @closed.code
    def upsert(self, key: str, value: Any, config: Any = None) -> int:
        return self._objects.one(key, value, config, True)
    def put_batch(self, keys: list[str], values: list[Any], config: Any = None) -> int:
        return self._objects.first_error(keys, values, config, False)
    @closed.code
    def upsert_batch(self, keys: list[str], values: list[Any], config: Any = None) -> int:
        return self._objects.first_error(keys, values, config, True)
    def put_parts(self, key: str, *parts: Any, config: Any = None) -> int:
        return self._objects.parts(key, parts, config, False)
    @closed.code
    def upsert_parts(self, key: str, *parts: Any, config: Any = None) -> int:
        return self._objects.parts(key, parts, config, True)
    def get(self, key: str) -> bytes:
        return self.get_batch([key])[0]
    @closed.one_empty_value
    def get_batch(self, keys: list[str]) -> list[bytes]:
        return self._objects.get_batch(keys)
    def get_buffer(self, key: str) -> BufferHandle | None:
        return self._objects.batch_get_buffer([key])[0]
    def batch_get_buffer(self, keys: list[str]) -> list[BufferHandle | None]:
        return self._objects.batch_get_buffer(keys)
    def is_exist(self, key: str) -> int:
        return self._objects.is_exist(key)
    def batch_is_exist(self, keys: list[str]) -> list[int]:
        return self._objects.batch_is_exist(keys)
    def get_size(self, key: str) -> int:
        return self._objects.get_size(key)
    def remove(self, key: str, force: bool = False) -> int:
        return self._objects.remove(key, force)
    def batch_remove(self, keys: list[str], force: bool = False) -> list[int]:
        return self._objects.batch_remove(keys, force)
    def remove_by_regex(self, regex_pattern: str, force: bool = False) -> int:
        return self._objects.remove_by_regex(regex_pattern, force)
    def remove_all(self, force: bool = False) -> int:
        return self._objects.remove_all(force)
    def get_replica_desc(self, key: str) -> list[ReplicaDescriptor]:
        return self._objects.batch_get_replica_desc([key]).get(key, [])
    def batch_get_replica_desc(self, keys: list[str]) -> dict[str, list[ReplicaDescriptor]]:
        return self._objects.batch_get_replica_desc(keys)
    @closed.nothing
    def batch_replica_clear(self, keys: list[str], segment_name: str = "") -> list[str]:
        """Drop the replicas (on `segment_name` only, when given) of the keys whose lease has
        expired; the keys cleared."""
        return self._objects.batch_replica_clear(keys, segment_name)
    def get_offload_rpc_read_count(self) -> int:
        """Reads of objects held only on SSD (batch forms and get_into / get)."""
        return self._objects.offload_reads()
    # -- caller buffers (zero_copy.py) -------------------------------------------------------------
    def register_buffer(self, buffer_ptr: int, size: int) -> int:
        return self._buffers.register_buffer(buffer_ptr, size)
    def unregister_buffer(self, buffer_ptr: int) -> int:
        return self._buffers.unregister_buffer(buffer_ptr)
    @closed.code
    def put_from(self, key: str, buffer_ptr: int, size: int, config: Any = None) -> int:
        return self._buffers.put_from(key, buffer_ptr, size, config)
    @closed.code
    def upsert_from(self, key: str, buffer_ptr: int, size: int, config: Any = None) -> int:
        return self._buffers.upsert_from(key, buffer_ptr, size, config)
    def batch_put_from(self, keys: list[str], buffer_ptrs: list[int], sizes: list[int],
                       config: Any = None) -> list[int]:
        return self._buffers.batch_put_from(keys, buffer_ptrs, sizes, config)
    @closed.code_each
    def batch_upsert_from(self, keys: list[str], buffer_ptrs: list[int], sizes: list[int],
                          config: Any = None) -> list[int]:
        return self._buffers.batch_upsert_from(keys, buffer_ptrs, sizes, config)
    def get_into(self, key: str, buffer_ptr: int, size: int) -> int:
        return self._buffers.get_into(key, buffer_ptr, size)
    def batch_get_into(self, keys: list[str], buffer_ptrs: list[int],
                       sizes: list[int]) -> list[int]:
        return self._buffers.batch_get_into(keys, buffer_ptrs, sizes)
    def get_into_ranges(self, buffer_ptrs: list[int], all_keys: list[list[str]],
                        all_dst_offsets: list[list[list[int]]],
                        all_src_offsets: list[list[list[int]]],
                        all_sizes: list[list[list[int]]]) -> list[list[list[int]]]:
        return self._buffers.get_into_ranges(buffer_ptrs, all_keys, all_dst_offsets,
                                             all_src_offsets, all_sizes)

    # -- several buffers per object (buffers_api.py) -----------------------------------------------
    @closed.nothing
    def batch_put_from_multi_buffers(self, keys: list[str], all_buffer_ptrs: list[list[int]],
                                     all_sizes: list[list[int]], config: Any = None) -> list[int]:
        return self._multi.batch_put_from_multi_buffers(keys, all_buffer_ptrs, all_sizes, config)
    def batch_get_into_multi_buffers(self, keys: list[str], all_buffer_ptrs: list[list[int]],
                                     all_sizes: list[list[int]],
                                     prefer_alloc_in_same_node: bool = False) -> list[int]:
        return self._multi.batch_get_into_multi_buffers(keys, all_buffer_ptrs, all_sizes,
                                                        prefer_alloc_in_same_node)
    @closed.code
    def put_from_with_metadata(self, key: str, buffer_ptr: int, metadata_buffer_ptr: int,
                               size: int, metadata_size: int, config: Any = None) -> int:
        return self._multi.put_from_with_metadata(key, buffer_ptr, metadata_buffer_ptr, size,
                                                  metadata_size, config)

    # -- sessions (sessions.py) --------------------------------------------------------------------
    @closed.nothing
    def batch_put_session_start(self, keys: list[str], sizes: list[int],
                                config: Any = None) -> list[int]:
        return self._sessions.batch_put_session_start(keys, sizes, config)
    @closed.nothing
    def batch_put_from_multi_buffer_ranges(self, keys: list[str], all_buffer_ptrs: list[list[int]],
                                           all_sizes: list[list[int]],
                                           all_dst_offsets: list[list[int]]) -> list[int]:
        return self._sessions.batch_put_from_multi_buffer_ranges(keys, all_buffer_ptrs, all_sizes,
                                                                 all_dst_offsets)
    @closed.nothing
    def batch_put_session_end(self, keys: list[str]) -> list[int]:
        return self._sessions.batch_put_session_end(keys)
    @closed.nothing
    def batch_put_session_revoke(self, keys: list[str]) -> list[int]:
        return self._sessions.batch_put_session_revoke(keys)
    @closed.nothing
    def batch_get_session_start(self, keys: list[str]) -> list[int]:
        return self._sessions.batch_get_session_start(keys)
    @closed.nothing
    def batch_get_into_multi_buffer_ranges(self, keys: list[str], all_buffer_ptrs: list[list[int]],
                                           all_sizes: list[list[int]],
                                           all_src_offsets: list[list[int]]) -> list[int]:
        return self._sessions.batch_get_into_multi_buffer_ranges(keys, all_buffer_ptrs, all_sizes,
                                                                 all_src_offsets)
    @closed.minus_one
    def batch_get_session_end(self, keys: list[str]) -> int:
        return self._sessions.batch_get_session_end(keys)

    # -- replica tasks (tasks.py) ------------------------------------------------------------------
    def create_copy_task(self, key: str, targets: list[str]) -> tuple[tuple[int, int], int]:
        return self._tasks.create_copy_task(key, targets)
    def create_move_task(self, key: str, source: str, target: str) -> tuple[tuple[int, int], int]:
        return self._tasks.create_move_task(key, source, target)
    def query_task(self, task_id: tuple[int, int]) -> tuple[QueryTaskResponse | None, int]:
        return self._tasks.query_task(task_id)

    # -- tensors (tensor_api.py) -------------------------------------------------------------------
    @closed.code
    def put_tensor(self, key: str, tensor: Any) -> int:
        return self._tensors.put_tensor(key, tensor)
    @closed.code
    def upsert_tensor(self, key: str, tensor: Any) -> int:
        return self._tensors.upsert_tensor(key, tensor)
    @closed.code
    def pub_tensor(self, key: str, tensor: Any, config: Any = None) -> int:
        return self._tensors.pub_tensor(key, tensor, config)
    @closed.code
    def upsert_pub_tensor(self, key: str, tensor: Any, config: Any = None) -> int:
        return self._tensors.upsert_pub_tensor(key, tensor, config)
    @closed.code_each
    def batch_put_tensor(self, keys: list[str], tensors_list: list[Any]) -> list[int]:
        return self._tensors.batch_put_tensor(keys, tensors_list)
    @closed.code_each
    def batch_upsert_tensor(self, keys: list[str], tensors_list: list[Any]) -> list[int]:
        return self._tensors.batch_upsert_tensor(keys, tensors_list)
    @closed.code_each
    def batch_pub_tensor(self, keys: list[str], tensors_list: list[Any],
                         config: Any = None) -> list[int]:
        return self._tensors.batch_pub_tensor(keys, tensors_list, config)
    def batch_get_tensor(self, keys: list[str]) -> list[Any]:
        return self._tensors.batch_get_tensor(keys)
    def get_tensor(self, key: str) -> Any:
        return self._tensors.get_tensor(key)
    @closed.code_each
    def batch_put_tensor_with_tp(self, base_keys: list[str], tensors_list: list[Any],
                                 tp_rank: int = 0, tp_size: int = 1,
                                 split_dim: int = 0) -> list[int]:
        return self._tensors.batch_put_tensor_with_tp(base_keys, tensors_list, tp_rank, tp_size,
                                                      split_dim)
    @closed.code
    def put_tensor_with_tp(self, key: str, tensor: Any, tp_rank: int = 0, tp_size: int = 1,
                           split_dim: int = 0) -> int:
        return self._tensors.put_tensor_with_tp(key, tensor, tp_rank, tp_size, split_dim)
    def batch_get_tensor_with_tp(self, base_keys: list[str], tp_rank: int = 0,
                                 tp_size: int = 1) -> list[Any]:
        return self._tensors.batch_get_tensor_with_tp(base_keys, tp_rank, tp_size)
    def get_tensor_with_tp(self, key: str, tp_rank: int = 0, tp_size: int = 1,
                           split_dim: int = 0) -> Any:
        return self._tensors.get_tensor_with_tp(key, tp_rank, tp_size, split_dim)

    # -- tensors in caller buffers (tensor_buffers.py) ---------------------------------------------
    @closed.code_each
    def batch_get_tensor_into(self, keys: list[str], buffer_ptrs: list[int],
                              sizes: list[int]) -> list[Any]:
        return self._tensor_buffers.batch_get_tensor_into(keys, buffer_ptrs, sizes)
    def get_tensor_into(self, key: str, buffer_ptr: int, size: int) -> Any:
        return self._tensor_buffers.get_tensor_into(key, buffer_ptr, size)
    def put_tensor_from(self, key: str, buffer_ptr: int, size: int) -> int:
        return self._tensor_buffers.put_tensor_from(key, buffer_ptr, size)
    def batch_put_tensor_from(self, keys: list[str], buffer_ptrs: list[int],
                              sizes: list[int]) -> list[int]:
        return self._tensor_buffers.batch_put_tensor_from(keys, buffer_ptrs, sizes)
    def upsert_tensor_from(self, key: str, buffer_ptr: int, size: int) -> int:
        return self._tensor_buffers.upsert_tensor_from(key, buffer_ptr, size)
    def batch_upsert_tensor_from(self, keys: list[str], buffer_ptrs: list[int],
                                 sizes: list[int]) -> list[int]:
        return self._tensor_buffers.batch_upsert_tensor_from(keys, buffer_ptrs, sizes)
    def batch_put_tensor_with_tp_from(self, base_keys: list[str], buffer_ptrs: list[int],
                                      sizes: list[int], tp_rank: int = 0, tp_size: int = 1,
                                      split_dim: int = 0) -> list[int]:
        return self._tensor_buffers.batch_put_tensor_with_tp_from(base_keys, buffer_ptrs, sizes,
                                                                  tp_rank, tp_size, split_dim)
    def put_tensor_with_tp_from(self, key: str, buffer_ptr: int, size: int, tp_rank: int = 0,
                                tp_size: int = 1, split_dim: int = 0) -> int:
        return self._tensor_buffers.put_tensor_with_tp_from(key, buffer_ptr, size, tp_rank,
                                                            tp_size, split_dim)
    def batch_get_tensor_with_tp_into(self, base_keys: list[str], buffer_ptrs: list[int],
                                      sizes: list[int], tp_rank: int = 0,
                                      tp_size: int = 1) -> list[Any]:
        return self._tensor_buffers.batch_get_tensor_with_tp_into(base_keys, buffer_ptrs, sizes,
                                                                  tp_rank, tp_size)
    def get_tensor_with_tp_into(self, key: str, buffer_ptr: int, size: int, tp_rank: int = 0,
                                tp_size: int = 1, split_dim: int = 0) -> Any:
        return self._tensor_buffers.get_tensor_with_tp_into(key, buffer_ptr, size, tp_rank,
                                                            tp_size, split_dim)
    @closed.code_each
    def batch_pub_tensor_with_tp(self, base_keys: list[str], tensors_list: list[Any],
                                 config: Any = None, tp_rank: int = 0, tp_size: int = 1,
                                 split_dim: int = 0) -> list[int]:
        return self._tensor_buffers.batch_pub_tensor_with_tp(base_keys, tensors_list, config,
                                                             tp_rank, tp_size, split_dim)
    @closed.code
    def pub_tensor_with_tp(self, key: str, tensor: Any, config: Any = None, tp_rank: int = 0,
                           tp_size: int = 1, split_dim: int = 0) -> int:
        return self._tensor_buffers.pub_tensor_with_tp(key, tensor, config, tp_rank, tp_size,
                                                       split_dim)
    @closed.code_each
    def batch_upsert_pub_tensor(self, keys: list[str], tensors_list: list[Any],
                                config: Any = None) -> list[int]:
        return self._tensor_buffers.batch_upsert_pub_tensor(keys, tensors_list, config)

    # -- safetensors files (safetensors_api.py) ----------------------------------------------------
    @closed.code
    def save_tensor_to_safetensor(self, key: str, file_name: str | None = None) -> int:
        return self._files.save_tensor_to_safetensor(key, file_name)
    def load_tensor_from_safetensor(self, key: str | None = None,
                                    file_name: str | None = None) -> Any:
        return self._files.load_tensor_from_safetensor(key, file_name)

