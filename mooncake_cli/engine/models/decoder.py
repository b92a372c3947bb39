"""The decoder layer every family here shares (RMSNorm, GQA attention with RoPE, SiLU-gated MLP),
over a paged KV cache: our own forward pass, no transformers at run time."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mooncake_cli.engine.batch import StepBatch
from mooncake_cli.engine.kvcache import KVCache
from mooncake_cli.engine.model_config import ModelConfig
from mooncake_cli.engine.models.attention import attend
from mooncake_cli.engine.rope import Rope
from mooncake_cli.engine.weights import LayerWeights, Weights


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


class Transformer:
    """Decoder weights + RoPE; `forward` writes the step's K/V into the cache and attends."""

    def __init__(self, cfg: ModelConfig, weights: Weights, device: torch.device,
                 dtype: torch.dtype) -> None:
        self.cfg = cfg
        self.w = weights
        self.device = device
        self.dtype = dtype
        self.rope = Rope(cfg, device)

    @torch.inference_mode()
    def forward(self, batch: StepBatch, cache: KVCache) -> torch.Tensor:
        """Logits [B, vocab] (float32) of each sequence's last new token."""
        x = self.run_layers(self.embed(batch), batch, cache, range(len(self.w.layers)))
        return self.head(x[batch.last_index])

    # forward in three parts, so a pipeline stage runs a range of layers (engine/stages.py)
    @torch.inference_mode()
    def embed(self, batch: StepBatch) -> torch.Tensor:
        """The hidden states [T, hidden] that enter layer 0."""
        return F.embedding(batch.input_ids, self.w.embed)

    @torch.inference_mode()
    def run_layers(self, x: torch.Tensor, batch: StepBatch, cache: KVCache,
                   layers: range) -> torch.Tensor:
        """Layers `layers` on hidden states x [T, hidden] (their K/V into the cache)."""
        cos, sin = self.rope.tables(batch.positions, self.dtype)
        for i in layers:
            layer = self.w.layers[i]
            h = rms_norm(x, layer.input_norm, self.cfg.rms_norm_eps)
            x = x + self._attention(h, layer, batch, cache, i, cos, sin)
            h = rms_norm(x, layer.post_norm, self.cfg.rms_norm_eps)
            gate, up = F.linear(h, layer.gate_up).chunk(2, dim=-1)
            x = x + F.linear(F.silu(gate) * up, layer.down)
        return x

    @torch.inference_mode()
    def head(self, x: torch.Tensor) -> torch.Tensor:
        """Logits [B, vocab] (float32) of the last layer's hidden states x [B, hidden]."""
        x = rms_norm(x, self.w.norm, self.cfg.rms_norm_eps)
        return F.linear(x, self.w.lm_head).float()

    def _attention(self, h: torch.Tensor, w: LayerWeights, batch: StepBatch, cache: KVCache,
                   i: int, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        c = self.cfg
        t, d = h.shape[0], c.head_dim
        q_size, kv_size = c.num_heads * d, c.num_kv_heads * d
        q, k, v = F.linear(h, w.qkv, w.qkv_bias).split([q_size, kv_size, kv_size], dim=-1)
        q = Rope.apply(q.view(t, c.num_heads, d), cos, sin)
        k = Rope.apply(k.view(t, c.num_kv_heads, d), cos, sin)
        k_pool, v_pool = cache.layer(i)
        k_pool[batch.slot_blocks, :, batch.slot_offsets] = k
        v_pool[batch.slot_blocks, :, batch.slot_offsets] = v.view(t, c.num_kv_heads, d)
        out = attend(q, k_pool, v_pool, batch).reshape(t, q_size)
        return F.linear(out, w.o, w.o_bias)
