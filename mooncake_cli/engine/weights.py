"""Llama-family weights (Hugging Face names), fused per layer for fewer, larger matmuls."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from mooncake_cli.engine.errors import ModelError
from mooncake_cli.engine.model_config import ModelConfig


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


NamedTensors = Iterable[tuple[str, torch.Tensor]]



def read_safetensors(directory: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of every `*.safetensors` file in `directory`, one at a time (on CPU, stored
    dtype): shards are opened one after another, so peak memory stays near the model's size."""
    from safetensors import SafetensorError, safe_open

    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise ModelError(f"{directory}: no *.safetensors weights (only safetensors checkpoints "
                         "are supported; convert .bin files with transformers' save_pretrained)")
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as shard:
                for name in shard.keys():  # noqa: SIM118 (safe_open is not a mapping)
                    yield name, shard.get_tensor(name)
        except (SafetensorError, OSError) as e:
            raise ModelError(f"{f}: cannot read safetensors ({e})") from None


def build(tensors: NamedTensors | dict[str, torch.Tensor], cfg: ModelConfig, dtype: torch.dtype,
          device: torch.device) -> Weights:
    """Hugging Face-named tensors -> Weights, converted to `dtype` on `device` as each arrives
    and fused layer by layer; ModelError names the first missing tensor."""
    items = tensors.items() if isinstance(tensors, dict) else tensors
    raw: dict[str, torch.Tensor] = {}
    layers: dict[int, LayerWeights] = {}
    for name, t in items:
        raw[name] = t.to(device=device, dtype=dtype)
        i = _layer_of(name)
        if i is not None and i not in layers and _layer_complete(raw, i):
            layers[i] = _layer(raw, i)
    for i in range(cfg.num_layers):
        if i not in layers:
            layers[i] = _layer(raw, i)
    embed = raw.pop("model.embed_tokens.weight", None)
    lm_head = raw.pop("lm_head.weight", None)
    if embed is None and lm_head is not None and cfg.tie_word_embeddings:
        embed = lm_head  # a tied model saved under the head's name only
    if embed is None:
        raise ModelError("checkpoint lacks tensor 'model.embed_tokens.weight'")
    if lm_head is None:
        if not cfg.tie_word_embeddings:
            raise ModelError("checkpoint lacks 'lm_head.weight' and tie_word_embeddings is false")
        lm_head = embed
    norm = raw.pop("model.norm.weight", None)
    if norm is None:
        raise ModelError("checkpoint lacks tensor 'model.norm.weight'")
    w = Weights(embed=embed, layers=[layers[i] for i in range(cfg.num_layers)], norm=norm,
                lm_head=lm_head)
    _check_shapes(w, cfg)
    return w


def _layer_of(name: str) -> int | None:
    if not name.startswith("model.layers."):
        return None
    part = name.split(".", 3)[2]
    return int(part) if part.isdigit() else None


_NEEDED = ("input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.o_proj.weight",
           "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
           "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight")


def _layer_complete(raw: dict[str, torch.Tensor], i: int) -> bool:
    p = f"model.layers.{i}."
    if not all(p + n in raw for n in _NEEDED):
        return False
    biases = [p + f"self_attn.{n}_proj.bias" in raw for n in "qkv"]
    return all(biases) or not any(biases)


def _layer(raw: dict[str, torch.Tensor], i: int) -> LayerWeights:
    """Fuse layer i's tensors (removing them from `raw`)."""
    p = f"model.layers.{i}."

    def take(name: str) -> torch.Tensor:
        t = raw.pop(p + name, None)
        if t is None:
            raise ModelError(f"checkpoint lacks tensor {p + name!r}")
        return t

    def maybe(name: str) -> torch.Tensor | None:
        return raw.pop(p + name, None)

    biases = [maybe(f"self_attn.{n}_proj.bias") for n in "qkv"]
    if any(b is not None for b in biases) and not all(b is not None for b in biases):
        raise ModelError(f"layer {i}: q/k/v biases must be all present or all absent")
    qkv_bias = torch.cat(biases) if biases[0] is not None else None  # type: ignore[arg-type]
    return LayerWeights(
        input_norm=take("input_layernorm.weight"),
        qkv=torch.cat([take(f"self_attn.{n}_proj.weight") for n in "qkv"]),
        qkv_bias=qkv_bias, o=take("self_attn.o_proj.weight"), o_bias=maybe("self_attn.o_proj.bias"),
        post_norm=take("post_attention_layernorm.weight"),
        gate_up=torch.cat([take("mlp.gate_proj.weight"), take("mlp.up_proj.weight")]),
        down=take("mlp.down_proj.weight"))


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
