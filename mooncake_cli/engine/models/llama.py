"""Llama 2/3 (and SmolLM, TinyLlama, ...): no biases, RoPE default/linear/llama3 scaling."""

from mooncake_cli.engine.models.base import Architecture

ARCH = Architecture(name="llama", hf_classes=("LlamaForCausalLM",), gguf_permutes_qk=True)
