"""ModelConfig: the parts of a Hugging Face `config.json` our forward pass uses, validated."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mooncake_cli.engine import models
from mooncake_cli.engine.errors import ModelError

ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(frozen=True)
class ModelConfig:
    """A Llama-family decoder: GQA attention, RoPE, RMSNorm, SiLU-gated MLP."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] = field(default_factory=dict)
    max_position: int = 4096
    sliding_window: int | None = None
    tie_word_embeddings: bool = False
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers",
                     "num_heads", "num_kv_heads", "head_dim", "max_position"):
            if getattr(self, name) < 1:
                raise ModelError(f"config.json: {name} must be >= 1, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ModelError(f"config.json: num_attention_heads ({self.num_heads}) must be a "
                             f"multiple of num_key_value_heads ({self.num_kv_heads})")
        if self.head_dim % 2:
            raise ModelError(f"config.json: head_dim must be even for RoPE, got {self.head_dim}")
        kind = self.rope_scaling.get("rope_type", "default")
        if kind not in ROPE_TYPES:
            raise ModelError(f"config.json: rope scaling type {kind!r} is not supported "
                             f"(supported: {', '.join(ROPE_TYPES)})")

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ModelConfig:
        """From a Hugging Face config (transformers 4 or 5); without `architectures` the family
        comes from `model_type`."""
        archs = raw.get("architectures") or []
        if not isinstance(archs, list):
            archs = []
        found = next((models.BY_HF_CLASS[a] for a in archs if a in models.BY_HF_CLASS), None)
        if found is None and not archs:
            found = models.BY_NAME.get(str(raw.get("model_type")))
        if found is None:
            what = archs or raw.get("model_type")
            raise ModelError(f"config.json: unsupported architecture {what}; supported: "
                             f"{models.supported()}")
        raw = found.adjust(raw)
        arch = found.hf_classes[0]
        act = raw.get("hidden_act", "silu")
        if act != "silu":
            raise ModelError(f"config.json: hidden_act {act!r} is not supported (only silu)")
        window = raw.get("sliding_window") if found.sliding_window else None
        try:
            heads = int(raw["num_attention_heads"])
            hidden = int(raw["hidden_size"])
            return cls(
                architecture=arch, vocab_size=int(raw["vocab_size"]), hidden_size=hidden,
                intermediate_size=int(raw["intermediate_size"]),
                num_layers=int(raw["num_hidden_layers"]), num_heads=heads,
                num_kv_heads=int(raw.get("num_key_value_heads") or heads),
                head_dim=int(raw.get("head_dim") or hidden // heads),
                rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
                rope_theta=_rope_theta(raw), rope_scaling=_rope_scaling(raw),
                max_position=int(raw.get("max_position_embeddings") or 4096),
                sliding_window=int(window) if window else None,
                tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
                eos_token_ids=_ids(raw.get("eos_token_id")),
                bos_token_id=raw.get("bos_token_id"))
        except KeyError as e:
            raise ModelError(f"config.json: missing {e.args[0]!r}") from None
        except (TypeError, ValueError) as e:
            raise ModelError(f"config.json: {e}") from None

    @classmethod
    def from_file(cls, path: Path) -> ModelConfig:
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError:
            raise ModelError(f"{path} not found: a model directory needs config.json, "
                             "*.safetensors and tokenizer.json") from None
        except json.JSONDecodeError as e:
            raise ModelError(f"{path}: not valid JSON ({e})") from None
        return cls.from_dict(raw)

    @property
    def family(self) -> models.Architecture:
        return models.BY_HF_CLASS[self.architecture]

    @property
    def kind(self) -> str:
        return self.family.name

    def num_parameters(self) -> int:
        h, d = self.hidden_size, self.head_dim
        q, kv = self.num_heads * d, self.num_kv_heads * d
        layer = h * (q + 2 * kv) + q * h + 3 * h * self.intermediate_size + 2 * h
        emb = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * layer + emb + h


def _ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    return tuple(int(v) for v in value) if isinstance(value, list) else (int(value),)


def _rope_theta(raw: dict[str, Any]) -> float:
    params = raw.get("rope_parameters") or {}
    return float(params.get("rope_theta") or raw.get("rope_theta") or 10000.0)


def _rope_scaling(raw: dict[str, Any]) -> dict[str, Any]:
    """transformers 5 writes `rope_parameters`; older configs `rope_scaling` (type or rope_type)."""
    scaling = dict(raw.get("rope_scaling") or raw.get("rope_parameters") or {})
    if "type" in scaling and "rope_type" not in scaling:
        scaling["rope_type"] = scaling.pop("type")
    scaling.pop("rope_theta", None)
    return scaling
