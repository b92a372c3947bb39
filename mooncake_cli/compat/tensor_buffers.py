"""The compat store's tensors in caller buffers (upstream's get_tensor_into,
put_tensor_from, their batch, upsert and tensor-parallel forms) and the publishing forms
with a ReplicateConfig (pub_tensor_with_tp, batch_pub_tensor_with_tp, batch_upsert_pub_tensor).

A buffer holds a tensor as the store does: upstream's 304-byte header, then its bytes. A get
reads the object into the caller's buffer and returns a tensor over that memory (no copy), or
None (missing, the buffer too small, not a tensor); a put of a buffer that is not exactly one
tensor is -600, as upstream's (in a batch: the whole batch)."""

from __future__ import annotations

from typing import Any

from mooncake_cli.compat import ranges, tensors
from mooncake_cli.compat.codes import BAD, put_code
from mooncake_cli.compat.connection import Connection
from mooncake_cli.compat.tensor_api import Tensors
from mooncake_cli.store.errors import StoreError


def _view(ptr: int, size: int) -> memoryview | None:
    try:
        return ranges.view(ptr, size)
    except StoreError:
        return None


def _tensor_in(view: memoryview | None) -> Any:
    """The tensor `view` holds exactly (header and bytes, nothing after); None otherwise."""
    if view is None:
        return None
    try:
        t = tensors.from_bytes(view)
    except tensors.TensorError:
        return None
    return t if tensors.HEADER + t.numel() * t.element_size() == len(view) else None


class TensorBuffers:
    """Tensors read into and put from caller buffers, and the publishing forms (`tensors`')."""

    def __init__(self, conn: Connection, tensors: Tensors) -> None:
        self._conn, self._tensors = conn, tensors

    def batch_get_tensor_into(self, keys: list[str], buffer_ptrs: list[int],
                              sizes: list[int]) -> list[Any]:
        if not len(keys) == len(buffer_ptrs) == len(sizes):
            return [None] * len(keys)
        views = [_view(p, n) for p, n in zip(buffer_ptrs, sizes, strict=True)]
        wanted = [(i, v) for i, v in enumerate(views) if v is not None]
        got = self._conn.run(lambda c: list(c.batch_get_into([keys[i] for i, _ in wanted],
                                                        [v for _, v in wanted])),
                        lambda e: [e] * len(wanted)) if wanted else []
        out: list[Any] = [None] * len(keys)
        for (i, view), n in zip(wanted, got, strict=True):
            if type(n) is int and n > 0:
                out[i] = _tensor_in(view[:n])
        return out

    def get_tensor_into(self, key: str, buffer_ptr: int, size: int) -> Any:
        return self.batch_get_tensor_into([key], [buffer_ptr], [size])[0]

    def _put_from(self, keys: list[str], ptrs: list[int], sizes: list[int],
                  upsert: bool) -> list[int]:
        if not len(keys) == len(ptrs) == len(sizes):
            return [BAD] * len(keys)
        views = [_view(p, n) for p, n in zip(ptrs, sizes, strict=True)]
        if not keys or any(_tensor_in(v) is None for v in views):
            return [BAD] * len(keys)  # upstream: one buffer that is no tensor fails the batch
        return self._conn.run(lambda c: [put_code(e) for e in c.batch_put(keys, views, None,
                                                                          upsert)],
                              lambda e: [e] * len(keys))

    def put_tensor_from(self, key: str, buffer_ptr: int, size: int) -> int:
        return self._put_from([key], [buffer_ptr], [size], False)[0]

    def batch_put_tensor_from(self, keys: list[str], buffer_ptrs: list[int],
                              sizes: list[int]) -> list[int]:
        return self._put_from(keys, buffer_ptrs, sizes, False)

    def upsert_tensor_from(self, key: str, buffer_ptr: int, size: int) -> int:
        return self._put_from([key], [buffer_ptr], [size], True)[0]

    def batch_upsert_tensor_from(self, keys: list[str], buffer_ptrs: list[int],
                                 sizes: list[int]) -> list[int]:
        return self._put_from(keys, buffer_ptrs, sizes, True)

    # -- tensor parallelism ----------------------------------------------------------------------
    def batch_put_tensor_with_tp_from(self, base_keys: list[str], buffer_ptrs: list[int],
                                      sizes: list[int], tp_rank: int = 0, tp_size: int = 1,
                                      split_dim: int = 0) -> list[int]:
        """The whole tensor in each buffer, split and stored as every rank's shard."""
        if not len(base_keys) == len(buffer_ptrs) == len(sizes):
            return [BAD] * len(base_keys)
        found = [_tensor_in(_view(p, n)) for p, n in zip(buffer_ptrs, sizes, strict=True)]
        ok = [i for i, t in enumerate(found) if t is not None]
        out = [BAD] * len(base_keys)
        codes = self._tensors.put_tp([base_keys[i] for i in ok], [found[i] for i in ok], None,
                                     tp_size, split_dim) if ok else []
        for i, rc in zip(ok, codes, strict=True):
            out[i] = rc
        return out

    def put_tensor_with_tp_from(self, key: str, buffer_ptr: int, size: int, tp_rank: int = 0,
                                tp_size: int = 1, split_dim: int = 0) -> int:
        return self.batch_put_tensor_with_tp_from([key], [buffer_ptr], [size], tp_rank, tp_size,
                                             split_dim)[0]

    def batch_get_tensor_with_tp_into(self, base_keys: list[str], buffer_ptrs: list[int],
                                      sizes: list[int], tp_rank: int = 0,
                                      tp_size: int = 1) -> list[Any]:
        keys = base_keys if tp_size <= 1 else [tensors.shard_key(k, tp_rank) for k in base_keys]
        return self.batch_get_tensor_into(keys, buffer_ptrs, sizes)

    def get_tensor_with_tp_into(self, key: str, buffer_ptr: int, size: int, tp_rank: int = 0,
                                tp_size: int = 1, split_dim: int = 0) -> Any:
        return self.batch_get_tensor_with_tp_into([key], [buffer_ptr], [size], tp_rank,
                                             tp_size)[0]

    def batch_pub_tensor_with_tp(self, base_keys: list[str], tensors_list: list[Any],
                                 config: Any = None, tp_rank: int = 0, tp_size: int = 1,
                                 split_dim: int = 0) -> list[int]:
        return self._tensors.put_tp(base_keys, tensors_list, config, tp_size, split_dim)

    def pub_tensor_with_tp(self, key: str, tensor: Any, config: Any = None, tp_rank: int = 0,
                           tp_size: int = 1, split_dim: int = 0) -> int:
        return self._tensors.put_tp([key], [tensor], config, tp_size, split_dim)[0]

    def batch_upsert_pub_tensor(self, keys: list[str], tensors_list: list[Any],
                                config: Any = None) -> list[int]:
        return self._tensors.put_tensors(keys, tensors_list, config, True)
