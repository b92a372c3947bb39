"""`load_model`: a named model, GGUF file, checkpoint directory or demo -> a ready Model."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from mooncake_cli.engine.errors import ModelError
from mooncake_cli.engine.kvcache import DTYPE_NAMES
from mooncake_cli.engine.model_config import ModelConfig
from mooncake_cli.engine.models.decoder import Transformer
from mooncake_cli.engine.source import ChatSpec, open_source
from mooncake_cli.engine.tokenizer import Tokenizer
from mooncake_cli.engine.weights import build
from mooncake_cli.kvkeys import KVNamespace

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
          "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}


@dataclass
class Model:
    """A loaded model: config, forward pass, tokenizer and the id its KV keys are named by."""

    model_id: str
    config: ModelConfig
    transformer: Transformer
    tokenizer: Tokenizer
    eos_token_ids: tuple[int, ...]
    description: str
    chat: ChatSpec = field(default_factory=ChatSpec)

    @property
    def device(self) -> torch.device:
        return self.transformer.device

    @property
    def dtype(self) -> torch.dtype:
        return self.transformer.dtype

    def namespace(self, block_size: int) -> KVNamespace:
        c = self.config
        return KVNamespace(self.model_id, DTYPE_NAMES[self.dtype], block_size, c.num_layers,
                           c.num_kv_heads, c.head_dim)


def resolve_device(device: str | torch.device) -> torch.device:
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise ModelError(f"device {device!r}: use cpu, cuda or cuda:N") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ModelError(f"device {device!r}: CUDA is not available in this torch build "
                         f"({torch.__version__}); use --device cpu")
    if dev.type not in ("cpu", "cuda"):
        raise ModelError(f"device {device!r}: only cpu and cuda are supported")
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        if dtype not in DTYPE_NAMES:
            raise ModelError(f"dtype {dtype}: use float32, bfloat16 or float16")
        return dtype
    try:
        return DTYPES[dtype.lower()]
    except KeyError:
        raise ModelError(f"dtype {dtype!r}: use one of {', '.join(DTYPES)}") from None


def load_model(name: str | Path, device: str | torch.device = "cpu",
               dtype: str | torch.dtype = "float32", model_id: str | None = None,
               progress: Callable[[str], None] | None = None) -> Model:
    """Load a named model (`smollm2-135m`, fetched on first use), a `.gguf` file, a Hugging Face
    checkpoint directory (Llama/Mistral/Qwen2), or a demo (`demo`, `demo-25m`)."""
    dev, dt = resolve_device(device), resolve_dtype(dtype)
    src = open_source(name, progress=progress)
    weights = build(src.tensors(), src.config, dt, dev)
    return Model(model_id or src.model_id, src.config,
                 Transformer(src.config, weights, dev, dt), src.tokenizer, src.eos_token_ids,
                 src.description, src.chat)
