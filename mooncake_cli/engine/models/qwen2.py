"""Qwen2 / Qwen2.5: biases on q/k/v; llama.cpp stores q/k unpermuted."""

from mooncake_cli.engine.errors import ModelError
from mooncake_cli.engine.models.base import Architecture, RawConfig


def _full_attention_only(raw: RawConfig) -> RawConfig:
    if raw.get("use_sliding_window"):
        raise ModelError("config: Qwen2 use_sliding_window=true is not supported")
    return {**raw, "sliding_window": None}


ARCH = Architecture(name="qwen2", hf_classes=("Qwen2ForCausalLM",), qkv_bias=True,
                    adjust=_full_attention_only)
