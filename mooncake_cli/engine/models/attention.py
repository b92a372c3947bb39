"""Paged attention over the block pool, never a padded batch or a dense [B, q, k] mask.

The pool of one layer is [num_blocks, kv_heads, block_size, head_dim].

- Decode (one query per sequence): the blocks every sequence attends to are taken once, and
  attention runs block by block for all sequences together (one batched matmul for the scores,
  a softmax across each sequence's blocks, one for the values), so a step costs a fixed number
  of kernels whatever the batch, and work proportional to the keys actually attended.
- Prefill chunks: per sequence, its own blocks (one index_select) through torch's SDPA with a
  causal mask over its own [n, ctx] only.
- On CUDA with flash-attn installed and blocks of a multiple of 256 tokens (its paged-KV
  requirement), decode calls `flash_attn_with_kvcache` on the block tables (written for GPUs;
  not run on this project's CPU-only CI); otherwise the block path above runs on CUDA as well.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mooncake_cli.engine.batch import DecodeBlocks, SeqSlice, StepBatch


def attend(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
           batch: StepBatch) -> torch.Tensor:
    """q: [T, heads, d] (rotated) -> [T, heads, d]; k/v_pool: one layer's pool."""
    if batch.decode is not None:
        if q.is_cuda and _flash is not None and k_pool.shape[2] % 256 == 0:
            return _flash_decode(q, k_pool, v_pool, batch)
        return _decode(q, k_pool, v_pool, batch.decode)
    kt, vt = k_pool.transpose(0, 1), v_pool.transpose(0, 1)  # [kv_heads, num_blocks, bs, d]
    gqa = q.shape[1] != k_pool.shape[1]
    out = torch.empty_like(q)
    for s in batch.seqs:
        out[s.start:s.start + s.n] = _one(q[s.start:s.start + s.n], kt, vt, s, batch.window, gqa)
    return out


def _decode(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
            d: DecodeBlocks) -> torch.Tensor:
    b, heads, dim = q.shape
    kv = k_pool.shape[1]
    g = heads // kv
    keys = k_pool.index_select(0, d.blocks)  # [J, kv, bs, dim]
    values = v_pool.index_select(0, d.blocks)
    qb = q.view(b, kv, g, dim).index_select(0, d.seq)  # [J, kv, g, dim]
    scores = torch.matmul(qb, keys.transpose(-1, -2)).float() * dim ** -0.5  # [J, kv, g, bs]
    scores.masked_fill_(~d.valid[:, None, None, :], float("-inf"))
    block_max = scores.amax(-1)  # [J, kv, g]
    seq_max = block_max.new_full((b, kv, g), float("-inf"))
    seq_max = seq_max.scatter_reduce(0, d.seq[:, None, None].expand_as(block_max), block_max,
                                     "amax")
    e = torch.exp(scores - seq_max.index_select(0, d.seq)[..., None])
    denom = e.new_zeros((b, kv, g)).index_add_(0, d.seq, e.sum(-1))
    out = torch.matmul(e.to(values.dtype), values)  # [J, kv, g, dim]
    total = out.new_zeros((b, kv, g, dim)).index_add_(0, d.seq, out)
    return (total / denom[..., None].to(total.dtype)).view(b, heads, dim)


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
    if first == 0 and s.n > 1 and (window is None or s.ctx <= window):
        # a whole prompt in one chunk: plain causal attention, which SDPA runs without a mask
        return F.scaled_dot_product_attention(query, keys[None], values[None], is_causal=True,
                                              enable_gqa=gqa)[0].transpose(0, 1)
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
