"""Where a model comes from: a demo name, a named model, a `.gguf` file or a Hugging Face
directory -> one ModelSource (config, tokenizer, chat template, EOS ids, streamed tensors).

    src = open_source("smollm2-135m")      # fetched into the cache on first use
    src.config, src.tokenizer, src.chat    # what the conductor needs: no weights are read
    for name, t in src.tensors(): ...      # what a worker loads, one tensor at a time
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mooncake_cli.engine import catalog, demo
from mooncake_cli.engine.errors import ModelError
from mooncake_cli.engine.model_config import ModelConfig
from mooncake_cli.engine.tokenizer import ByteTokenizer, HFTokenizer, Tokenizer
from mooncake_cli.kvkeys import model_id_from

if TYPE_CHECKING:  # torch loads only where tensors are made
    import torch


@dataclass(frozen=True)
class ChatSpec:
    """A chat template (Jinja source, or None) and the special tokens it is rendered with."""

    template: str | None = None
    bos_token: str = ""
    eos_token: str = ""


@dataclass
class ModelSource:
    model_id: str
    config: ModelConfig
    tokenizer: Tokenizer
    eos_token_ids: tuple[int, ...]
    description: str
    tensors: Callable[[], Iterable[tuple[str, torch.Tensor]]]
    chat: ChatSpec = field(default_factory=ChatSpec)
    path: Path | None = None


def known_names() -> str:
    return ", ".join([*catalog.CATALOG, *demo.DEMOS])


def open_source(name: str | Path, fetch: bool = True,
                progress: Callable[[str], None] | None = None) -> ModelSource:
    key = str(name)
    if key in demo.DEMOS:
        cfg = demo.DEMOS[key]
        return ModelSource(key, cfg, ByteTokenizer(), cfg.eos_token_ids,
                           f"{key}: " + demo.LABEL.format(seed=demo.SEED),
                           lambda: demo.demo_tensors(cfg).items())
    if key in catalog.CATALOG:
        src = gguf_source(catalog.resolve(key, fetch=fetch, progress=progress))
        src.model_id = key
        src.description = f"{key}: {src.description}"
        return src
    path = Path(name).expanduser()
    if path.is_file():
        return gguf_source(path)
    if path.is_dir():
        return hf_source(path)
    raise ModelError(f"model {key!r}: no such file or directory (a .gguf file, a Hugging Face "
                     f"checkpoint directory, or a named model: {known_names()})")


def gguf_source(path: Path) -> ModelSource:
    from mooncake_cli.engine.gguf_file import GGUFCheckpoint
    from mooncake_cli.engine.gguf_tokenizer import build_tokenizer, special_token

    ckpt = GGUFCheckpoint(path)
    cfg = ModelConfig.from_dict(ckpt.config_dict())
    tok = HFTokenizer.from_object(build_tokenizer(ckpt.meta, str(path)))
    chat = ChatSpec(ckpt.meta.get("tokenizer.chat_template") or None,
                    special_token(ckpt.meta, "bos"), special_token(ckpt.meta, "eos"))
    name = ckpt.meta.get("general.name") or path.stem
    return ModelSource(model_id_from(str(path.resolve())), cfg, tok, ckpt.eos_ids(),
                       f"{name} ({cfg.architecture}, GGUF, {cfg.num_parameters() / 1e6:.1f}M "
                       f"parameters) from {path}", ckpt.tensors, chat, path)


def hf_source(path: Path) -> ModelSource:
    from mooncake_cli.engine.weights import read_safetensors

    cfg = ModelConfig.from_file(path / "config.json")
    tok = HFTokenizer(path / "tokenizer.json")
    eos = cfg.eos_token_ids + tuple(i for i in _generation_eos(path)
                                    if i not in cfg.eos_token_ids)
    return ModelSource(model_id_from(str(path.resolve())), cfg, tok, eos,
                       f"{cfg.architecture} from {path} ({cfg.num_parameters() / 1e6:.1f}M "
                       "parameters)", lambda: read_safetensors(path), hf_chat(path), path)


def hf_chat(path: Path) -> ChatSpec:
    """The chat template as transformers 4 and 5 save it: chat_template.jinja, then
    chat_template.json, then tokenizer_config.json's "chat_template"."""
    cfg = _json(path / "tokenizer_config.json")
    source: Any = None
    if (path / "chat_template.jinja").is_file():
        source = _read(path / "chat_template.jinja")
    elif (path / "chat_template.json").is_file():
        source = _json(path / "chat_template.json").get("chat_template")
    if source is None:
        source = cfg.get("chat_template")
    if isinstance(source, list):  # [{"name": "default", "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
        source = named.get("default") or next(iter(named.values()), None)
    tokens = {**_json(path / "special_tokens_map.json"), **cfg}
    return ChatSpec(source if isinstance(source, str) else None,
                    _token_text(tokens.get("bos_token")), _token_text(tokens.get("eos_token")))


def _read(f: Path) -> str:
    try:
        return f.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ModelError(f"{f}: cannot read ({e})") from None


def _json(f: Path) -> dict[str, Any]:
    if not f.is_file():
        return {}
    try:
        value = json.loads(_read(f))
    except ValueError as e:
        raise ModelError(f"{f}: not valid JSON ({e})") from None
    return value if isinstance(value, dict) else {}


def _token_text(value: Any) -> str:
    if isinstance(value, dict):  # {"content": "<s>", ...} in older tokenizer configs
        value = value.get("content", "")
    return value if isinstance(value, str) else ""


def _generation_eos(path: Path) -> tuple[int, ...]:
    value = _json(path / "generation_config.json").get("eos_token_id")
    if value is None:
        return ()
    try:
        return tuple(int(v) for v in value) if isinstance(value, list) else (int(value),)
    except (TypeError, ValueError):
        return ()
