"""`load_model`: a checkpoint directory (or a built-in demo name) -> a ready Model."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from mooncake_cli.engine import demo
from mooncake_cli.engine.config import ModelConfig
from mooncake_cli.engine.errors import ModelError
from mooncake_cli.engine.kvcache import DTYPE_NAMES
from mooncake_cli.engine.model import Transformer
from mooncake_cli.engine.tokenizer import ByteTokenizer, HFTokenizer, Tokenizer
from mooncake_cli.engine.weights import build, read_safetensors
from mooncake_cli.kvkeys import KVNamespace, model_id_from

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
               dtype: str | torch.dtype = "float32", model_id: str | None = None) -> Model:
    """Load a Llama/Mistral/Qwen2 checkpoint directory, or a demo (`demo`, `demo-25m`)."""
    dev, dt = resolve_device(device), resolve_dtype(dtype)
    key = str(name)
    if key in demo.DEMOS:
        cfg = demo.DEMOS[key]
        weights = build(demo.demo_tensors(cfg), cfg, dt, dev)
        return Model(model_id or key, cfg, Transformer(cfg, weights, dev, dt), ByteTokenizer(),
                     cfg.eos_token_ids, f"{key}: " + demo.LABEL.format(seed=demo.SEED))
    path = Path(name)
    if not path.is_dir():
        raise ModelError(f"model {key!r}: no such directory (or use a built-in demo: "
                         f"{', '.join(demo.DEMOS)})")
    cfg = ModelConfig.from_file(path / "config.json")
    tokenizer = HFTokenizer(path / "tokenizer.json")
    weights = build(read_safetensors(path), cfg, dt, dev)
    eos = cfg.eos_token_ids + tuple(i for i in _generation_eos(path)
                                    if i not in cfg.eos_token_ids)
    return Model(model_id or model_id_from(str(path.resolve())), cfg,
                 Transformer(cfg, weights, dev, dt), tokenizer, eos,
                 f"{cfg.architecture} from {path} ({cfg.num_parameters() / 1e6:.1f}M parameters)")


def _generation_eos(path: Path) -> tuple[int, ...]:
    f = path / "generation_config.json"
    if not f.is_file():
        return ()
    try:
        value = json.loads(f.read_text()).get("eos_token_id")
    except (json.JSONDecodeError, AttributeError):
        return ()
    if value is None:
        return ()
    return tuple(value) if isinstance(value, list) else (int(value),)
