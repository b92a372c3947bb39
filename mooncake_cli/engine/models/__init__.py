"""The decoder families we run, one module each; adding one is a module and a line here."""

from __future__ import annotations

from mooncake_cli.engine.models import llama, mistral, qwen2
from mooncake_cli.engine.models.base import Architecture

ARCHITECTURES: tuple[Architecture, ...] = (llama.ARCH, mistral.ARCH, qwen2.ARCH)

BY_HF_CLASS = {c: a for a in ARCHITECTURES for c in a.hf_classes}
BY_NAME = {a.name: a for a in ARCHITECTURES}
BY_GGUF = {g: a for a in ARCHITECTURES for g in a.gguf}


def supported() -> str:
    return ", ".join(c for a in ARCHITECTURES for c in a.hf_classes)


__all__ = ["ARCHITECTURES", "BY_GGUF", "BY_HF_CLASS", "BY_NAME", "Architecture", "supported"]
