"""Architecture: what one decoder family differs in, declared in its own module.

Every family here shares the Llama layer (RMSNorm, GQA attention with RoPE, SiLU-gated MLP, see
`decoder.py`). A family says how its Hugging Face config and GGUF metadata read, which tensors
it has (biases, tied head) and how llama.cpp stored them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

RawConfig = dict[str, Any]


def _same(raw: RawConfig) -> RawConfig:
    return raw


@dataclass(frozen=True)
class Architecture:
    """One decoder family.

    name: our short name (also the `model_type` transformers writes and the GGUF
        `general.architecture`, unless `gguf_names` says otherwise).
    hf_classes: the `architectures` entries of a config.json that select it.
    qkv_bias: q/k/v projections carry biases.
    sliding_window: the config's `sliding_window` applies (else it is ignored).
    gguf_permutes_qk: llama.cpp's converter interleaved q/k rows for its RoPE; undo on load.
    adjust: a last look at the raw config (e.g. refuse a variant we do not run).
    """

    name: str
    hf_classes: tuple[str, ...]
    qkv_bias: bool = False
    sliding_window: bool = False
    gguf_permutes_qk: bool = False
    gguf_names: tuple[str, ...] = ()
    adjust: Callable[[RawConfig], RawConfig] = field(default=_same)

    @property
    def gguf(self) -> tuple[str, ...]:
        return self.gguf_names or (self.name,)
