"""Paged attention: each sequence attends over its own KV blocks, never a padded batch.

The pool of one layer is [num_blocks, kv_heads, block_size, head_dim]. For a sequence we take
its blocks (one index_select of exactly its blocks, as [kv_heads, blocks * block_size, d]) and
run torch's SDPA; decode (one query) needs no mask, a prefill chunk a causal one over its own
[n, ctx] only. On CUDA with flash-attn installed, decode batches call `flash_attn_with_kvcache`
on the block tables instead (written for GPUs; not run on this project's CPU-only CI).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mooncake_cli.engine.batch import SeqSlice, StepBatch


def attend(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
           batch: StepBatch) -> torch.Tensor:
    """q: [T, heads, d] (rotated) -> [T, heads, d]; k/v_pool: one layer's pool."""
    if q.is_cuda and batch.decode_only and _flash is not None:
        return _flash_decode(q, k_pool, v_pool, batch)
    kt, vt = k_pool.transpose(0, 1), v_pool.transpose(0, 1)  # [kv_heads, num_blocks, bs, d]
    gqa = q.shape[1] != k_pool.shape[1]
    out = torch.empty_like(q)
    for s in batch.seqs:
        out[s.start:s.start + s.n] = _one(q[s.start:s.start + s.n], kt, vt, s, batch.window, gqa)
    return out


def _one(q: torch.Tensor, kt: torch.Tensor, vt: torch.Tensor, s: SeqSlice, window: int | None,
         gqa: bool) -> torch.Tensor:
    heads, d = kt.shape[0], kt.shape[-1]
    if len(s.block_list) == 1:
        b = s.block_list[0]
        keys, values = kt[:, b, :s.ctx], vt[:, b, :s.ctx]
    else:
        keys = kt.index_select(1, s.blocks).view(heads, -1, d)[:, :s.ctx]
        values = vt.index_select(1, s.blocks).view(heads, -1, d)[:, :s.ctx]
    first = s.ctx - s.n  # position of the first new token
    lo = 0
    if window is not None:
        lo = max(0, first - window + 1)
        keys, values = keys[:, lo:], values[:, lo:]
    query = q.transpose(0, 1)[None]  # [1, heads, n, d]
    mask = None
    if s.n > 1 or (window is not None and s.ctx - lo > window):
        qpos = torch.arange(first, s.ctx, device=q.device)[:, None]
        kpos = torch.arange(lo, s.ctx, device=q.device)[None, :]
        mask = kpos <= qpos
        if window is not None:
            mask &= kpos > qpos - window
    out = F.scaled_dot_product_attention(query, keys[None], values[None], attn_mask=mask,
                                         enable_gqa=gqa)
    return out[0].transpose(0, 1)


try:  # the paged CUDA kernel, where flash-attn is installed
    from flash_attn import flash_attn_with_kvcache as _flash
except ImportError:  # pragma: no cover - depends on the host
    _flash = None


def _flash_decode(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                  batch: StepBatch) -> torch.Tensor:  # pragma: no cover - needs a GPU
    width = max(len(s.block_list) for s in batch.seqs)
    table = torch.zeros((len(batch.seqs), width), dtype=torch.int32, device=q.device)
    for i, s in enumerate(batch.seqs):
        table[i, :len(s.block_list)] = s.blocks
    lens = torch.tensor([s.ctx for s in batch.seqs], dtype=torch.int32, device=q.device)
    window = (batch.window - 1, 0) if batch.window else (-1, -1)
    out = _flash(q[:, None], k_pool.transpose(1, 2), v_pool.transpose(1, 2),
                 cache_seqlens=lens, block_table=table, causal=True, window_size=window)
    return out[:, 0]
