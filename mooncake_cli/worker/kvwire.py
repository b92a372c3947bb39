"""KVWire: the form a worker's KV blocks take on the wire and in the store (`--kv-wire`).

native moves the cache's own bytes. int8 (mooncake_cli/engine/kv_int8.py) moves each block
quantized: store objects are int8 objects under the keys of the int8 namespace
(`kvkeys.wire_namespace`), and a prefill streams int8 objects into the first bytes of the
decode worker's reserved blocks (a block loaded from the store goes as the object it was read
from, not quantized again), which the decode worker dequantizes in place before the request's
first step (the WRITEs are done by then: the prefill waits for them before it
answers). Both ends of a stream must use the same wire; the reservation answers the decode
side's, and the prefill refuses a mismatch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch

from mooncake_cli.engine import KVCache
from mooncake_cli.engine.kv_int8 import dequantize, quantize
from mooncake_cli.kvkeys import KVNamespace, wire_namespace
from mooncake_cli.transfer.engine import TransferEngine
from mooncake_cli.transfer.segment import Region


class KVWire:
    """The wire `name` of one worker's cache."""

    def __init__(self, name: str, cache: KVCache) -> None:
        self.ns: KVNamespace = wire_namespace(cache.ns, name)  # of keys and store objects
        self.int8 = name == "int8"
        self.name: Literal["native", "int8"] = "int8" if self.int8 else "native"
        self.cache = cache
        self.shape = cache.ns.block_shape
        self.object_bytes = self.ns.block_bytes  # of one block on the wire and in the store
        if self.int8 and self.object_bytes > cache.block_bytes:
            raise ValueError(f"an int8 block ({self.object_bytes} bytes) is larger than the "
                             f"cache's ({cache.block_bytes}): use --kv-wire native")
        self.staging: torch.Tensor | None = None  # the prefill's int8 objects, by pool block
        self.region: Region | None = None
        self._read: dict[int, torch.Tensor] = {}  # pool block -> the object it was loaded from

    def register(self, engine: TransferEngine) -> None:
        """Register the staging area a prefill streams int8 objects from (one per pool block)."""
        if self.int8:
            self.staging = torch.empty((self.cache.num_blocks, self.object_bytes),
                                       dtype=torch.uint8, device=self.cache.pool.device)
            self.region = engine.register(self.staging, guarded=True)

    def keep(self, block: int, obj: torch.Tensor) -> None:
        """Remember that pool `block` was loaded from store object `obj` (a prefill streams
        that object instead of quantizing the block again) until `forget`."""
        if self.staging is not None:
            self._read[block] = obj

    def forget(self) -> None:
        """Drop what `keep` remembered: the request that loaded those blocks is done."""
        self._read.clear()

    def stage(self, blocks: Sequence[int]) -> None:
        """Put the int8 objects of pool `blocks` into their staging slots (int8 only)."""
        assert self.staging is not None, "register() first"
        todo = []
        for b in blocks:
            obj = self._read.pop(b, None)
            if obj is None:
                todo.append(b)
            else:
                self.staging[b].copy_(obj)
        if todo:
            idx = torch.tensor(todo, dtype=torch.long, device=self.staging.device)
            self.staging[idx] = quantize(self.cache.pool[idx], self.shape)

    def encode(self, data: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Store objects of host copies of blocks: the blocks themselves for native."""
        if not self.int8 or not data:
            return list(data)
        return list(quantize(torch.stack(list(data)), self.shape).unbind(0))

    def decode_into(self, obj: torch.Tensor, block: torch.Tensor) -> None:
        """Write the block of store object `obj` into the cache block `block`."""
        block.copy_(dequantize(obj, self.shape, block.dtype)[0])

    def landed(self, blocks: Sequence[int]) -> None:
        """Dequantize, in place, the int8 objects a prefill wrote into the first bytes of pool
        `blocks` (nothing for native)."""
        if not self.int8 or not blocks:
            return
        pool = self.cache.pool
        raw = pool.view(pool.shape[0], -1).view(torch.uint8)
        idx = torch.tensor(list(blocks), dtype=torch.long, device=pool.device)
        pool[idx] = dequantize(raw[idx, :self.object_bytes], self.shape, pool.dtype)

