"""Llama-family weights from `*.safetensors`, fused per layer for fewer, larger matmuls."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from mooncake_cli.engine.config import ModelConfig
from mooncake_cli.engine.errors import ModelError


@dataclass
class LayerWeights:
    """One decoder layer. qkv: [q+2kv, hidden]; gate_up: [2*inter, hidden]."""

    input_norm: torch.Tensor
    qkv: torch.Tensor
    qkv_bias: torch.Tensor | None
    o: torch.Tensor
    o_bias: torch.Tensor | None
    post_norm: torch.Tensor
    gate_up: torch.Tensor
    down: torch.Tensor


@dataclass
class Weights:
    embed: torch.Tensor
    layers: list[LayerWeights]
    norm: torch.Tensor
    lm_head: torch.Tensor


def read_safetensors(directory: Path) -> dict[str, torch.Tensor]:
    """Every tensor of every `*.safetensors` file in `directory` (on CPU, stored dtype)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise ModelError(f"{directory}: no *.safetensors weights (only safetensors checkpoints "
                         "are supported; convert .bin files with transformers' save_pretrained)")
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            tensors.update(load_file(str(f)))
        except (SafetensorError, OSError) as e:
            raise ModelError(f"{f}: cannot read safetensors ({e})") from None
    return tensors


def build(raw: dict[str, torch.Tensor], cfg: ModelConfig, dtype: torch.dtype,
          device: torch.device) -> Weights:
    """Map Hugging Face tensor names to Weights; ModelError names the first missing tensor."""
    def take(name: str) -> torch.Tensor:
        t = raw.get(name)
        if t is None:
            raise ModelError(f"checkpoint lacks tensor {name!r}")
        return t.to(device=device, dtype=dtype)

    def maybe(name: str) -> torch.Tensor | None:
        return take(name) if name in raw else None

    layers = []
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        biases = [maybe(a + f"{n}_proj.bias") for n in "qkv"]
        if any(b is not None for b in biases) and not all(b is not None for b in biases):
            raise ModelError(f"layer {i}: q/k/v biases must be all present or all absent")
        qkv_bias = torch.cat(biases) if biases[0] is not None else None  # type: ignore[arg-type]
        layers.append(LayerWeights(
            input_norm=take(p + "input_layernorm.weight"),
            qkv=torch.cat([take(a + f"{n}_proj.weight") for n in "qkv"]),
            qkv_bias=qkv_bias, o=take(a + "o_proj.weight"), o_bias=maybe(a + "o_proj.bias"),
            post_norm=take(p + "post_attention_layernorm.weight"),
            gate_up=torch.cat([take(p + "mlp.gate_proj.weight"), take(p + "mlp.up_proj.weight")]),
            down=take(p + "mlp.down_proj.weight")))
    embed = take("model.embed_tokens.weight")
    if "lm_head.weight" in raw:
        lm_head = take("lm_head.weight")
    elif cfg.tie_word_embeddings:
        lm_head = embed
    else:
        raise ModelError("checkpoint lacks 'lm_head.weight' and tie_word_embeddings is false")
    w = Weights(embed=embed, layers=layers, norm=take("model.norm.weight"), lm_head=lm_head)
    _check_shapes(w, cfg)
    return w


def _check_shapes(w: Weights, cfg: ModelConfig) -> None:
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    want = {"embed": (cfg.vocab_size, cfg.hidden_size),
            "lm_head": (cfg.vocab_size, cfg.hidden_size),
            "qkv": (q + 2 * kv, cfg.hidden_size), "o": (cfg.hidden_size, q),
            "gate_up": (2 * cfg.intermediate_size, cfg.hidden_size),
            "down": (cfg.hidden_size, cfg.intermediate_size)}
    got = {"embed": w.embed.shape, "lm_head": w.lm_head.shape, "qkv": w.layers[0].qkv.shape,
           "o": w.layers[0].o.shape, "gate_up": w.layers[0].gate_up.shape,
           "down": w.layers[0].down.shape}
    for name, shape in want.items():
        if tuple(got[name]) != shape:
            raise ModelError(f"weights do not match config.json: {name} is {tuple(got[name])}, "
                             f"expected {shape}")
