"""Rotary position embeddings as the Llama family applies them (rotate-half form)."""

from __future__ import annotations

import math

import torch

from mooncake_cli.engine.model_config import ModelConfig


def inv_frequencies(cfg: ModelConfig) -> torch.Tensor:
    """Per-pair inverse frequencies (float32), with linear or llama3 scaling from the config."""
    d = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    kind = cfg.rope_scaling.get("rope_type", "default")
    if kind == "linear":
        return inv / float(cfg.rope_scaling["factor"])
    if kind == "llama3":
        return _llama3(inv, cfg.rope_scaling)
    return inv


def _llama3(inv: torch.Tensor, s: dict[str, float]) -> torch.Tensor:
    factor = float(s["factor"])
    low, high = float(s["low_freq_factor"]), float(s["high_freq_factor"])
    old = float(s["original_max_position_embeddings"])
    low_wavelen, high_wavelen = old / low, old / high
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


class Rope:
    """cos/sin tables for positions; `apply` rotates q or k of shape [tokens, heads, head_dim]."""

    def __init__(self, cfg: ModelConfig, device: torch.device) -> None:
        self.inv = inv_frequencies(cfg).to(device)

    def tables(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor,
                                                                           torch.Tensor]:
        freqs = positions.float()[:, None] * self.inv[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype)[:, None, :], emb.sin().to(dtype)[:, None, :]

    @staticmethod
    def apply(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rotated * sin
