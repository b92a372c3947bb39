"""int8 KV blocks: asymmetric quantization per (layer, K/V, head) of one block, as the seeds do it.

A block [layers, 2, kv_heads, block_size, head_dim] becomes one flat byte object:

    q     uint8   [layers, 2, kv_heads, block_size, head_dim]   round((x - lo) / scale)
    scale float32 [layers, 2, kv_heads]                         (hi - lo) / 255
    lo    float32 [layers, 2, kv_heads]                         the zero point: the group's min

and back: x' = q * scale + lo, in the reader's dtype. Per element |x - x'| <= scale / 2 (plus
the rounding of the reader's dtype), scale being the (max - min) / 255 of that element's group
of block_size * head_dim values. A group of equal values has scale 0 and comes back exactly.
"""

from __future__ import annotations

import math

import torch

LEVELS = 255


def wire_bytes(shape: tuple[int, ...]) -> int:
    """Bytes of the int8 object of one block of `shape` [layers, 2, kv_heads, bs, head_dim]."""
    groups = math.prod(shape[:3])
    return math.prod(shape) + groups * 8


def quantize(blocks: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """The int8 objects [n, wire_bytes] (uint8) of `blocks`, n blocks of `shape` (any leading
    dims, or one block)."""
    groups, size = math.prod(shape[:3]), math.prod(shape)
    x = blocks.reshape(-1, groups, size // groups).to(torch.float32)
    lo = x.amin(dim=2)
    scale = (x.amax(dim=2) - lo) / LEVELS
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = ((x - lo[..., None]) / safe[..., None]).round_().clamp_(0, LEVELS).to(torch.uint8)
    return torch.cat([q.reshape(len(x), size), scale.view(torch.uint8), lo.view(torch.uint8)],
                     dim=1)


def dequantize(objects: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """The blocks [n, *shape] in `dtype` of n int8 objects (uint8, [n, >= wire_bytes] or one
    object's bytes); bytes past wire_bytes are ignored."""
    groups, size = math.prod(shape[:3]), math.prod(shape)
    wire = wire_bytes(shape)
    objs = objects.reshape(1, -1) if objects.dim() == 1 else objects
    if objs.dtype != torch.uint8 or objs.shape[1] < wire:
        raise ValueError(f"an int8 KV object of a {list(shape)} block is {wire} bytes (uint8); "
                         f"got {objs.shape[1]} ({objs.dtype})")
    q = objs[:, :size].reshape(-1, groups, size // groups).to(torch.float32)
    scale = objs[:, size:size + groups * 4].contiguous().view(torch.float32)
    lo = objs[:, size + groups * 4:wire].contiguous().view(torch.float32)
    return (q * scale[..., None] + lo[..., None]).to(dtype).reshape(-1, *shape)


def error_bound(block: torch.Tensor) -> torch.Tensor:
    """The bound on |x - x'| of each element of `block`: scale / 2 of its group (broadcast)."""
    shape = tuple(block.shape)
    x = block.reshape(math.prod(shape[:3]), -1).to(torch.float32)
    half = (x.amax(dim=1) - x.amin(dim=1)) / LEVELS / 2
    return half[:, None].expand_as(x).reshape(shape)
