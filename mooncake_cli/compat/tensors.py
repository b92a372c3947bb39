"""Upstream's tensor serialisation: a 304-byte header, then the tensor's bytes (C order).

    offset  field
    0       magic b"NOOM", u16 version 1, u16 header size 304
    8       u32 dtype (the code in DTYPES), u32 ndim (at most 8)
    16      u64 parallel flag (1: a shard made by *_with_tp)
    24      u64 data offset (304), u64 data bytes
    40      8 x i64 the whole tensor's shape (-1 past ndim)
    104     8 x i64 this object's shape (a shard's, under tensor parallelism)
    168     u64 axes; per axis u32 kind (1: TP), u32 0, u32 rank, u32 size, u32 split dim,
            u32 0, i64 the shard's length along the split dim; zeros to 304

Written from the bytes upstream 0.3.13's `put_tensor` / `put_tensor_with_tp` store (read back with
`get`), so either side reads what the other wrote. Tensor parallelism as upstream: the tensor is
cut into `tp_size` equal chunks along `split_dim` (its length must divide), stored as
`{key}_tp_{rank}`, each contiguous; `get_tensor_with_tp` reads rank's shard.
"""

from __future__ import annotations

import struct
from typing import Any

HEADER = 304
MAX_DIMS = 8
MAGIC = b"NOOM"
_FIXED = struct.Struct("<4sHHIIQQQ")
_DIMS = struct.Struct(f"<{MAX_DIMS}q")
_AXIS = struct.Struct("<QIIIIIIq")
DTYPE_NAMES = ("float32", "float64", "int8", "uint8", "int16", "uint16", "int32", "uint32",
               "int64", "uint64", "bool", "float16", "bfloat16", "float8_e4m3fn",
               "float8_e5m2")  # code = index


class TensorError(ValueError):
    """Not a tensor this format can hold, or bytes that are not one."""


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        raise TensorError("the tensor API needs torch (pip install 'torch==2.13.0')") from None
    return torch


def dtype_code(dtype: Any) -> int:
    name = str(dtype).removeprefix("torch.")
    if name not in DTYPE_NAMES:
        raise TensorError(f"unsupported tensor dtype {dtype}")
    return DTYPE_NAMES.index(name)


def _dims(shape: tuple[int, ...]) -> bytes:
    return _DIMS.pack(*shape, *([-1] * (MAX_DIMS - len(shape))))


def header(tensor: Any, whole: tuple[int, ...] | None = None,
           axis: tuple[int, int, int] | None = None) -> bytes:
    """The header of `tensor`; `whole` and `axis` (rank, size, split dim) for a TP shard."""
    shape = tuple(tensor.shape)
    if len(shape) > MAX_DIMS:
        raise TensorError(f"a tensor of {len(shape)} dimensions (at most {MAX_DIMS})")
    nbytes = tensor.numel() * tensor.element_size()
    head = _FIXED.pack(MAGIC, 1, HEADER, dtype_code(tensor.dtype), len(shape),
                       int(axis is not None), HEADER, nbytes)
    head += _dims(whole or shape) + _dims(shape)
    if axis is not None:
        rank, size, dim = axis
        head += _AXIS.pack(1, 1, 0, rank, size, dim, 0, shape[dim])
    return head.ljust(HEADER, b"\0")


def host(tensor: Any) -> Any:
    """`tensor` detached, on the host, contiguous; TensorError for a non-tensor."""
    torch = _torch()
    if not isinstance(tensor, torch.Tensor):
        raise TensorError(f"expected a torch.Tensor, not {type(tensor).__name__}")
    t = tensor.detach()
    return (t if t.device.type == "cpu" else t.cpu()).contiguous()


def from_bytes(buf: bytearray | memoryview | bytes) -> Any:
    """The tensor in `buf` (sharing a bytearray's memory); TensorError when it is not one."""
    torch = _torch()
    if len(buf) < HEADER:
        raise TensorError(f"{len(buf)} bytes hold no tensor header")
    magic, _, size, code, ndim, _, offset, nbytes = _FIXED.unpack_from(buf, 0)
    if magic != MAGIC or size != HEADER or ndim > MAX_DIMS or code >= len(DTYPE_NAMES) \
            or offset + nbytes > len(buf):
        raise TensorError("not a Mooncake tensor (bad header)")
    shape = _DIMS.unpack_from(buf, 104)[:ndim]
    dtype = getattr(torch, DTYPE_NAMES[code])
    if nbytes == 0:
        return torch.empty(shape, dtype=dtype)
    flat = torch.frombuffer(buf, dtype=torch.uint8, offset=offset, count=nbytes)
    return flat.view(dtype).reshape(shape)


def split(tensor: Any, tp_size: int, split_dim: int) -> list[Any]:
    """The `tp_size` shards of `tensor` along `split_dim` (host tensors, with their `whole` and
    `axis` for `header`); TensorError when the split is impossible (upstream:
    INVALID_PARAMS)."""
    torch = _torch()
    if not isinstance(tensor, torch.Tensor):
        raise TensorError(f"expected a torch.Tensor, not {type(tensor).__name__}")
    if tp_size < 1 or not 0 <= split_dim < tensor.dim():
        raise TensorError(f"cannot split a {tensor.dim()}-d tensor in {tp_size} on dim "
                          f"{split_dim}")
    if tensor.shape[split_dim] % tp_size:
        raise TensorError(f"dim {split_dim} of length {tensor.shape[split_dim]} does not split "
                          f"in {tp_size}")
    whole = tuple(tensor.shape)
    return [(host(part), whole, (rank, tp_size, split_dim))
            for rank, part in enumerate(torch.chunk(tensor, tp_size, split_dim))]


def shard_key(key: str, rank: int) -> str:
    return f"{key}_tp_{rank}"
