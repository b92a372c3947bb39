"""The paged KV cache: one pool tensor of blocks, a free-block allocator, block export/import.

The pool is [num_blocks, layers, 2, kv_heads, block_size, head_dim] (see mooncake_cli.kvkeys):
`pool[b]` is one contiguous block in the store object layout, so a store client can read an
object straight into it (`StoreClient.get_into(key, cache.block(b))`) and put it from there.
A pipeline stage's cache holds only its layers [lo, hi): `pool[b]` is then the contiguous
slice of the store object that starts `lo * layer_bytes` into it (see engine/stages.py).
"""

from __future__ import annotations

from typing import Any

import torch

from mooncake_cli.engine.errors import CacheFull
from mooncake_cli.kvkeys import KVNamespace

DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


class BlockAllocator:
    """Free block ids; lowest ids first so a fresh cache fills from the start."""

    def __init__(self, num_blocks: int) -> None:
        self._free = list(range(num_blocks - 1, -1, -1))
        self.num_blocks = num_blocks

    @property
    def free(self) -> int:
        return len(self._free)

    def allocate(self, n: int) -> list[int]:
        if n > len(self._free):
            raise CacheFull(f"KV cache full: need {n} blocks, {len(self._free)} of "
                            f"{self.num_blocks} free")
        return [self._free.pop() for _ in range(n)]

    def release(self, blocks: list[int]) -> None:
        self._free.extend(reversed(blocks))


class KVCache:
    """A pool of KV blocks for one model on one device, and its allocator; with `layers`,
    of those layers only (a pipeline stage's)."""

    def __init__(self, ns: KVNamespace, num_blocks: int,
                 device: torch.device | str = "cpu", layers: range | None = None) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self.layers = range(ns.layers) if layers is None else layers
        if not self.layers or self.layers.step != 1 or not (
                0 <= self.layers.start < self.layers.stop <= ns.layers):
            raise ValueError(f"layers {self.layers} is not a range of the model's {ns.layers}")
        dtype = {v: k for k, v in DTYPE_NAMES.items()}[ns.dtype]
        self.ns = ns
        self.block_size = ns.block_size
        shape = (num_blocks, len(self.layers), *ns.block_shape[1:])
        self.pool = torch.zeros(shape, dtype=dtype, device=device)
        self.allocator = BlockAllocator(num_blocks)
        self.layer_bytes = ns.block_bytes // ns.layers  # one layer's K and V of one block
        self.block_bytes = self.layer_bytes * len(self.layers)  # of one pool block

    @property
    def num_blocks(self) -> int:
        return self.pool.shape[0]

    def layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(K, V) of layer i over all blocks: [num_blocks, kv_heads, block_size, head_dim] views."""
        if i not in self.layers:
            raise IndexError(f"layer {i} is not in this cache's {self.layers}")
        j = i - self.layers.start
        return self.pool[:, j, 0], self.pool[:, j, 1]

    def block(self, b: int) -> torch.Tensor:
        """Block b in the store object layout, a contiguous view (writes land in the cache)."""
        return self.pool[b]

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def ensure(self, table: list[int], num_tokens: int) -> None:
        """Grow the block table `table` in place until it covers `num_tokens` tokens."""
        need = self.blocks_for(num_tokens) - len(table)
        if need > 0:
            table.extend(self.allocator.allocate(need))

    def release(self, table: list[int]) -> None:
        self.allocator.release(table)
        table.clear()

    def export_block(self, b: int) -> torch.Tensor:
        """A copy of block b, detached from the cache (for an asynchronous put)."""
        return self.pool[b].clone()

    def import_block(self, b: int, data: Any) -> None:
        """Write one store object (tensor, bytes, bytearray, numpy array) into block b."""
        dst = self.pool[b]
        if isinstance(data, torch.Tensor):
            src = data
        else:
            src = torch.frombuffer(bytearray(data) if isinstance(data, bytes) else data,
                                   dtype=torch.uint8)
        if src.dtype == torch.uint8 and dst.dtype != torch.uint8:
            if src.numel() != self.block_bytes:
                raise ValueError(f"block object is {src.numel()} bytes, expected "
                                 f"{self.block_bytes} for {self.ns.tag()}")
            src = src.view(dst.dtype)
        if src.numel() != dst.numel():
            raise ValueError(f"block has {src.numel()} elements, expected {dst.numel()}")
        dst.copy_(src.reshape(dst.shape))
