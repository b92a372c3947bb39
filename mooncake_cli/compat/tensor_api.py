"""The compat store's tensors (upstream's put_tensor / get_tensor family): CPU tensors (a CUDA
tensor is copied to the host; gets return CPU tensors), upstream's serialisation (tensors.py),
tensor-parallel shards as `{key}_tp_{rank}`. A failed get gives None, a failed put its negative
code; a put of a key that exists is 0."""

from __future__ import annotations

from typing import Any

import numpy as np

from mooncake_cli.compat import tensors
from mooncake_cli.compat.codes import put_code
from mooncake_cli.compat.connection import Client, Connection
from mooncake_cli.compat.types import native
from mooncake_cli.store.client.values import Gathered
from mooncake_cli.store.errors import StoreCode, StoreError

BAD, NO_HANDLE = int(StoreCode.INVALID_PARAMS), int(StoreCode.NO_AVAILABLE_HANDLE)


def uninitialised(n: int) -> Any:
    """A buffer of `n` bytes that is not zero-filled first (a get overwrites all of it)."""
    return np.empty(n, np.uint8)


class Tensors:
    """Tensors as objects (upstream's header, then the bytes), over `conn`'s client."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn

    def _put(self, keys: list[str], parts: list[tuple[Any, Any, Any]], config: Any,
             upsert: bool) -> list[int]:
        """Put host tensors (with their TP `whole` and `axis`): each stored as its header followed
        by its bytes, copied once into the segment (Gathered) with no packed copy in between."""
        if self._conn.client is not None and self._conn.buffer == 0:  # upstream: no handle
            return [NO_HANDLE] * len(keys)
        values = [Gathered([tensors.header(t, whole, axis), t]) for t, whole, axis in parts]
        if len(keys) == 1:  # one key: a put's requests, lighter than a batch's of one
            return self._conn.run(
                lambda c: [self._conn.put_one(c, keys[0], values[0], config, upsert)],
                lambda e: [e])
        return self._conn.run(lambda c: [put_code(e) for e in c.batch_put(
            keys, values, native(config), upsert)], lambda e: [e] * len(keys))

    def put_tensors(self, keys: list[str], tensor_list: list[Any], config: Any = None,
                     upsert: bool = False) -> list[int]:
        if len(keys) != len(tensor_list):
            return [BAD] * len(keys)
        try:
            parts = [(tensors.host(t), None, None) for t in tensor_list]
        except tensors.TensorError:
            return [BAD] * len(keys)
        return self._put(keys, parts, config, upsert)

    def put_tensor(self, key: str, tensor: Any) -> int:
        return self.put_tensors([key], [tensor])[0]

    def upsert_tensor(self, key: str, tensor: Any) -> int:
        return self.put_tensors([key], [tensor], upsert=True)[0]

    def pub_tensor(self, key: str, tensor: Any, config: Any = None) -> int:
        return self.put_tensors([key], [tensor], config)[0]

    def upsert_pub_tensor(self, key: str, tensor: Any, config: Any = None) -> int:
        return self.put_tensors([key], [tensor], config, True)[0]

    def batch_put_tensor(self, keys: list[str], tensors_list: list[Any]) -> list[int]:
        return self.put_tensors(keys, tensors_list)

    def batch_upsert_tensor(self, keys: list[str], tensors_list: list[Any]) -> list[int]:
        return self.put_tensors(keys, tensors_list, upsert=True)

    def batch_pub_tensor(self, keys: list[str], tensors_list: list[Any],
                         config: Any = None) -> list[int]:
        return self.put_tensors(keys, tensors_list, config)

    def batch_get_tensor(self, keys: list[str]) -> list[Any]:
        if self._conn.client is not None and self._conn.buffer == 0:
            return [None] * len(keys)

        def load(c: Client) -> list[Any]:
            out = []
            for buf in c.batch_get_buffers(keys, uninitialised):
                try:
                    out.append(None if isinstance(buf, StoreError) else tensors.from_bytes(buf))
                except tensors.TensorError:
                    out.append(None)
            return out
        return self._conn.run(load, lambda e: [None] * len(keys))

    def get_tensor(self, key: str) -> Any:
        return self.batch_get_tensor([key])[0]

    def batch_put_tensor_with_tp(self, base_keys: list[str], tensors_list: list[Any],
                                 tp_rank: int = 0, tp_size: int = 1,
                                 split_dim: int = 0) -> list[int]:
        """Every shard of each tensor (all ranks, as upstream), one batch; per base key 0 when
        every shard is stored, else the first error."""
        return self.put_tp(base_keys, tensors_list, None, tp_size, split_dim)

    def put_tp(self, base_keys: list[str], tensors_list: list[Any], config: Any,
               tp_size: int, split_dim: int) -> list[int]:
        """batch_put_tensor_with_tp with a ReplicateConfig (the pub forms)."""
        if tp_size <= 1:
            return self.put_tensors(base_keys, tensors_list, config)
        if len(base_keys) != len(tensors_list):
            return [BAD] * len(base_keys)
        keys: list[str] = []
        blobs: list[tuple[Any, Any, Any]] = []
        out = [0] * len(base_keys)
        owner: list[int] = []
        for i, (key, t) in enumerate(zip(base_keys, tensors_list, strict=True)):
            try:
                shards = tensors.split(t, tp_size, split_dim)
            except tensors.TensorError:
                out[i] = BAD
                continue
            keys += [tensors.shard_key(key, r) for r in range(tp_size)]
            blobs += shards
            owner += [i] * tp_size
        for i, rc in zip(owner, self._put(keys, blobs, config, False) if keys else [], strict=True):
            out[i] = out[i] or rc
        return out

    def put_tensor_with_tp(self, key: str, tensor: Any, tp_rank: int = 0, tp_size: int = 1,
                           split_dim: int = 0) -> int:
        return self.batch_put_tensor_with_tp([key], [tensor], tp_rank, tp_size, split_dim)[0]

    def batch_get_tensor_with_tp(self, base_keys: list[str], tp_rank: int = 0,
                                 tp_size: int = 1) -> list[Any]:
        if tp_size <= 1:
            return self.batch_get_tensor(base_keys)
        return self.batch_get_tensor([tensors.shard_key(k, tp_rank) for k in base_keys])

    def get_tensor_with_tp(self, key: str, tp_rank: int = 0, tp_size: int = 1,
                           split_dim: int = 0) -> Any:
        """Rank `tp_rank`'s shard as put_tensor_with_tp stored it (`split_dim` is the split the
        shards were made with: not needed to read one)."""
        return self.batch_get_tensor_with_tp([key], tp_rank, tp_size)[0]
