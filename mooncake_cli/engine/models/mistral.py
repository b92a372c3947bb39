"""Mistral: the Llama layer with a sliding attention window."""

from mooncake_cli.engine.models.base import Architecture

ARCH = Architecture(name="mistral", hf_classes=("MistralForCausalLM",), sliding_window=True,
                    gguf_permutes_qk=True)
